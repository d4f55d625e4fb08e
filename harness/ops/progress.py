"""``harness progress``: where each training job of a sweep stands, read from its run folder while Snakemake runs.

A job is ``done`` when its run.json exists, ``running`` while its progress.json (harness/train/progress.py,
rewritten after every optimizer step) is fresh, ``stalled`` when that file has not changed for ``STALE_AFTER_S``
(a killed job, or one step that takes longer), and ``pending`` before its first step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.config.paths import SweepPaths
from harness.config.schema import Resolved
from harness.train.progress import PROGRESS_FILE

STALE_AFTER_S = 600.0


def job_progress(run_dir: Path, now: float) -> dict:
    """One run folder's state, with the last progress record when there is one."""
    progress_file = run_dir / PROGRESS_FILE
    progress = json.loads(progress_file.read_text()) if progress_file.is_file() else None
    if (run_dir / "run.json").is_file():
        state = "done"
    elif progress is None:
        state = "pending"
    else:
        state = "stalled" if now - progress["updated_unix"] > STALE_AFTER_S else "running"
    return {"state": state, "progress": progress}


def sweep_progress(resolved: Resolved, paths: SweepPaths) -> list[dict]:
    """Every (label, seed) of the sweep, in the sweep's order."""
    now = time.time()
    return [{"label": label, "seed": seed, **job_progress(paths.run_dir(label, seed), now)}
            for label in resolved.sweep.methods for seed in resolved.sweep.seeds]


def format_progress(jobs: list[dict]) -> str:
    """A table of the jobs and a count per state."""
    lines = [f"{'label':<16} {'seed':>4}  {'state':<8} {'budget':>7} {'step':>6} {'elapsed':>8} {'ETA':>8}"]
    for job in jobs:
        p = job["progress"]
        if p is None:
            numbers = ("", "", "", "")
        else:
            eta = "" if job["state"] == "done" or p["eta_s"] is None else f"{p['eta_s']:.0f} s"
            numbers = (f"{100 * p['fraction']:.1f}%", str(p["step"]), f"{p['elapsed_s']:.0f} s", eta)
        lines.append(f"{job['label']:<16} {job['seed']:>4}  {job['state']:<8} {numbers[0]:>7} {numbers[1]:>6} "
                     f"{numbers[2]:>8} {numbers[3]:>8}")
    counts = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    lines.append(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return "\n".join(lines)
