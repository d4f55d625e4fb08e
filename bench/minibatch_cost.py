"""Cost of PPO mini-batch steps (issue #14) against today's one step per generation batch (r = 1), at the
same generation batch.

Variants of the uniform method, each its own trainer (bench/trainer_variants.py, as bench/step_overhead.py):
- ``uniform``: mini_batches = ppo_epochs = 1: one optimizer step per generation batch, old = logp.detach(), no pass
  of its own for pi_old;
- ``uniform+k2``, ``uniform+k4``: ``train.mini_batches`` = 2, 4: one no-grad forward over the reduced batch for the
  rollout policy's log-probs (budget phase ``old_logp``), then k optimizer steps on 1/k of the batch each;
- ``uniform+k2e2``: mini_batches = 2, ppo_epochs = 2: the same pass, then 4 steps (two passes over the batch).

Design (paired, interleaved, as step_overhead): block b runs one generation batch of every variant (its k x E
optimizer steps) from the warm start, the order reversed every other block; the torch RNG is seeded per (block,
step), so every variant samples the same rollouts (checked: ``same rollouts``) and a ratio compares the training
side. Block 0 is warm-up. Per generation batch: wall and process-CPU seconds of all its steps, and from the budget
ledger the old_logp pass's seconds (the run's phase clock: process CPU time on CPU) and FLOPs.

Expected: the old-log-prob pass is one forward of the reduced batch, i.e. r = 1's training FLOPs / 3 (the ledger
counts forward + backward as 3 forwards), and no more; k steps repeat the per-step fixed costs (optimizer, logging,
the backward's weight gradients) k times on batches 1/k the size.

Usage:  python -m bench.minibatch_cost [--blocks 21] [--variants uniform,uniform+k2,uniform+k4,uniform+k2e2]
        [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.fixtures import sweep
from bench.machine import environment, machine_state
from bench.publish import add_path_args, table, update_summary, write_result
from bench.stats import describe, fmt_ratio, paired_ratio
from bench.trainer_variants import build_variant, run_block

MINI_BATCHING = {  # variant suffix "+<name>" -> preset overrides, after trainer_variants' ONE_STEP_PER_GENERATION
    "k2": ["train.mini_batches=2"],
    "k4": ["train.mini_batches=4"],
    "k2e2": ["train.mini_batches=2", "train.ppo_epochs=2"],
}
DEFAULT_VARIANTS = ["uniform", "uniform+k2", "uniform+k4", "uniform+k2e2"]


def updates_of(variant: str) -> int:
    """Optimizer steps per generation batch: mini_batches x ppo_epochs of the variant's overrides."""
    settings = {"mini_batches": 1, "ppo_epochs": 1}
    for override in MINI_BATCHING.get(variant.partition("+")[2], []):
        key, value = override.removeprefix("train.").split("=")
        settings[key] = int(value)
    return settings["mini_batches"] * settings["ppo_epochs"]


def batch_record(block: int, steps: list[dict]) -> dict:
    """One generation batch of a variant: its optimizer steps' records summed (the ledger deltas too)."""
    ledger = {k: sum(s["ledger"][k] for s in steps) for k in steps[0]["ledger"]}
    return {"block": block, "steps": len(steps), "wall": sum(s["wall"] for s in steps),
            "cpu": sum(s["cpu"] for s in steps), "generation_wall": sum(s["generation_wall"] for s in steps),
            "loss_forward_cpu": sum(s["loss_forward_cpu"] for s in steps), "ledger": ledger,
            "rollouts_hash": steps[0]["rollouts_hash"], "completion_lengths": steps[0]["completion_lengths"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--blocks", type=int, default=21, help="blocks including the warm-up block 0")
    parser.add_argument("--warmstart-steps", type=int, default=300, help="tiny: supervised warm-start steps")
    parser.add_argument("--set", action="append", default=[], help="preset override, e.g. train.prompts_per_step=8")
    parser.add_argument("--name", default="minibatch_cost_tiny")
    parser.add_argument("--render", type=Path, default=None,
                        help="re-analyse a saved <results>/minibatch_cost_*.json instead of measuring")
    add_path_args(parser)
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        record = analyse(saved["raw"], saved["settings"], saved["environment"], saved["elapsed_s"])
    else:
        import torch  # noqa: F401  (import before the sweep helpers so the thread setting sticks)

        variants = [v for v in args.variants.split(",") if v]
        if variants[0] != "uniform":
            raise ValueError("the first variant must be 'uniform' (r = 1), the reference of every ratio")
        resolved, _ = sweep("tiny", args.workdir, args.warmstart_steps, args.set)
        env = environment(args.cpu_free_flag)
        built = {v: build_variant(v, "tiny", args, None, options=MINI_BATCHING, folder="minibatch_cost")
                 for v in variants}
        started = time.perf_counter()
        raw: dict[str, list[dict]] = {v: [] for v in variants}
        for block in range(args.blocks):
            for v in variants if block % 2 == 0 else variants[::-1]:
                recorder = built[v].recorder
                recorder.steps.clear()
                run_block(built[v], block, updates_of(v))
                raw[v].append(batch_record(block, list(recorder.steps)))
            print(f"[bench] block {block + 1}/{args.blocks} done ({time.perf_counter() - started:.0f} s)", flush=True)
        train = resolved.preset.train
        settings = {"preset": "tiny", "blocks": args.blocks, "warmup_blocks": 1, "variants": variants,
                    "overrides": args.set, "updates": {v: updates_of(v) for v in variants},
                    "prompts_per_step": train.prompts_per_step, "num_generations": train.num_generations,
                    "max_completion_length": train.max_completion_length, "threads": train.threads,
                    "forward_chunk_rows": train.forward_chunk_rows}
        record = analyse(raw, settings, env, time.perf_counter() - started)
    write_result(args.results, args.name, record)
    update_summary(args.results, args.name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def analyse(raw: dict, settings: dict, env: dict, elapsed: float) -> dict:
    measured = {v: [r for r in rows if r["block"] > 0] for v, rows in raw.items()}
    stats = {}
    for v, rows in measured.items():
        stats[v] = {"wall": describe([r["wall"] for r in rows]), "cpu": describe([r["cpu"] for r in rows]),
                    "old_logp_s": describe([r["ledger"]["seconds_old_logp"] for r in rows]),
                    "flops_old_logp": statistics.median(r["ledger"]["flops_old_logp"] for r in rows),
                    "flops_train": statistics.median(r["ledger"]["flops_train"] for r in rows),
                    "mean_completion_length": statistics.mean(statistics.mean(r["completion_lengths"])
                                                              for r in rows)}
    base = {r["block"]: r for r in measured["uniform"]}
    comparisons = []
    for v in settings["variants"][1:]:
        rows = [r for r in measured[v] if r["block"] in base]
        refs = [base[r["block"]] for r in rows]
        comparisons.append({
            "variant": v, "updates": settings["updates"][v],
            "identical_rollouts": all(r["rollouts_hash"] == b["rollouts_hash"]
                                      for r, b in zip(rows, refs, strict=True)),
            "batch_wall": paired_ratio([r["wall"] for r in rows], [b["wall"] for b in refs]),
            "batch_cpu": paired_ratio([r["cpu"] for r in rows], [b["cpu"] for b in refs]),
            # the pass against r = 1's own training forward (with grad, entropy and the loss), CPU seconds both
            "old_logp_vs_forward": paired_ratio([r["ledger"]["seconds_old_logp"] for r in rows],
                                                [b["loss_forward_cpu"] for b in refs]),
            "old_logp_share": paired_ratio([r["ledger"]["seconds_old_logp"] for r in rows], [r["cpu"] for r in rows]),
            # FLOPs of the pass over one forward of the reduced batch (r = 1's train FLOPs / 3): 1 means exactly one
            "old_logp_forwards": paired_ratio([r["ledger"]["flops_old_logp"] for r in rows],
                                              [b["ledger"]["flops_train"] / 3 for b in refs]),
        })
    return {"benchmark": "minibatch_cost", "preset": "tiny", "settings": settings, "environment": env,
            "elapsed_s": elapsed, "stats": stats, "comparisons": comparisons, "raw": raw}


def summary_markdown(record: dict) -> str:
    s, st = record["settings"], record["stats"]
    lines = ["## Mini-batch cost (tiny preset): mini-batch PPO steps and the old-log-prob pass against r = 1", "",
             f"{record['environment']['date']}; {s['prompts_per_step']} prompts x {s['num_generations']} rollouts, "
             f"max {s['max_completion_length']} tokens, {s['threads']} thread(s), uniform; {s['blocks'] - 1} "
             f"measured blocks of one generation batch per variant after 1 warm-up block; machine "
             f"{machine_state(record['environment'])}.", "",
             "Per generation batch (median; old_logp = the pass's seconds on the run's phase clock, process CPU time):",
             ""]
    rows = []
    for v in s["variants"]:
        x = st[v]
        rows.append([v, str(s["updates"][v]), f"{x['wall']['median']:.3f}", f"{x['cpu']['median']:.3f}",
                     f"{x['old_logp_s']['median']:.3f}", f"{x['flops_old_logp']:.3g}", f"{x['flops_train']:.3g}",
                     f"{x['mean_completion_length']:.1f}"])
    lines.append(table(["variant", "optimizer steps", "wall s", "CPU s", "old_logp s", "old_logp FLOPs",
                        "train FLOPs", "mean completion"], rows))
    lines += ["", "Ratios against r = 1 (median of per-block ratios [interquartile range] (90% bootstrap interval of "
              "the median)); old_logp forwards = the pass's FLOPs / one forward of the reduced batch (expected 1):",
              ""]
    rows = [[f"{c['variant']} / uniform", fmt_ratio(c["batch_wall"]), fmt_ratio(c["batch_cpu"]),
             fmt_ratio(c["old_logp_vs_forward"]), fmt_ratio(c["old_logp_share"]), fmt_ratio(c["old_logp_forwards"]),
             "yes" if c["identical_rollouts"] else "no"] for c in record["comparisons"]]
    lines.append(table(["ratio", "generation batch (wall)", "generation batch (CPU)",
                        "old_logp pass / r = 1 training forward (CPU)", "old_logp share of the batch (CPU)",
                        "old_logp forwards", "same rollouts"], rows))
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
