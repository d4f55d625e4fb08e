"""bfloat16 autocast on CPU against float32, tiny preset: what a lower-precision default sweep would save.

The default sweep's training jobs are compute-bound in float32 (issue #17: its FLOPs budget runs at ~54 GFLOP/s on
one core; transformers' generate loop and the harness add little), so on a CPU that has bfloat16 instructions
(AVX512-BF16, AMX) the one lever left that keeps the protocol is precision. This measures it on the tiny preset's
own work, interleaved with float32 in one process, the order reversed every repeat:
- rollouts: one training step's rollouts (``prompts_per_step`` x ``num_generations``), TRL's sampling settings,
  ``torch.autocast("cpu", bfloat16)`` around ``generate``;
- training: forward + backward of those rollouts (completion log-probs, token mean), autocast around the forward.
It also records the largest |log p_bf16 - log p_fp32| over the completion tokens: the numbers a bf16 sweep would
change (it is a different run, not a faster copy of this one).

Usage:  python -m bench.cpu_bf16 [--repeats 8] [--threads 1] [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from bench.fixtures import sample_rollouts, tiny_sweep
from bench.machine import Timer, environment, machine_state
from bench.publish import add_path_args, publish, table
from bench.stats import fmt_ratio, paired_ratio

PRECISIONS = ("fp32", "bf16")


def precision(name: str):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if name == "bf16" else contextlib.nullcontext()


def completion_logp(model, rollouts: dict):
    """Per-token log-probs of the completion tokens (float32 log-softmax, as the trainer's token statistics)."""
    import torch

    ids = torch.cat([rollouts["prompt_ids"], rollouts["completion_ids"]], dim=1)
    mask = torch.cat([rollouts["prompt_mask"], rollouts["completion_mask"]], dim=1)
    width = rollouts["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, rollouts["completion_ids"][..., None])[..., 0]


def forward_backward(model, rollouts: dict, name: str) -> Timer:
    mask = rollouts["completion_mask"]
    with Timer() as timer:
        with precision(name):
            logp = completion_logp(model, rollouts)
        ((logp * mask).sum() / mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return timer


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8, help="measured repeats, after one warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the default sweep's jobs run 1)")
    parser.add_argument("--warmstart-steps", type=int, default=300)
    parser.add_argument("--name", default="cpu_bf16_tiny")
    add_path_args(parser)
    args = parser.parse_args(argv)
    import torch

    from harness.config.loading import load_method
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import sampling_settings

    torch.set_num_threads(args.threads)
    resolved, paths = tiny_sweep(args.workdir, args.warmstart_steps)
    trainer = build_trainer(resolved, load_method("uniform"), 0, paths, args.workdir / "cpu_bf16")
    model, train = trainer.model, resolved.preset.train
    gen_config, eos = sampling_settings(trainer)
    prompts = trainer.train_dataset["prompt"]
    env = environment(args.cpu_free_flag)
    raw = {"rollout_s": {p: [] for p in PRECISIONS}, "train_s": {p: [] for p in PRECISIONS}, "max_logp_gap": []}
    started = time.perf_counter()
    for repeat in range(args.repeats + 1):
        batch = [prompts[(repeat * train.prompts_per_step + i) % len(prompts)] for i in range(train.prompts_per_step)]
        order = PRECISIONS if repeat % 2 == 0 else PRECISIONS[::-1]
        timings, rollouts = {}, None
        for name in order:
            model.eval()
            with precision(name):
                out = sample_rollouts(model, trainer.processing_class, batch, train.num_generations, gen_config,
                                      eos, seed=100 + repeat)
            if rollouts is None:  # both precisions train on the first precision's rollouts
                rollouts = out
            model.train()
            timings[name] = (out["cpu_s"], forward_backward(model, rollouts, name).cpu)
        with torch.no_grad():
            fp32 = completion_logp(model, rollouts)
            with precision("bf16"):
                bf16 = completion_logp(model, rollouts)
        gap = float(((bf16 - fp32).abs() * rollouts["completion_mask"]).max())
        if repeat == 0:
            continue
        for name in PRECISIONS:
            raw["rollout_s"][name].append(timings[name][0])
            raw["train_s"][name].append(timings[name][1])
        raw["max_logp_gap"].append(gap)
        print(f"[bench] repeat {repeat}: rollouts bf16/fp32 {timings['bf16'][0] / timings['fp32'][0]:.2f}, "
              f"fwd+bwd {timings['bf16'][1] / timings['fp32'][1]:.2f}, max |dlogp| {gap:.3g}", flush=True)
    results = {phase: paired_ratio(raw[phase]["bf16"], raw[phase]["fp32"]) for phase in ("rollout_s", "train_s")}
    results["max_logp_gap"] = max(raw["max_logp_gap"])
    record = {"benchmark": "cpu_bf16", "settings": {"preset": "tiny", "repeats": args.repeats, "threads": args.threads,
                                                    "rows": train.prompts_per_step * train.num_generations,
                                                    "timer": "process CPU seconds"},
              "environment": env, "elapsed_s": time.perf_counter() - started, "results": results, "raw": raw}
    return publish(args.results, args.name, record, summary_markdown(record))


def summary_markdown(record: dict) -> str:
    r, s = record["results"], record["settings"]
    rows = [["rollouts (generate)", fmt_ratio(r["rollout_s"])],
            ["training forward + backward", fmt_ratio(r["train_s"])]]
    return "\n".join([
        "## bfloat16 autocast on CPU / float32 (tiny preset)", "",
        f"{record['environment']['date']}; {s['rows']} rollouts per repeat, {s['threads']} thread(s), {s['repeats']} "
        f"interleaved repeats after 1 warm-up, process CPU time; machine {machine_state(record['environment'])}. "
        f"Largest |log p bf16 - log p fp32| over completion tokens: {r['max_logp_gap']:.3g}.", "",
        table(["phase", "bf16 / fp32 (median [IQR] (90% CI))"], rows)])


if __name__ == "__main__":
    main(sys.argv[1:])
