"""Per-rule breakdown of a finished sweep from Snakemake's benchmark files.

Every rule of the Snakefile that does real work writes a benchmark TSV (``benchmark:`` directive): warmstart.tsv,
train/<label>_seed<N>.tsv, eval/<label>_seed<N>_<ckpt>[_<bench>].tsv, with the columns s (wall seconds), h:m:s,
max_rss, max_vms, max_uss, max_pss (MB), io_in, io_out, mean_load, cpu_time. The rule is the sub-folder (or the file
name at the top level). The sweep's own wall time is Snakemake's "Elapsed time" line in its log.

Start-up: every ``harness`` subcommand prints one ``startup:`` line to its job log when its real work starts
(harness/cli.py ``mark_startup``): CPU seconds of the process so far (interpreter start, imports, configuration)
and wall seconds since the process started. The job log is ``logs/<same relative name>.log`` next to the
benchmarks folder (logs/train/uniform_seed0.log for benchmarks/train/uniform_seed0.tsv); data and report have
logs but no benchmark file, so they count for start-up only. Sweeps from before the startup line show blanks.

Output: per rule jobs, total / mean / max seconds, CPU seconds, start-up CPU and wall seconds, max RSS; per method
label for train and eval; the sum of job seconds against the elapsed time (how well the 2 cores were kept busy).

Usage:  python -m bench.sweep_breakdown [--benchmarks results/default/benchmarks] [--log SNAKEMAKE_LOG]
        [--logs <benchmarks>/../logs] [--results DIR]
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import re
import statistics
import sys
from pathlib import Path

from bench.machine import environment
from bench.publish import add_path_args, publish, table
from harness.config.paths import REPO_ROOT

DEFAULT_BENCHMARKS = REPO_ROOT / "results" / "default" / "benchmarks"  # the default sweep's Snakemake benchmark files


def newest_snakemake_log(root: Path = REPO_ROOT) -> Path | None:
    """The newest ``.snakemake/log/*.snakemake.log`` under ``root`` (Snakemake writes one per invocation)."""
    logs = sorted((root / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def _float(value: str | None) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


STARTUP_LINE = re.compile(r"^startup: command=(\S+) cpu_s=(\S+) wall_s=(\S+) torch_threads=(\S+)", flags=re.M)


def read_startup(log: Path) -> dict:
    """The first ``startup:`` line of a job log (a distributed train job has one per process); {} without one."""
    if not log.is_file():
        return {}
    match = STARTUP_LINE.search(log.read_text(errors="replace"))
    if not match:
        return {}
    threads = match.group(4)
    return {"startup_cpu_s": _float(match.group(2)), "startup_wall_s": _float(match.group(3)),
            "torch_threads": int(threads) if threads.isdigit() else None}


def _rule_of(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def read_benchmarks(folder: Path, logs: Path | None = None) -> list[dict]:
    """One job per benchmark row, with the start-up of its log; then the logs without a benchmark file."""
    jobs, seen_logs = [], set()
    for path in sorted(folder.rglob("*.tsv")):
        rel = path.relative_to(folder)
        rule = _rule_of(rel)
        log = logs / rel.with_suffix(".log") if logs else None
        startup = read_startup(log) if log else {}
        if log:
            seen_logs.add(log)
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        for i, row in enumerate(rows):  # one row per repeat of the benchmark directive (1 by default)
            job = {"rule": rule, "file": str(rel), "repeat": i, "label": _label(rule, path.stem),
                   "s": _float(row.get("s")), "cpu_time": _float(row.get("cpu_time")),
                   "max_rss_mb": _float(row.get("max_rss")), "max_uss_mb": _float(row.get("max_uss")),
                   "mean_load": _float(row.get("mean_load")), **_no_startup(), **startup}
            jobs.append(job)
    if logs and logs.is_dir():
        for log in sorted(logs.rglob("*.log")):
            rel = log.relative_to(logs)
            startup = read_startup(log)
            if log in seen_logs or not startup:
                continue
            rule = _rule_of(rel)
            jobs.append({"rule": rule, "file": str(rel), "repeat": 0, "label": _label(rule, log.stem), "s": None,
                         "cpu_time": None, "max_rss_mb": None, "max_uss_mb": None, "mean_load": None,
                         **startup})
    return jobs


def _no_startup() -> dict:
    return {"startup_cpu_s": None, "startup_wall_s": None, "torch_threads": None}


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
    out["seconds_by_running_jobs"] = running_jobs_timeline(text)
    return out


def running_jobs_timeline(text: str) -> dict[int, int]:
    """{number of jobs running: seconds} over the log (its timestamps have 1 s resolution): with 2 cores, the
    seconds at 1 are a core left idle (the warm start, or one long job running alone at the end)."""
    started, spans, stamp, rule = {}, [], None, None
    for line in text.splitlines():
        if match := re.match(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line):
            stamp = datetime.datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif match := re.match(r"^(?:local)?rule (\w+):", line):
            rule = match.group(1)
        elif (match := re.match(r"^\s+jobid: (\d+)", line)) and rule is not None:
            started[match.group(1)] = stamp
            rule = None
        elif (match := re.match(r"^Finished jobid: (\d+)", line)) and match.group(1) in started:
            spans.append((started.pop(match.group(1)), stamp))
    if not spans:
        return {}
    origin = min(start for start, _ in spans)
    running = [0] * int((max(end for _, end in spans) - origin).total_seconds())
    for start, end in spans:
        for second in range(int((start - origin).total_seconds()), int((end - origin).total_seconds())):
            running[second] += 1
    return dict(sorted(collections.Counter(running).items()))


def group(jobs: list[dict], key: str) -> dict[str, dict]:
    out = {}
    for name in sorted({j[key] for j in jobs if j[key] is not None}):
        every = [j for j in jobs if j[key] == name]
        sel = [j for j in every if j["s"] is not None]
        secs = [j["s"] for j in sel]
        cpu = [j["cpu_time"] for j in sel if j["cpu_time"] is not None]
        rss = [j["max_rss_mb"] for j in sel if j["max_rss_mb"] is not None]
        start_cpu = [j["startup_cpu_s"] for j in every if j.get("startup_cpu_s") is not None]
        start_wall = [j["startup_wall_s"] for j in every if j.get("startup_wall_s") is not None]
        threads = sorted({j["torch_threads"] for j in every if j.get("torch_threads") is not None})
        out[name] = {"jobs": max(len(sel), len(every) if not sel else 0),
                     "total_s": sum(secs), "mean_s": statistics.mean(secs) if secs else None,
                     "max_s": max(secs) if secs else None, "cpu_s": sum(cpu) if cpu else None,
                     "max_rss_mb": max(rss) if rss else None,
                     "startup_jobs": len(start_cpu), "startup_cpu_s": sum(start_cpu) if start_cpu else None,
                     "startup_wall_s": sum(start_wall) if start_wall else None, "torch_threads": threads}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", type=Path, default=DEFAULT_BENCHMARKS,
                        help="the sweep's Snakemake benchmark folder (default: %(default)s)")
    parser.add_argument("--log", type=Path, default=None,
                        help="the sweep's Snakemake log (default: the newest .snakemake/log/*.snakemake.log)")
    parser.add_argument("--logs", type=Path, help="the sweep's job logs (default: logs/ next to --benchmarks)")
    parser.add_argument("--name", default="sweep_breakdown")
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    if not args.benchmarks.is_dir():
        parser.error(f"--benchmarks {args.benchmarks}: no such folder (run a sweep first, or name its benchmarks)")
    args.log = args.log or newest_snakemake_log()
    logs = args.logs or args.benchmarks.parent / "logs"
    jobs = read_benchmarks(args.benchmarks, logs)
    log = read_log(args.log) if args.log is not None else {"log": None, "exists": False}
    rules = group(jobs, "rule")
    by_label = {rule: group([j for j in jobs if j["rule"] == rule], "label") for rule in ("train", "eval")}
    job_seconds = sum(j["s"] for j in jobs if j["s"] is not None)
    startup_cpu = [j["startup_cpu_s"] for j in jobs if j.get("startup_cpu_s") is not None]
    startup_wall = [j["startup_wall_s"] for j in jobs if j.get("startup_wall_s") is not None]
    record = {"benchmark": "sweep_breakdown",
              "settings": {"benchmarks": str(args.benchmarks), "log": str(args.log) if args.log else None,
                           "logs": str(logs)},
              "environment": environment(args.cpu_free_flag), "log": log, "rules": rules, "by_label": by_label,
              "job_seconds_total": job_seconds, "startup_jobs": len(startup_cpu),
              "startup_cpu_s_total": sum(startup_cpu) if startup_cpu else None,
              "startup_wall_s_total": sum(startup_wall) if startup_wall else None,
              "parallelism": job_seconds / log["elapsed_s"] if log.get("elapsed_s") else None, "jobs": jobs}
    return publish(args.results, args.name, record, summary_markdown(record))


def _fmt(x, digits=1):
    return "" if x is None else f"{x:.{digits}f}"


def _occupancy(seconds_by_running_jobs: dict | None) -> str:
    if not seconds_by_running_jobs:
        return ""
    parts = [f"{n} job{'s' if int(n) != 1 else ''}: {t} s" for n, t in seconds_by_running_jobs.items()]
    return " Seconds with this many jobs running (from the log's timestamps): " + ", ".join(parts) + "."


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
             + (f" = {record['parallelism']:.2f} x the elapsed time (2 cores)." if record["parallelism"] else ".")
             + _occupancy(log.get("seconds_by_running_jobs")),
             ""]
    if record.get("startup_jobs"):
        lines += [f"Start-up (process start to the job's first real work: interpreter, imports, configuration; the "
                  f"`startup:` line of each job log): {record['startup_jobs']} jobs, "
                  f"{record['startup_cpu_s_total']:.0f} CPU s, {record['startup_wall_s_total']:.0f} wall s"
                  + (f" = {100 * record['startup_wall_s_total'] / record['job_seconds_total']:.0f}% of the job "
                     "seconds." if record["job_seconds_total"] else "."), ""]
    rows = [[rule, r["jobs"], _fmt(r["total_s"], 0), _fmt(r["mean_s"]), _fmt(r["max_s"]), _fmt(r["cpu_s"], 0),
             _fmt(r["startup_cpu_s"], 0), _fmt(r["startup_wall_s"], 0),
             ",".join(str(t) for t in r["torch_threads"]), _fmt(r["max_rss_mb"], 0),
             f"{100 * r['total_s'] / record['job_seconds_total']:.0f}%" if record["job_seconds_total"] else ""]
            for rule, r in record["rules"].items()]
    lines.append(table(["rule", "jobs", "total s", "mean s", "max s", "CPU s", "start-up CPU s", "start-up wall s",
                        "torch threads", "max RSS MB", "share"], rows))
    for rule in ("train", "eval"):
        labels = record["by_label"].get(rule) or {}
        if labels:
            lines += ["", f"`{rule}` by method label:", ""]
            lines.append(table(["label", "jobs", "total s", "mean s", "max s", "start-up wall s", "max RSS MB"],
                               [[k, v["jobs"], _fmt(v["total_s"], 0), _fmt(v["mean_s"]), _fmt(v["max_s"]),
                                 _fmt(v["startup_wall_s"], 0), _fmt(v["max_rss_mb"], 0)]
                                for k, v in labels.items()]))
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
