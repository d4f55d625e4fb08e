"""Where measurements go: ``<results>/<name>.json`` (raw data, settings, environment) and the script's own section
of ``<results>/summary.md`` (default results/bench), plus the command-line options every script shares."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from harness.config.paths import REPO_ROOT

DEFAULT_RESULTS = REPO_ROOT / "results" / "bench"
DEFAULT_WORKDIR = REPO_ROOT / "results" / "bench-work"  # cached data and warm starts (untracked, like results/*)
SUMMARY_HEADER = """# Benchmarks

Written by the `bench/` scripts and the `studies/` simulations (see `bench/README.md` for the method, targets and
findings); each script replaces only its own section. Ratios are medians of per-pair ratios of interleaved runs:
`median [interquartile range] (90% bootstrap interval of the median)`.
"""


def add_path_args(parser: argparse.ArgumentParser, workdir: bool = True) -> None:
    """--results and --cpu-free-flag, shared by every script; --workdir for those that train or sample."""
    if workdir:
        parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                            help="cached data, warm starts, sampled batches and trainer output (default: %(default)s)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help="where <name>.json and summary.md are written (default: %(default)s)")
    parser.add_argument("--cpu-free-flag", type=Path, default=None,
                        help="a file that exists while nothing else runs on the machine (recorded as cpu_free_flag; "
                             "without it the summaries give the load average)")


def write_result(results: Path, name: str, record: dict) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    record.setdefault("load_average_end", os.getloadavg())  # the machine is shared: how busy it was at the end
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def update_summary(results: Path, name: str, body: str) -> Path:
    """Replace the section between this script's markers in ``results``/summary.md (append it when new)."""
    results.mkdir(parents=True, exist_ok=True)
    summary = results / "summary.md"
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = summary.read_text() if summary.is_file() else SUMMARY_HEADER
    section = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    tmp = summary.with_suffix(".md.partial")
    tmp.write_text(text)
    tmp.replace(summary)
    return summary


def publish(results: Path, name: str, record: dict, markdown: str) -> dict:
    """Write ``record`` to ``results``/``name``.json, replace its summary section with ``markdown``, print it."""
    write_result(results, name, record)
    update_summary(results, name, markdown)
    print(markdown)
    return record


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(met: bool | None) -> str:
    """A target's verdict as the tables print it."""
    return "n/a" if met is None else ("met" if met else "not met")
