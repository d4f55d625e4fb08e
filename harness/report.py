"""Leaderboard: the sweep's eval results as ``leaderboard.csv`` (one row per run x checkpoint x benchmark)
and ``leaderboard.md`` (per method at the full budget, averaged over seeds, the warm start as reference row).

Every number comes from a ``results.json`` written by ``harness eval``; those are computed from the
``samples.jsonl`` beside them, so each cell can be traced to its generations (the CSV names the file).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from harness.config import Resolved
from harness.datafiles import write_json_atomic
from harness.paths import WARMSTART_LABEL, SweepPaths, checkpoint_name

FINAL_CKPT = checkpoint_name(1.0)
WARMSTART_CKPT = "ckpt-000"


def collect_rows(resolved: Resolved, paths: SweepPaths) -> list[dict]:
    """One dict per (label, seed, ckpt, bench) with the eval metrics and the run's realised budget."""
    sweep, preset = resolved.sweep, resolved.preset
    runs = [(WARMSTART_LABEL, 0, WARMSTART_CKPT)]
    ckpts = [checkpoint_name(f) for f in preset.train.budget.checkpoint_fractions]
    runs += [(label, seed, ckpt) for label in sweep.methods for seed in sweep.seeds for ckpt in ckpts]
    rows = []
    for label, seed, ckpt in runs:
        run = _read_json(paths.run_dir(label, seed) / "run.json") if label != WARMSTART_LABEL else None
        for bench in sorted(preset.eval.benchmarks):
            results_file = paths.eval_dir(label, seed, ckpt, bench) / "results.json"
            results = _read_json(results_file)
            rows.append(_row(label, seed, ckpt, bench, results, run, results_file, paths.root))
    return rows


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"report: missing {path}; run the sweep (snakemake) first")
    return json.loads(path.read_text(encoding="utf-8"))


def _row(label, seed, ckpt, bench, results, run, results_file: Path, root: Path) -> dict:
    k = results["k"]
    metrics = results["metrics"]
    row = {
        "method": label, "seed": seed, "ckpt": ckpt, "bench": bench, "n_problems": results["n_problems"], "k": k,
        "temperature": results["temperature"], "avg@k": metrics[f"avg@{k}"], "pass@k": metrics[f"pass@{k}"],
        "maj@k": metrics[f"maj@{k}"], "greedy_accuracy": metrics.get("greedy_accuracy"),
        "mean_response_tokens": metrics["mean_response_tokens"], "format_ok_rate": metrics["format_ok_rate"],
        "ungradable": metrics["ungradable"],
    }
    step_of_ckpt = run["budget"]["checkpoints"].get(ckpt) if run else 0
    row.update({
        "steps": step_of_ckpt,
        "spent_steps_total": run["budget"]["spent_steps"] if run else 0,
        "tokens_generated_total": run["counters"]["generated_tokens"] if run else 0,
        "tokens_forwarded_total": run["counters"]["forwarded_tokens"] if run else 0,
        "results_file": str(results_file.relative_to(root)),
    })
    return row


def write_csv(rows: list[dict], path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(buffer.getvalue(), encoding="utf-8")
    tmp.replace(path)
    return path


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} ± {100 * statistics.stdev(values):.1f}"


def markdown_table(rows: list[dict], methods: list[str], benches: list[str]) -> str:
    """Per method at the full budget (the warm start at step 0): accuracy in % as mean ± sd over seeds."""
    k = rows[0]["k"]
    header = ["method", "seeds"] + [f"{b} avg@{k}" for b in benches] + [f"{b} greedy" for b in benches] + [
        "mean response tokens", "steps", "tokens generated"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in [WARMSTART_LABEL, *methods]:
        ckpt = WARMSTART_CKPT if label == WARMSTART_LABEL else FINAL_CKPT
        mine = [r for r in rows if r["method"] == label and r["ckpt"] == ckpt]
        if not mine:
            continue
        seeds = sorted({r["seed"] for r in mine})
        cells = [label if label != WARMSTART_LABEL else "warmstart (reference)", str(len(seeds))]
        for metric in ("avg@k", "greedy_accuracy"):
            for bench in benches:
                cells.append(_mean_sd([r[metric] for r in mine if r["bench"] == bench and r[metric] is not None]))
        per_seed = {r["seed"]: r for r in mine}
        cells.append(f"{statistics.fmean(r['mean_response_tokens'] for r in mine):.1f}")
        cells.append(f"{statistics.fmean(r['steps'] for r in per_seed.values()):.0f}")
        cells.append(f"{statistics.fmean(r['tokens_generated_total'] for r in per_seed.values()):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_leaderboard(resolved: Resolved, paths: SweepPaths) -> list[Path]:
    rows = collect_rows(resolved, paths)
    benches = sorted(resolved.preset.eval.benchmarks)
    first = rows[0]
    text = "\n".join([
        f"# Leaderboard: sweep `{resolved.sweep.name}` (preset `{resolved.preset.name}`)",
        "",
        f"Accuracy in %, mean ± sd over seeds, at the full budget ({resolved.preset.train.budget.kind} = "
        f"{resolved.preset.train.budget.amount:g}). avg@{first['k']}: mean correctness of {first['k']} samples "
        f"per problem at T={first['temperature']}; greedy: one sample at T=0. Problems per benchmark: "
        + ", ".join(f"{b} {next(r['n_problems'] for r in rows if r['bench'] == b)}" for b in benches) + ".",
        "",
        markdown_table(rows, resolved.sweep.methods, benches),
        "",
        "Every row of `leaderboard.csv` names the `results.json` it came from; its `samples.jsonl` holds the "
        "generations.",
        "",
    ])
    md = paths.root / "leaderboard.md"
    tmp = md.with_name(md.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(md)
    csv_path = write_csv(rows, paths.root / "leaderboard.csv")
    provenance_path = write_json_atomic(paths.root / "leaderboard.json",
                                        {"config": resolved.to_dict(), "rows": rows})
    return [md, csv_path, provenance_path]
