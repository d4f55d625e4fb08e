"""Per-rule breakdown of a finished sweep from Snakemake's benchmark files.

Every rule of the Snakefile that does real work writes a benchmark TSV (``benchmark:`` directive): warmstart.tsv,
train/<label>_seed<N>.tsv, eval/<label>_seed<N>_<ckpt>[_<bench>].tsv, with the columns s (wall seconds), h:m:s,
max_rss, max_vms, max_uss, max_pss (MB), io_in, io_out, mean_load, cpu_time. The rule is the sub-folder (or the file
name at the top level). The sweep's own wall time is Snakemake's "Elapsed time" line in its log.

Output: per rule jobs, total / mean / max seconds, CPU seconds, max RSS; per method label for train and eval; the
sum of job seconds against the elapsed time (how well the 2 cores were kept busy).

Usage:  python bench/sweep_breakdown.py [--benchmarks /work/ci-clone/results/default/benchmarks]
                                          [--log /tmp/sweep3.log]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from pathlib import Path

from _common import environment, table, update_summary, write_result

DEFAULT_BENCHMARKS = Path("/work/ci-clone/results/default/benchmarks")
DEFAULT_LOG = Path("/tmp/sweep3.log")


def _float(value: str | None) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_benchmarks(folder: Path) -> list[dict]:
    jobs = []
    for path in sorted(folder.rglob("*.tsv")):
        rel = path.relative_to(folder)
        rule = rel.parts[0] if len(rel.parts) > 1 else path.stem
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        for i, row in enumerate(rows):  # one row per repeat of the benchmark directive (1 by default)
            jobs.append({"rule": rule, "file": str(rel), "repeat": i, "label": _label(rule, path.stem),
                         "s": _float(row.get("s")), "cpu_time": _float(row.get("cpu_time")),
                         "max_rss_mb": _float(row.get("max_rss")), "max_uss_mb": _float(row.get("max_uss")),
                         "mean_load": _float(row.get("mean_load"))})
    return jobs


def _label(rule: str, stem: str) -> str | None:
    if rule in ("train", "eval"):
        match = re.match(r"(.+?)_seed\d+", stem)
        return match.group(1) if match else stem
    return None


def read_log(path: Path) -> dict:
    out = {"log": str(path), "exists": path.is_file()}
    if not path.is_file():
        return out
    text = path.read_text(errors="replace")
    elapsed = re.findall(r"Elapsed time: (?:(\d+) days?, )?(\d+):(\d+):(\d+(?:\.\d+)?)", text)
    if elapsed:
        days, h, m, s = elapsed[-1]
        out["elapsed_s"] = int(days or 0) * 86400 + int(h) * 3600 + int(m) * 60 + float(s)
    progress = re.findall(r"(\d+) of (\d+) steps \((\d+)%\) done", text)
    if progress:
        done, total, pct = progress[-1]
        out.update(steps_done=int(done), steps_total=int(total), percent=int(pct))
    out["finished"] = bool(progress) and progress[-1][0] == progress[-1][1]
    out["errors"] = len(re.findall(r"^Error in rule", text, flags=re.M))
    return out


def group(jobs: list[dict], key: str) -> dict[str, dict]:
    out = {}
    for name in sorted({j[key] for j in jobs if j[key] is not None}):
        sel = [j for j in jobs if j[key] == name and j["s"] is not None]
        secs = [j["s"] for j in sel]
        cpu = [j["cpu_time"] for j in sel if j["cpu_time"] is not None]
        rss = [j["max_rss_mb"] for j in sel if j["max_rss_mb"] is not None]
        out[name] = {"jobs": len(sel), "total_s": sum(secs), "mean_s": statistics.mean(secs) if secs else None,
                     "max_s": max(secs) if secs else None, "cpu_s": sum(cpu) if cpu else None,
                     "max_rss_mb": max(rss) if rss else None}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", type=Path, default=DEFAULT_BENCHMARKS)
    parser.add_argument("--log", type=Path, default=DEFAULT_LOG)
    parser.add_argument("--name", default="sweep_breakdown")
    args = parser.parse_args(argv)
    jobs = read_benchmarks(args.benchmarks)
    log = read_log(args.log)
    rules = group(jobs, "rule")
    by_label = {rule: group([j for j in jobs if j["rule"] == rule], "label") for rule in ("train", "eval")}
    job_seconds = sum(j["s"] for j in jobs if j["s"] is not None)
    record = {"benchmark": "sweep_breakdown", "settings": {"benchmarks": str(args.benchmarks), "log": str(args.log)},
              "environment": environment(), "log": log, "rules": rules, "by_label": by_label,
              "job_seconds_total": job_seconds,
              "parallelism": job_seconds / log["elapsed_s"] if log.get("elapsed_s") else None, "jobs": jobs}
    write_result(args.name, record)
    update_summary(args.name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def _fmt(x, digits=1):
    return "" if x is None else f"{x:.{digits}f}"


def summary_markdown(record: dict) -> str:
    log = record["log"]
    status = "finished" if log.get("finished") else (
        f"NOT finished ({log.get('steps_done')} of {log.get('steps_total')} steps)" if log.get("exists")
        else "log not found")
    elapsed = log.get("elapsed_s")
    lines = ["## Default sweep: per-rule breakdown", "",
             f"Benchmark files: `{record['settings']['benchmarks']}`; log `{record['settings']['log']}`: {status}, "
             f"elapsed {_fmt(elapsed, 0) + ' s' if elapsed else 'n/a'}, errors {log.get('errors', 'n/a')}. "
             f"Sum of job seconds {record['job_seconds_total']:.0f} s"
             + (f" = {record['parallelism']:.2f} x the elapsed time (2 cores)." if record["parallelism"] else "."),
             ""]
    rows = [[rule, r["jobs"], _fmt(r["total_s"], 0), _fmt(r["mean_s"]), _fmt(r["max_s"]), _fmt(r["cpu_s"], 0),
             _fmt(r["max_rss_mb"], 0),
             f"{100 * r['total_s'] / record['job_seconds_total']:.0f}%" if record["job_seconds_total"] else ""]
            for rule, r in record["rules"].items()]
    lines.append(table(["rule", "jobs", "total s", "mean s", "max s", "CPU s", "max RSS MB", "share"], rows))
    for rule in ("train", "eval"):
        labels = record["by_label"].get(rule) or {}
        if labels:
            lines += ["", f"`{rule}` by method label:", ""]
            lines.append(table(["label", "jobs", "total s", "mean s", "max s", "max RSS MB"],
                               [[k, v["jobs"], _fmt(v["total_s"], 0), _fmt(v["mean_s"]), _fmt(v["max_s"]),
                                 _fmt(v["max_rss_mb"], 0)] for k, v in labels.items()]))
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
