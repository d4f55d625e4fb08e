"""Rollout throughput on CPU: transformers ``generate`` as TRL calls it in training, tokens per second.

For each preset (tiny, smol): the warm-started model, one training step's prompts (``prompts_per_step`` prompts of the
shuffled training set, each repeated ``num_generations`` times, left-padded), the sampling settings of the run's trainer
(``harness.train.trl.bench_probes.sampling_settings``: the preset's temperature, T = 1, ``max_completion_length`` new
tokens, KV cache), the preset's ``train.threads``. Repeat r takes the next step's prompts; repeat 0 is warm-up. The
presets alternate (tiny, smol, tiny, ...), so load on the shared machine hits both alike.

Reported per preset: generated tokens per second (real tokens, up to and including EOS, over wall time), padded
sequence-steps per second (rows x decoding steps: what the batch computes while finished rows idle), prompt
tokens, completion lengths, CPU seconds.

With ``--compare-decode`` (result ``rollout_decode``): each repeat samples its step's rollouts twice, with plain
``generate`` and with harness/model/decode.py (as training runs it: ``train.fast_decode``, TRL's fused forward
lifted while generating), in alternating order, from the same seed; the rollouts must be identical. Reported per
preset: the per-pair ratios decode / generate of wall and process CPU time. Then ``--eval-repeats`` pairs of one
evaluation as an eval job runs it (``harness.evaluation.driver.evaluate_benchmark`` on the warm start: the preset's
eval settings, its synthetic eval split of ``data.synthetic.n_eval`` problems), ``eval.fast_decode`` false and true
in alternating order; the samples must be identical. Reported: CPU ratios of lm-eval's generate calls
(``HFLM._model_generate``) and of the whole evaluation.

Usage:  python -m bench.rollout_throughput [--presets tiny,smol] [--repeats 6] [--threads N] [--compare-decode]
        [--eval-repeats 8] [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time

from bench.fixtures import sample_rollouts, sweep
from bench.machine import environment, machine_state
from bench.publish import add_path_args, publish, table
from bench.stats import describe, fmt_ratio, paired_ratio


def setup(preset_name: str, args):
    """The trainer of a uniform run of ``preset_name`` (built by the harness), its model in eval mode, its prompts
    and its sampling settings."""
    import torch  # noqa: F401

    from harness.config.loading import load_method
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import sampling_settings

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
    parser.add_argument("--compare-decode", action="store_true",
                        help="plain generate against harness/model/decode.py, interleaved (result rollout_decode)")
    parser.add_argument("--eval-repeats", type=int, default=8,
                        help="--compare-decode: evaluation pairs per preset, including 1 warm-up pair")
    parser.add_argument("--name", default=None, help="result name (default rollout_throughput / rollout_decode)")
    add_path_args(parser)
    args = parser.parse_args(argv)
    import torch

    presets = [p for p in args.presets.split(",") if p]
    setups = {p: setup(p, args) for p in presets}
    if args.compare_decode:
        return compare_decode(presets, setups, args)
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
    return publish(args.results, args.name or "rollout_throughput", record, summary_markdown(record))


def compare_decode(presets: list[str], setups: dict, args) -> dict:
    """Per repeat and preset: the step's rollouts with plain generate and with harness.model.decode.generate (as
    the training trainer runs it), in alternating order, from the same seed."""
    import torch

    from harness.model import decode
    from harness.train.trl.patches import class_forward_while_generating

    env = environment(args.cpu_free_flag)
    raw: dict[str, list[dict]] = {p: [] for p in presets}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for p in presets:
            s = setups[p]
            torch.set_num_threads(s["threads"])
            train, model = s["preset"].train, s["model"]
            n = train.prompts_per_step
            prompts = [s["prompts"][(repeat * n + i) % len(s["prompts"])] for i in range(n)]
            runs = {}
            for variant in (("generate", "decode") if repeat % 2 == 0 else ("decode", "generate")):
                with class_forward_while_generating(model):
                    generate = functools.partial(decode.generate, model) if variant == "decode" else model.generate
                    runs[variant] = sample_rollouts(model, s["tokenizer"], prompts, train.num_generations,
                                                    s["gen_config"], s["eos"], seed=100 + repeat, generate=generate)
            rec = {"repeat": repeat, **{f"{v}_{k}": runs[v][k] for v in runs for k in ("wall_s", "cpu_s")},
                   "identical": bool(torch.equal(runs["generate"]["completion_ids"], runs["decode"]["completion_ids"])),
                   "decode_steps": runs["generate"]["padded_steps"], "rows": runs["generate"]["rows"],
                   "generated_tokens": runs["generate"]["generated_tokens"]}
            raw[p].append(rec)
            print(f"[bench] {p} repeat {repeat}: generate {rec['generate_cpu_s']:.3f} CPU s, decode "
                  f"{rec['decode_cpu_s']:.3f} CPU s, identical {rec['identical']}", flush=True)
    evals = {p: compare_eval(p, args) for p in presets}
    results = {}
    for p in presets:
        measured = [r for r in raw[p] if r["repeat"] > 0]
        results[p] = {
            "eval": evals[p],
            "cpu_ratio": paired_ratio([r["decode_cpu_s"] for r in measured], [r["generate_cpu_s"] for r in measured]),
            "wall_ratio": paired_ratio([r["decode_wall_s"] for r in measured],
                                       [r["generate_wall_s"] for r in measured]),
            "generate_cpu_s": describe([r["generate_cpu_s"] for r in measured]),
            "decode_cpu_s": describe([r["decode_cpu_s"] for r in measured]),
            "identical": all(r["identical"] for r in raw[p]), "rows": measured[0]["rows"] if measured else None,
            "decode_steps": describe([r["decode_steps"] for r in measured]), "threads": setups[p]["threads"],
            "parameters": sum(t.numel() for t in setups[p]["model"].parameters()),
        }
    record = {"benchmark": "rollout_decode", "settings": {"presets": presets, "repeats": args.repeats,
                                                          "warmup_repeats": 1,
                                                          "warmstart_steps_tiny": args.warmstart_steps},
              "environment": env, "elapsed_s": time.perf_counter() - started, "results": results, "raw": raw,
              "load_average_end": os.getloadavg()}
    return publish(args.results, args.name or "rollout_decode", record, decode_markdown(record))


def compare_eval(preset_name: str, args) -> dict:
    """Pairs of one evaluation of the warm start with eval.fast_decode false / true (module docstring)."""
    import hashlib
    import json

    from lm_eval.models.huggingface import HFLM

    from harness.config.loading import resolve
    from harness.data.synthetic import generate_split
    from harness.evaluation.driver import evaluate_benchmark

    resolved, paths = sweep(preset_name, args.workdir, args.warmstart_steps)
    preset = resolved.preset
    synthetic = resolve({"name": "x", "preset": preset_name}).preset.data.synthetic  # the preset's own eval size
    folder = args.workdir / "rollout_decode_eval" / preset_name
    folder.mkdir(parents=True, exist_ok=True)
    data_file = folder / "eval.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in generate_split(synthetic, "eval")))
    (folder / "SHA256SUMS").write_text(f"{hashlib.sha256(data_file.read_bytes()).hexdigest()}  eval.jsonl\n")
    bench_name, bench = next(iter(preset.eval.benchmarks.items()))
    generate_cpu = [0.0]
    model_generate = HFLM._model_generate

    def timed(self, *a, **k):  # lm-eval's generate calls (FastDecodeHFLM's go through here too)
        started = time.process_time()
        try:
            return model_generate(self, *a, **k)
        finally:
            generate_cpu[0] += time.process_time() - started

    HFLM._model_generate = timed
    runs: list[dict] = []
    try:
        for repeat in range(args.eval_repeats):
            pair = {}
            for fast in ((False, True) if repeat % 2 == 0 else (True, False)):
                cfg = dataclasses.replace(preset.eval, fast_decode=fast)
                out = folder / f"fast_decode_{fast}"
                generate_cpu[0], started = 0.0, time.process_time()
                evaluate_benchmark(paths.warmstart_dir, bench_name, bench, data_file, cfg, preset.prompt_template, out)
                pair[fast] = {"cpu_s": time.process_time() - started, "generate_cpu_s": generate_cpu[0],
                              "samples": (out / "samples.jsonl").read_text()}
            runs.append({"repeat": repeat, "identical": pair[True]["samples"] == pair[False]["samples"],
                         **{f"{'decode' if f else 'generate'}_{k}": pair[f][k] for f in pair
                            for k in ("cpu_s", "generate_cpu_s")}})
            print(f"[bench] {preset_name} eval pair {repeat}: lm-eval generate CPU s "
                  f"{runs[-1]['generate_generate_cpu_s']:.2f} -> {runs[-1]['decode_generate_cpu_s']:.2f}, "
                  f"identical {runs[-1]['identical']}", flush=True)
    finally:
        HFLM._model_generate = model_generate
    measured = runs[1:]
    return {"problems": synthetic.n_eval, "k": preset.eval.k, "greedy": preset.eval.greedy,
            "batch_size": preset.eval.batch_size, "identical": all(r["identical"] for r in runs),
            "generate_cpu_ratio": paired_ratio([r["decode_generate_cpu_s"] for r in measured],
                                               [r["generate_generate_cpu_s"] for r in measured]),
            "eval_cpu_ratio": paired_ratio([r["decode_cpu_s"] for r in measured],
                                           [r["generate_cpu_s"] for r in measured]),
            "generate_cpu_s": describe([r["generate_generate_cpu_s"] for r in measured]),
            "eval_cpu_s": describe([r["generate_cpu_s"] for r in measured]), "raw": runs}


def decode_markdown(record: dict) -> str:
    rows = [[p, f"{r['parameters'] / 1e6:.2f}M", r["rows"], r["threads"], f"{r['decode_steps']['median']:.0f}",
             f"{r['generate_cpu_s']['median']:.3f}", f"{r['decode_cpu_s']['median']:.3f}", fmt_ratio(r["cpu_ratio"]),
             fmt_ratio(r["wall_ratio"]), "yes" if r["identical"] else "NO"]
            for p, r in record["results"].items()]
    return "\n".join([
        "## Rollout decoding: harness/model/decode.py against transformers generate (CPU)", "",
        f"{record['environment']['date']}; one training step's rollouts per repeat (sampling settings of the run's "
        f"trainer), both ways from the same seed in alternating order, {record['settings']['repeats'] - 1} measured "
        f"repeats after 1 warm-up; machine {machine_state(record['environment'])}; load average at the end "
        f"{record['load_average_end'][0]:.1f}. Ratios below 1: decode.py is faster.", "",
        table(["preset", "params", "rollouts", "threads", "decode steps", "generate CPU s", "decode CPU s",
               "CPU decode / generate", "wall decode / generate", "same rollouts"], rows), "",
        "One evaluation (the preset's eval settings on its synthetic eval split, the warm start), eval.fast_decode "
        "true / false:", "",
        table(["preset", "problems x (k + greedy)", "batch", "lm-eval generate CPU s", "CPU generate calls",
               "CPU whole evaluation", "same samples"],
              [[p, f"{e['problems']} x ({e['k']} + {int(e['greedy'])})", e["batch_size"],
                f"{e['generate_cpu_s']['median']:.2f}", fmt_ratio(e["generate_cpu_ratio"]),
                fmt_ratio(e["eval_cpu_ratio"]), "yes" if e["identical"] else "NO"]
               for p, e in ((p, r["eval"]) for p, r in record["results"].items())])])


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
