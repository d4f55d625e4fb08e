"""Rollout throughput on CPU: transformers ``generate`` as TRL calls it in training, tokens per second.

For each preset (tiny, smol): the warm-started model, one training step's prompts (``prompts_per_step`` prompts of
the shuffled training set, each repeated ``num_generations`` times, left-padded), the sampling settings of the run's
trainer (``harness.train.adapter.sampling_settings``: the preset's temperature, T = 1, ``max_completion_length`` new
tokens, KV cache), the preset's ``train.threads``. Repeat r takes the next step's prompts; repeat 0 is warm-up. The
presets alternate (tiny, smol, tiny, ...), so load on the shared machine hits both alike.

Reported per preset: generated tokens per second (real tokens, up to and including EOS, over wall time), padded
sequence-steps per second (rows x decoding steps: what the batch computes while finished rows idle), prompt
tokens, completion lengths, CPU seconds.

Usage:  python bench/rollout_throughput.py [--presets tiny,smol] [--repeats 6] [--threads N] [--workdir DIR]
        [--results DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import (
    add_path_args,
    describe,
    environment,
    machine_state,
    publish,
    sample_rollouts,
    sweep,
    table,
)


def setup(preset_name: str, args):
    """The trainer of a uniform run of ``preset_name`` (built by the harness), its model in eval mode, its prompts
    and its sampling settings."""
    import torch  # noqa: F401

    from harness.config.schema import load_method
    from harness.train.adapter import sampling_settings
    from harness.train.run import build_trainer

    resolved, paths = sweep(preset_name, args.workdir, args.warmstart_steps)
    preset = resolved.preset
    trainer = build_trainer(resolved, load_method("uniform"), 0, paths, args.workdir / "rollout" / preset_name)
    model = trainer.model
    model.eval()
    gen_config, eos = sampling_settings(trainer)
    threads = args.threads or preset.train.threads
    return {"preset": preset, "model": model, "tokenizer": trainer.processing_class,
            "prompts": trainer.train_dataset["prompt"], "gen_config": gen_config, "eos": eos, "threads": threads}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,smol")
    parser.add_argument("--repeats", type=int, default=6, help="including the warm-up repeat 0")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the preset's train.threads)")
    parser.add_argument("--warmstart-steps", type=int, default=300)
    parser.add_argument("--name", default="rollout_throughput")
    add_path_args(parser)
    args = parser.parse_args(argv)
    import torch

    presets = [p for p in args.presets.split(",") if p]
    setups = {p: setup(p, args) for p in presets}
    env = environment(args.cpu_free_flag)
    raw: dict[str, list[dict]] = {p: [] for p in presets}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for p in (presets if repeat % 2 == 0 else presets[::-1]):
            s = setups[p]
            torch.set_num_threads(s["threads"])
            train = s["preset"].train
            n = train.prompts_per_step
            prompts = [s["prompts"][(repeat * n + i) % len(s["prompts"])] for i in range(n)]
            out = sample_rollouts(s["model"], s["tokenizer"], prompts, train.num_generations, s["gen_config"],
                                  s["eos"], seed=100 + repeat)
            lengths = out["completion_mask"].sum(dim=1).tolist()
            rec = {"repeat": repeat, "wall_s": out["wall_s"], "cpu_s": out["cpu_s"],
                   "generated_tokens": out["generated_tokens"], "prompt_tokens": out["prompt_tokens"],
                   "rows": out["rows"], "decode_steps": out["padded_steps"], "completion_lengths": lengths,
                   "prompt_width": int(out["prompt_ids"].shape[1])}
            rec["tokens_per_s"] = rec["generated_tokens"] / rec["wall_s"]
            rec["sequence_steps_per_s"] = rec["rows"] * rec["decode_steps"] / rec["wall_s"]
            raw[p].append(rec)
            print(f"[bench] {p} repeat {repeat}: {rec['generated_tokens']} tokens in {rec['wall_s']:.2f} s "
                  f"= {rec['tokens_per_s']:.0f} tok/s", flush=True)
    results = {}
    for p in presets:
        measured = [r for r in raw[p] if r["repeat"] > 0]
        s = setups[p]
        model = s["model"]
        results[p] = {
            "tokens_per_s": describe([r["tokens_per_s"] for r in measured]),
            "sequence_steps_per_s": describe([r["sequence_steps_per_s"] for r in measured]),
            "wall_s": describe([r["wall_s"] for r in measured]),
            "cpu_s": describe([r["cpu_s"] for r in measured]),
            "mean_completion_length": statistics.mean(statistics.mean(r["completion_lengths"]) for r in measured),
            "mean_prompt_tokens": statistics.mean(r["prompt_tokens"] / r["rows"] for r in measured),
            "rows": s["preset"].train.prompts_per_step * s["preset"].train.num_generations,
            "max_new_tokens": s["preset"].train.max_completion_length, "threads": s["threads"],
            "parameters": sum(t.numel() for t in model.parameters()), "vocab": model.config.vocab_size,
        }
    record = {"benchmark": "rollout_throughput", "settings": {"presets": presets, "repeats": args.repeats,
                                                              "warmup_repeats": 1, "temperature": 1.0,
                                                              "warmstart_steps_tiny": args.warmstart_steps},
              "environment": env, "elapsed_s": time.perf_counter() - started, "results": results, "raw": raw}
    return publish(args.results, args.name, record, summary_markdown(record))


def summary_markdown(record: dict) -> str:
    rows = []
    for p, r in record["results"].items():
        t = r["tokens_per_s"]
        rows.append([p, f"{r['parameters'] / 1e6:.2f}M", r["rows"], r["max_new_tokens"], r["threads"],
                     f"{r['mean_prompt_tokens']:.0f}", f"{r['mean_completion_length']:.1f}",
                     f"{r['wall_s']['median']:.2f}", f"{t['median']:.0f} [{t['q25']:.0f}, {t['q75']:.0f}]",
                     f"{r['sequence_steps_per_s']['median']:.0f}"])
    return "\n".join([
        "## Rollout throughput (HF generate on CPU)", "",
        f"{record['environment']['date']}; one training step's rollouts per repeat, sampling at T = 1, "
        f"{record['settings']['repeats'] - 1} measured repeats after 1 warm-up; machine "
        f"{machine_state(record['environment'])}.", "",
        table(["preset", "params", "rollouts", "max new", "threads", "prompt tokens", "mean completion",
               "wall s / step", "tokens/s (median [IQR])", "row-steps/s"], rows)])


if __name__ == "__main__":
    main(sys.argv[1:])
