"""``harness extend-seeds``: one look of the group-sequential schedule (harness/report/sequential.py) at a sweep's
claims, and the next stage's sweep file for the claims still open (docs/statistics.md, 'harness extend-seeds')."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import Resolved
from harness.report.calibration import calibration_file
from harness.report.evidence import read_sweep
from harness.report.leaderboard import with_calibration
from harness.report.reported import load_reported
from harness.report.sequential import Look, look, stage_seeds
from harness.report.summary import claim_verdicts


@dataclass
class NextStage:
    """``harness extend-seeds``'s look at a sweep and the next stage: ``schedule`` the seeds of every stage,
    ``sweep`` the next stage's sweep file (None: the last look, or every claim decided)."""

    schedule: list[int]
    look: Look
    sweep: dict | None


def next_stage(resolved: Resolved, paths: SweepPaths, sweep_file: Path, first: int, add: int,
               max_seeds: int) -> NextStage:
    """Look at the claims of the sweep's finished seeds (``look``) and, while claims are open and stages are left,
    the next stage's sweep: ``sweep_file`` as written, its labels narrowed to those of open claims and its seeds
    extended (the runs it shares keep their paths)."""
    evidence = with_calibration(read_sweep(resolved, paths), calibration_file(resolved.preset.name))
    reported = load_reported(CONFIG_DIR / "reported" / f"{resolved.sweep.name}.yaml")
    schedule = stage_seeds(first, add, max_seeds)
    result = look(claim_verdicts(evidence, reported), len(evidence.seeds), schedule)
    if result.next_seeds is None or not result.open_labels:
        return NextStage(schedule, result, None)
    methods = [label for label in resolved.sweep.methods if label in result.open_labels]
    sweep = {**yaml.safe_load(Path(sweep_file).read_text(encoding="utf-8")), "methods": methods,
             "seeds": list(range(result.next_seeds))}
    return NextStage(schedule, result, sweep)
