"""What pinned CPU kernels cost (``cpu_kernels: pinned``, harness/config/kernels.py): the default sweep's own jobs,
run as Snakemake runs them (`harness train`, then `harness eval` of its checkpoints, each a process of its own),
pinned against native, in interleaved pairs whose order flips every pair.

Pinned: ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2,STRICT, ONEDNN_MAX_CPU_ISA=AVX2 in the job's environment and
deterministic algorithms on; native: none of the variables, deterministic algorithms off. Each mode trains in its
own results folder (data and warm start built once per mode); the training job runs a fraction of the tiny
preset's FLOPs budget (``--budget-fraction``), the eval job every checkpoint of that run on every benchmark. Times
are the wall seconds of each process, start-up included, and the training seconds per optimizer step from run.json
(the two modes' rollouts differ, so their step counts may too).

Usage:  python -m bench.pinned_kernels [--pairs 3] [--budget-fraction 0.25] [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.machine import environment, machine_state
from bench.publish import add_path_args, publish, table
from bench.stats import fmt_ratio, paired_ratio
from harness.config.kernels import PINNED_ENV
from harness.config.loading import resolve

MODES = ("native", "pinned")
SWEEP = "configs/sweeps/default.yaml"


def mode_env(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_ENV}
    return {**env, **PINNED_ENV} if mode == "pinned" else env


def harness(mode: str, results: Path, budget_flops: float, *args: str) -> float:
    """Wall seconds of one `harness` process of ``mode`` on the sweep in ``results``."""
    command = [sys.executable, "-m", "harness.cli", *args, "--sweep", SWEEP, "--set", f"results_dir={results}",
               "--set", f"cpu_kernels={mode}", "--set", f"train.budget.amount={budget_flops:g}"]
    started = time.perf_counter()
    subprocess.run(command, env=mode_env(mode), check=True, capture_output=True)
    return time.perf_counter() - started


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pinned/native pairs (default: %(default)s)")
    parser.add_argument("--budget-fraction", type=float, default=0.25,
                        help="share of the tiny preset's FLOPs budget each training job runs (default: %(default)s)")
    add_path_args(parser)
    args = parser.parse_args(argv)
    env = environment(args.cpu_free_flag)
    budget_flops = resolve(SWEEP).preset.train.budget.amount * args.budget_fraction
    folders = {mode: args.workdir / "pinned_kernels" / mode for mode in MODES}
    for mode in MODES:  # data and warm start, once per mode, not timed
        harness(mode, folders[mode], budget_flops, "data")
        harness(mode, folders[mode], budget_flops, "warmstart")
    times = {mode: {"train_s": [], "train_s_per_step": [], "eval_s": [], "steps": []} for mode in MODES}
    for pair in range(args.pairs):
        for mode in (MODES if pair % 2 == 0 else MODES[::-1]):
            run_args = (mode, folders[mode], budget_flops)
            times[mode]["train_s"].append(harness(*run_args, "train", "--method", "uniform", "--seed", "0"))
            run = json.loads((folders[mode] / "default" / "runs" / "uniform" / "seed0" / "run.json").read_text())
            times[mode]["steps"].append(run["budget"]["spent_steps"])
            times[mode]["train_s_per_step"].append(run["train_seconds"] / run["budget"]["spent_steps"])
            ckpts = sorted(run["budget"]["checkpoints"])
            eval_args = ("eval", "--label", "uniform", "--seed", "0", "--ckpt", *ckpts)
            times[mode]["eval_s"].append(harness(*run_args, *eval_args))
            print(f"pair {pair} {mode}: train {times[mode]['train_s'][-1]:.1f} s "
                  f"({times[mode]['steps'][-1]} steps), eval {times[mode]['eval_s'][-1]:.1f} s", flush=True)
    ratios = {key: paired_ratio(times["pinned"][key], times["native"][key])
              for key in ("train_s", "train_s_per_step", "eval_s")}
    record = {"environment": env, "pairs": args.pairs, "budget_fraction": args.budget_fraction,
              "budget_flops": budget_flops, "pinned_env": PINNED_ENV, "times": times, "pinned_over_native": ratios}
    rows = [["training job (wall s, start-up included)", fmt_ratio(ratios["train_s"])],
            ["training seconds per optimizer step (run.json)", fmt_ratio(ratios["train_s_per_step"])],
            ["eval job of its checkpoints (wall s)", fmt_ratio(ratios["eval_s"])]]
    markdown = "\n".join([
        "## Pinned CPU kernels (cpu_kernels: pinned) against native",
        "",
        f"`python -m bench.pinned_kernels --pairs {args.pairs} --budget-fraction {args.budget_fraction}`: the "
        f"default sweep's uniform seed 0, {args.budget_fraction:g} of the tiny preset's FLOPs budget per training "
        f"job, {args.pairs} interleaved pairs; {env['hardware']['cpu']}, {machine_state(env)}. Pinned / native:",
        "",
        table(["job", "pinned / native"], rows),
    ])
    return publish(args.results, "pinned_kernels", record, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
