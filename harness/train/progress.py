"""Budget progress of a training job while it runs: ``progress.json`` in the run's folder, rewritten after every
optimizer step (what ``harness progress`` reads), and one line in the job's log at a steady interval:

    budget 37.5% (5.25e+11/1.4e+12 flops), step 42, elapsed 41 s, ETA 68 s

The ETA extrapolates the spend rate of this process (a resumed job counts from where it resumed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harness.config.paths import staging_file

PROGRESS_FILE = "progress.json"
PROGRESS_EVERY_S = 30.0  # seconds between two log lines of a job


def eta_seconds(spent_now: float, spent_at_start: float, amount: float, elapsed_s: float) -> float | None:
    """Seconds until ``amount`` is spent at the rate since this process started; None before any rate is known."""
    rate = (spent_now - spent_at_start) / elapsed_s if elapsed_s > 0 else 0.0
    return max(0.0, (amount - spent_now) / rate) if rate > 0 else None


def progress_line(progress: dict) -> str:
    eta = progress["eta_s"]
    return (f"budget {100 * progress['fraction']:.1f}% ({progress['spent']:.3g}/{progress['amount']:.3g} "
            f"{progress['kind']}), step {progress['step']}, elapsed {progress['elapsed_s']:.0f} s, "
            f"ETA {'unknown' if eta is None else f'{eta:.0f} s'}")


class ProgressLog:
    """Writes ``run_dir/progress.json`` at every ``update`` and a ``progress_line`` to ``stream`` (default stderr:
    the job's log) at the first update and then every ``every_s`` seconds."""

    def __init__(self, run_dir: Path, kind: str, amount: float, spent_at_start: float,
                 every_s: float = PROGRESS_EVERY_S, stream=None):
        self.path = Path(run_dir) / PROGRESS_FILE
        self.kind, self.amount, self.spent_at_start = kind, amount, spent_at_start
        self.every_s = every_s
        self.stream = stream
        self.started = time.monotonic()
        self.last_line: float | None = None

    def update(self, step: int, spent: float) -> dict:
        now = time.monotonic()
        elapsed = now - self.started
        progress = {"kind": self.kind, "amount": self.amount, "spent": spent,
                    "fraction": min(1.0, spent / self.amount) if self.amount > 0 else 1.0, "step": step,
                    "elapsed_s": elapsed, "eta_s": eta_seconds(spent, self.spent_at_start, self.amount, elapsed),
                    "updated_unix": time.time(), "pid": os.getpid()}
        staging = staging_file(self.path)
        staging.write_text(json.dumps(progress))
        os.replace(staging, self.path)  # a reader never sees half a file
        if self.last_line is None or now - self.last_line >= self.every_s:
            print(progress_line(progress), file=self.stream or sys.stderr, flush=True)
            self.last_line = now
        return progress
