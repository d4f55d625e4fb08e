"""Profile of one training step: where a step of the harness (and of plain TRL) spends its time.

Builds the same trainers as bench/step_overhead.py (bench/trainer_variants.py: same warm start, batch, seeding),
runs one warm-up block, then profiles ``--steps`` steps of each variant twice: with cProfile (Python functions,
cumulative time: hooks, token statistics, TRL's generation loop, logging) and with torch.profiler (operators, self
CPU time). Writes the top entries to results/bench/profile_<preset>.json and prints them.

Usage:  python -m bench.profile_step [--preset tiny|smol] [--variants trl,uniform] [--steps 3] [--top 30]
        [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

from bench.fixtures import sweep
from bench.machine import environment
from bench.publish import add_path_args, write_result
from bench.trainer_variants import build_variant, run_block

# functions whose cumulative share of a step is worth tracking by name (substring of "file:line(function)")
WATCH = {
    "generate (transformers)": "generation/utils.py", "_generate_and_score_completions": "_generate_and_score_compl",
    "reward scoring": "score_batch", "prepare_batch (hooks)": "prepare_batch", "_compute_loss": "(_compute_loss)",
    "Actor.statistics": "(statistics)", "token_statistics": "(token_statistics)",
    "model forward (LlamaForCausalLM)": "modeling_llama.py", "backward": "(backward)",
    "optimizer step": "(step_unless_skipped)", "TRL/Trainer log": "(log)", "_log_step_metrics": "_log_step_metrics",
    "BudgetCallback.on_step_end": "(on_step_end)", "BudgetCallback.on_log (metrics.jsonl)": "(on_log)",
    "checkpoint (torch.utils.checkpoint)": "checkpoint.py",
}


def cprofile_block(variant, block: int, steps: int, top: int) -> dict:
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    run_block(variant, block, steps)
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    entries = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        entries.append({"function": f"{Path(filename).name}:{line}({func})", "path": filename, "calls": nc,
                        "tottime": tt, "cumtime": ct})
    total = max((e["cumtime"] for e in entries), default=wall)
    watched = {}
    for name, needle in WATCH.items():
        hits = [e for e in entries if needle in e["function"] or needle in e["path"]]
        if hits:  # the outermost hit (largest cumulative time) avoids counting recursion twice
            watched[name] = max(h["cumtime"] for h in hits)
    by_cum = sorted(entries, key=lambda e: -e["cumtime"])[:top]
    by_self = sorted(entries, key=lambda e: -e["tottime"])[:top]
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(top)
    return {"wall_s": wall, "steps": steps, "total_cum_s": total, "watched_s": watched,
            "top_cumulative": [{k: v for k, v in e.items() if k != "path"} for e in by_cum],
            "top_self": [{k: v for k, v in e.items() if k != "path"} for e in by_self], "text": buf.getvalue()}


def torch_profile_block(variant, block: int, steps: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        run_block(variant, block, steps)
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:top]
    total_self = sum(e.self_cpu_time_total for e in averages)
    return {"total_self_cpu_s": total_self / 1e6,
            "top_self_cpu": [{"op": e.key, "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6,
                              "cpu_total_s": e.cpu_time_total / 1e6} for e in rows],
            "text": averages.table(sort_by="self_cpu_time_total", row_limit=top)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=["tiny", "smol"])
    parser.add_argument("--variants", default="trl,uniform")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--warmstart-steps", type=int, default=300)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--name", default=None)
    add_path_args(parser)
    args = parser.parse_args(argv)
    resolved, _ = sweep(args.preset, args.workdir, args.warmstart_steps, args.set)
    results = {}
    for label in [v for v in args.variants.split(",") if v]:
        variant = build_variant(label, args.preset, args, 0.5)
        run_block(variant, 0, 1)  # warm-up
        py = cprofile_block(variant, 1, args.steps, args.top)
        ops = torch_profile_block(variant, 2, args.steps, args.top)
        results[label] = {"cprofile": py, "torch": ops}
        print(f"===== {label}: cProfile, {args.steps} steps, {py['wall_s']:.2f} s wall =====")
        for name, secs in sorted(py["watched_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:45s} {secs:8.3f} s  {100 * secs / py['total_cum_s']:5.1f}%")
        print(py["text"][:6000])
        print(f"===== {label}: torch.profiler (self CPU) =====")
        print(ops["text"])
    record = {"benchmark": "profile_step", "preset": resolved.preset.name,
              "settings": {"steps": args.steps, "variants": args.variants, "overrides": args.set},
              "environment": environment(args.cpu_free_flag), "results": results}
    write_result(args.results, args.name or f"profile_{resolved.preset.name}", record)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
