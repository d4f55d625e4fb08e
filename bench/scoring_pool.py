"""math-verify reward scoring on a pool of worker processes (``train.reward_scoring_workers``) against one worker:
wall time of scoring one batch of rollouts, and that the scores are the same.

The batch: MATH-500's reference solutions (each ends in a ``\\boxed{}`` answer, like a rollout of the paper presets)
scored against their answers, ``--copies`` times over with a per-copy suffix so nothing is served from the cache.
One worker and each pool size are timed interleaved in one process (the order reversed every repeat), the pools
started and warmed before timing (a training process keeps its pool); the result cache is cleared before each
measurement. On a GPU node the pool uses the CPUs the training process otherwise leaves idle while it scores.

Usage:  python -m bench.scoring_pool [--workers 2] [--repeats 7] [--copies 1]
"""

from __future__ import annotations

import argparse

from bench.machine import Timer, environment, machine_state
from bench.publish import add_path_args, publish, table
from bench.stats import describe, fmt_ratio, paired_ratio
from harness.config.paths import REPO_ROOT
from harness.data import scoring
from harness.data.files import read_jsonl

NAME = "scoring_pool"
TIMEOUT_S = 5.0


def batch(copies: int) -> tuple[list[str], list[str]]:
    rows = read_jsonl(REPO_ROOT / "data" / "benchmarks" / "math500.jsonl")
    completions = [f"{r['solution']}\n(copy {c})" for c in range(copies) for r in rows]
    return completions, [str(r["answer"]) for _ in range(copies) for r in rows]


def timed(completions: list[str], golds: list[str], workers: int) -> tuple[float, list]:
    scoring._CACHE.clear()
    with Timer() as t:
        scores = scoring.score_batch(completions, golds, "math_verify", TIMEOUT_S, workers)
    return t.wall, scores


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--copies", type=int, default=1)
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    env = environment(args.cpu_free_flag)
    completions, golds = batch(args.copies)
    variants = [1, *args.workers]
    _, reference = timed(completions[:8], golds[:8], max(variants))  # start and warm every worker
    _, reference = timed(completions, golds, 1)
    seconds = {w: [] for w in variants}
    for repeat in range(args.repeats):
        for workers in variants if repeat % 2 == 0 else variants[::-1]:
            wall, scores = timed(completions, golds, workers)
            if scores != reference:
                raise SystemExit(f"{workers} workers scored the batch differently from one worker")
            seconds[workers].append(wall)
    ratios = {w: paired_ratio(seconds[w], seconds[1]) for w in args.workers}
    rows = [[1, len(completions), f"{describe(seconds[1])['median']:.2f}", "1"]]
    rows += [[w, len(completions), f"{describe(seconds[w])['median']:.2f}", fmt_ratio(ratios[w])]
             for w in args.workers]
    correct = sum(s.correct for s in reference)
    markdown = (f"### math-verify reward scoring on a worker pool ({machine_state(env)})\n\n"
                f"MATH-500 reference solutions ({len(completions)} items, {correct} scored correct, timeouts "
                f"{sum(s.timed_out for s in reference)}), {args.repeats} interleaved repeats; the same scores from "
                f"every pool size. Time per batch: median seconds, and pool / one worker.\n\n"
                + table(["workers", "items", "seconds", "pool / one worker"], rows))
    return publish(args.results, NAME, {"environment": env, "items": len(completions), "repeats": args.repeats,
                                 "seconds": {str(w): s for w, s in seconds.items()},
                                 "ratios": {str(w): r for w, r in ratios.items()}, "correct": correct}, markdown)


if __name__ == "__main__":
    main()
