"""What DAPO's dynamic sampling costs per step on the tiny preset: groups generated per group kept, and the step
time against the same step without it.

Variants (bench/trainer_variants.py, as in bench/step_overhead.py: the trainer of a run, reset to the warm start
before each block, torch's RNG seeded per (block, step)): ``uniform`` and ``uniform+ds``
(``train.dynamic_sampling.enabled=true``, ``prompts_per_round`` = ``prompts_per_step`` unless ``--set`` says
otherwise, at most 10 rounds). With the default round size both generate as many prompts in the first round
(``uniform`` from TRL's sampler, ``uniform+ds`` from the dynamic sampling prompt stream, so other prompts), so the
ratio is mostly the extra rounds' generation and scoring (the trained batch has the same size); blocks interleave
A B, B A, ... and block 0 is warm-up.

Reported per pair (block, step): step wall ratio, generation wall ratio, generation FLOPs ratio (budget ledger), and
for ``uniform+ds`` the groups generated / kept, the rounds and how often they ran out.

Usage:  python -m bench.dynamic_sampling [--blocks 16] [--steps 1] [--set train.dynamic_sampling.prompts_per_round=32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.fixtures import sweep
from bench.machine import environment, machine_state
from bench.publish import add_path_args, table, update_summary, write_result
from bench.stats import describe, fmt_ratio, paired_ratio
from bench.trainer_variants import build_variant, run_block

VARIANTS = ("uniform", "uniform+ds")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=16, help="blocks including the warm-up block 0")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps per variant and block")
    parser.add_argument("--warmstart-steps", type=int, default=300, help="supervised warm-start steps")
    parser.add_argument("--set", action="append", default=[], help="preset override for both variants")
    add_path_args(parser)
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (before the sweep helpers, as step_overhead)

    resolved, _ = sweep("tiny", args.workdir, args.warmstart_steps, args.set)
    env = environment(args.cpu_free_flag)
    built = {v: build_variant(v, "tiny", args, progress=None) for v in VARIANTS}
    started = time.perf_counter()
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for block in range(args.blocks):
        for v in VARIANTS if block % 2 == 0 else VARIANTS[::-1]:
            recorder = built[v].recorder
            recorder.steps.clear()
            run_block(built[v], block, args.steps)
            rows[v] += [{"block": block, "step": i, **rec} for i, rec in enumerate(recorder.steps)]
        print(f"[bench] block {block + 1}/{args.blocks} done ({time.perf_counter() - started:.0f} s)", flush=True)
    train = resolved.preset.train
    ds = built["uniform+ds"].trainer.preset.train.dynamic_sampling
    settings = {
        "preset": "tiny",
        "blocks": args.blocks,
        "warmup_blocks": 1,
        "steps_per_block": args.steps,
        "warmstart_steps": args.warmstart_steps,
        "overrides": args.set,
        "prompts_per_step": train.prompts_per_step,
        "num_generations": train.num_generations,
        "max_completion_length": train.max_completion_length,
        "threads": train.threads,
        "prompts_per_round": ds.prompts_per_round or train.prompts_per_step,
        "max_generation_rounds": ds.max_generation_rounds,
    }
    record = analyse(rows, settings, env, time.perf_counter() - started)
    name = "dynamic_sampling_tiny"  # a round size other than prompts_per_step gets a section of its own
    if settings["prompts_per_round"] != train.prompts_per_step:
        name += f"_round{settings['prompts_per_round']}"
    write_result(args.results, name, record)
    update_summary(args.results, name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def analyse(rows: dict, settings: dict, env: dict, elapsed: float) -> dict:
    measured = {v: {(r["block"], r["step"]): r for r in rows[v] if r["block"] > 0} for v in VARIANTS}
    keys = sorted(set(measured["uniform"]) & set(measured["uniform+ds"]))
    ds, base = [measured["uniform+ds"][k] for k in keys], [measured["uniform"][k] for k in keys]
    generated = [r["dynamic_sampling/groups_generated"] for r in ds]
    kept = [r["dynamic_sampling/groups_kept"] + r["dynamic_sampling/groups_filled"] for r in ds]  # trained groups
    stats = {
        "step_wall": paired_ratio([r["wall"] for r in ds], [r["wall"] for r in base]),
        "generation_wall": paired_ratio([r["generation_wall"] for r in ds], [r["generation_wall"] for r in base]),
        "generation_flops": paired_ratio(
            [r["ledger"]["flops_generation"] for r in ds], [r["ledger"]["flops_generation"] for r in base]
        ),
        "generated_per_trained_group": describe([g / k for g, k in zip(generated, kept, strict=True)]),
        "generated_per_trained_group_pooled": sum(generated) / sum(kept),
        "rounds": describe([r["dynamic_sampling/rounds"] for r in ds]),
        "one_round_steps": sum(r["dynamic_sampling/rounds"] == 1 for r in ds),
        "rounds_exhausted_steps": sum(r["dynamic_sampling/rounds_exhausted"] for r in ds),
        "with_signal_frac_pooled": sum(r["dynamic_sampling/groups_with_signal"] for r in ds) / sum(generated),
        "filled_groups_pooled": sum(r["dynamic_sampling/groups_filled"] for r in ds),
        "step_wall_uniform_median": statistics.median(r["wall"] for r in base),
        "step_wall_ds_median": statistics.median(r["wall"] for r in ds),
        "pairs": len(keys),
    }
    return {
        "benchmark": "dynamic_sampling",
        "preset": "tiny",
        "settings": settings,
        "environment": env,
        "elapsed_s": elapsed,
        "stats": stats,
        "raw": rows,
    }


def summary_markdown(record: dict) -> str:
    s, st = record["settings"], record["stats"]
    lines = [
        f"## Dynamic sampling (tiny preset, rounds of {s['prompts_per_round']} prompts, `bench/dynamic_sampling.py`)",
        "",
        f"{record['environment']['date']}; {s['prompts_per_step']} prompts x {s['num_generations']} rollouts, max "
        f"{s['max_completion_length']} tokens, rounds of {s['prompts_per_round']} prompts, at most "
        f"{s['max_generation_rounds']}; {st['pairs']} interleaved pairs (uniform with and without dynamic sampling) "
        f"after 1 warm-up block; machine {machine_state(record['environment'])}.",
        "",
        f"Groups with signal: {st['with_signal_frac_pooled']:.0%} of those generated. Groups generated per trained "
        f"group: {st['generated_per_trained_group_pooled']:.2f} pooled, per step median "
        f"{st['generated_per_trained_group']['median']:.2f} [{st['generated_per_trained_group']['q25']:.2f}-"
        f"{st['generated_per_trained_group']['q75']:.2f}]; rounds per step median {st['rounds']['median']:.0f} "
        f"(max {st['rounds']['max']:.0f}; one round in {st['one_round_steps']} of {st['pairs']} steps); steps whose "
        f"rounds ran out: {st['rounds_exhausted_steps']:.0f} "
        f"({st['filled_groups_pooled']:.0f} zero-variance groups trained in all).",
        "",
        table(
            ["ratio with / without", "median [IQR] (90% CI)"],
            [
                ["step (wall)", fmt_ratio(st["step_wall"])],
                ["generation (wall)", fmt_ratio(st["generation_wall"])],
                ["generation FLOPs (ledger)", fmt_ratio(st["generation_flops"])],
            ],
        ),
        "",
        f"Median step: {st['step_wall_uniform_median']:.3f} s without, {st['step_wall_ds_median']:.3f} s with.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
