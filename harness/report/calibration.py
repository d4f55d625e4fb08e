"""The A/A calibration of a preset: the baseline alone trained with ``CALIBRATION_SEEDS`` seeds (``snakemake
calibrate``), whose training noise later reports of that preset pool with their own (docs/statistics.md).

``configs/calibration/<preset>.json`` (committed): the preset, the commit it ran at, the baseline label, seeds,
checkpoint, metric, the benchmarks with their problem counts, and per benchmark and for the mean over them the
training-noise variance of a paired difference (``training_noise.pooled_training_noise`` of the one label: twice the
seed variance beyond the seed x problem residual, accuracy fractions^2) with its degrees of freedom. Two labels that
share seed indices share some training randomness, so twice one label's variance is the conservative side.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.report.training_noise import CALIBRATED, TrainingNoise, pooled_training_noise

CALIBRATION_DIR = CONFIG_DIR / "calibration"
CALIBRATION_SEEDS = 8
MEAN = "mean"  # the scope of the unweighted mean over the calibration's benchmarks


def calibration_file(preset: str) -> Path:
    return CALIBRATION_DIR / f"{preset}.json"


@dataclass(frozen=True)
class Calibration:
    """A preset's A/A calibration as read back: per scope (a benchmark or MEAN) its training noise."""

    path: Path
    preset: str
    commit: str
    label: str
    n_seeds: int
    benches: dict[str, int]  # benchmark -> problems
    noise: dict[str, TrainingNoise]

    def noise_for(self, benches: Sequence[str]) -> TrainingNoise | None:
        """The calibration's noise for one benchmark, or for the mean over exactly its own benchmarks; else None."""
        if len(benches) == 1:
            return self.noise.get(benches[0])
        return self.noise[MEAN] if sorted(benches) == sorted(self.benches) else None

    def mismatch(self, n_problems: Mapping[str, int]) -> str:
        """Why this calibration does not fit a sweep scored on ``n_problems`` (benchmark -> problems); '' if it does.
        Training noise is a property of the preset's training on these benchmarks: other problems, other noise."""
        if dict(n_problems) != self.benches:
            return (f"{self.path.name} was measured on {self.benches}, this sweep is scored on {dict(n_problems)}: "
                    f"not used")
        return ""

    def describe(self) -> str:
        return (f"A/A calibration `{self.path.name}` ({self.label} alone, {self.n_seeds} seeds, commit "
                f"{self.commit[:10]})")


def calibration_summary(scores: dict[str, dict], preset: str, label: str, seeds: Sequence[int], ckpt: str,
                        metric: str) -> dict:
    """The calibration record from the baseline's {bench: (S, P)} matrices ``scores``."""
    benches = sorted(scores)
    noise = {b: pooled_training_noise({label: {b: scores[b]}}) for b in benches}
    noise[MEAN] = pooled_training_noise({label: scores})
    return {"preset": preset, "commit": current_commit(), "label": label, "seeds": list(seeds), "ckpt": ckpt,
            "metric": metric, "benches": {b: int(scores[b].shape[1]) for b in benches},
            "training_noise": {scope: {"variance": n.variance, "df": n.df} for scope, n in noise.items()}}


def current_commit() -> str:
    """HEAD of the checkout (``git rev-parse``), or 'unknown' outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_calibration(path: Path) -> Calibration | None:
    """The calibration at ``path``, or None when there is none; a malformed file raises naming the key."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    try:
        noise = {scope: TrainingNoise(float(n["variance"]), float(n["df"]), CALIBRATED)
                 for scope, n in raw["training_noise"].items()}
        return Calibration(path, raw["preset"], raw["commit"], raw["label"], len(raw["seeds"]),
                           {b: int(p) for b, p in raw["benches"].items()}, noise)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed calibration ({type(exc).__name__}: {exc}); rerun `snakemake calibrate`"
                         ) from exc


def sweep_noise(mats: Mapping[str, Mapping[str, np.ndarray]], calibration: Calibration | None = None
                ) -> dict[tuple[str, ...], TrainingNoise]:
    """The pooled training noise of a sweep's labels {label: {bench: (S, P_b)}} per scope: each benchmark alone and
    all of them (keys: sorted benchmark tuples), pooled with ``calibration`` where it covers the scope; empty with
    fewer than 2 labels or seeds (nothing to pool)."""
    labels = sorted(mats)
    benches = sorted(mats[labels[0]]) if labels else []
    if len(labels) < 2 or mats[labels[0]][benches[0]].shape[0] < 2:
        return {}
    noise = {}
    for scope in [(b,) for b in benches] + [tuple(benches)]:
        pooled = pooled_training_noise({lab: {b: mats[lab][b] for b in scope} for lab in labels})
        external = calibration.noise_for(scope) if calibration else None
        noise[scope] = pooled.combined(external) if external else pooled
    return noise
