"""The A/A calibration of a preset: the baseline alone trained with ``CALIBRATION_SEEDS`` seeds (``snakemake
calibrate``), whose training noise later reports of that preset pool with their own (docs/statistics.md).

``configs/calibration/<preset>.json`` (committed): the preset, the commit it ran at, the baseline label, seeds,
checkpoint, metric, the benchmarks with their problem counts, and per benchmark and for the mean over them the
training-noise variance of a paired difference (``training_noise.pooled_training_noise`` of the one label: twice the
seed variance beyond the seed x problem residual, accuracy fractions^2) with its degrees of freedom. Two labels that
share seed indices share some training randomness, so twice one label's variance is the conservative side.

A report pools a calibration into a scope only where the sweep's own pooled training noise is not significantly
larger (``check_calibration``: a one-sided F test of the sweep's variance over the calibration's on their degrees
of freedom at ``GUARD_LEVEL``; a calibration variance of 0 is refused against any sweep variance): a calibration
the sweep contradicts would narrow the intervals below what the sweep itself shows. ``Calibration.mean_warning``
flags a mean scope far below its benchmarks' (``MEAN_WARNING_RATIO``): only a negative correlation of the
benchmarks' seed effects gives that.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.report.training_noise import CALIBRATED, TrainingNoise, pooled_training_noise

CALIBRATION_DIR = CONFIG_DIR / "calibration"
CALIBRATION_SEEDS = 8
MEAN = "mean"  # the scope of the unweighted mean over the calibration's benchmarks
GUARD_LEVEL = 0.05  # the one-sided F test that refuses a calibration the sweep's own noise exceeds (module docstring)
# a mean scope whose noise is below this share of the benchmarks' average noise / M (what independent benchmarks give)
# needs an average correlation of the benchmarks' seed effects below -(1 - ratio) / (M - 1) (equal variances): -0.75
# for two benchmarks. Under independence a 7-df estimate falls below a quarter of its expectation with p = 0.03.
MEAN_WARNING_RATIO = 0.25


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

    def mean_warning(self) -> str:
        """Why the calibration's mean scope is implausibly small, or '' (module docstring, ``MEAN_WARNING_RATIO``):
        its noise against the average per-benchmark noise / M, and the average correlation of the benchmarks' seed
        effects that would give it (sum_b v_b + sum_{b != b'} rho sqrt(v_b v_b') = M^2 v_mean)."""
        per_bench = [self.noise[b].variance for b in sorted(self.benches) if b in self.noise]
        if MEAN not in self.noise or len(per_bench) < 2 or len(per_bench) != len(self.benches):
            return ""
        m, mean = len(per_bench), self.noise[MEAN].variance
        independent = float(np.mean(per_bench)) / m
        if not mean < MEAN_WARNING_RATIO * independent:
            return ""
        roots = np.sqrt(per_bench)
        cross = float(roots.sum() ** 2 - (roots**2).sum())
        rho = (m**2 * mean - sum(per_bench)) / cross if cross > 0 else float("nan")
        return (f"`{self.path.name}`'s training noise on the mean over benchmarks (sd {100 * mean**0.5:.2f} pts) is "
                f"{mean / independent:.2f} of what independent benchmarks give (the average per-benchmark variance / "
                f"{m}: sd {100 * independent**0.5:.2f} pts), below the {MEAN_WARNING_RATIO:g} that flags it: it needs "
                f"an average correlation {rho:+.2f} of its benchmarks' seed effects over {self.n_seeds} seeds, "
                f"implausible for training noise; rerun `snakemake calibrate` with more seeds before trusting it")


@dataclass(frozen=True)
class CalibrationCheck:
    """The guard on one scope (``check_calibration``): the sweep's pooled training noise against the calibration's,
    F = sweep / calibration on (sweep df, calibration df), one-sided p; pooled unless p < ``level``."""

    scope: tuple[str, ...]
    sweep: TrainingNoise
    calibration: TrainingNoise
    f: float
    p: float
    level: float = GUARD_LEVEL

    @property
    def pooled(self) -> bool:
        return not self.p < self.level

    def describe(self) -> str:
        """The test in words, e.g. for the report's note on a refused scope."""
        sd = f"sd {100 * self.sweep.variance**0.5:.2f} pts against {100 * self.calibration.variance**0.5:.2f}"
        f = "inf" if math.isinf(self.f) else f"{self.f:.1f}"
        return (f"the sweep's own pooled training noise ({sd}) gives F = {f} on ({self.sweep.df:g}, "
                f"{self.calibration.df:g}) df, one-sided p = {self.p:.2g}"
                + (f" < {self.level:g}: refused" if not self.pooled else f" >= {self.level:g}: pooled"))


def check_calibration(scope: tuple[str, ...], sweep: TrainingNoise, calibration: TrainingNoise,
                      level: float = GUARD_LEVEL) -> CalibrationCheck:
    """The one-sided F test of H0: the sweep's training noise is no larger than the calibration's (module docstring).
    A calibration variance of 0 against a sweep variance > 0 is refused (F infinite, p 0); both 0 agree (p 1)."""
    if calibration.variance > 0:
        f = sweep.variance / calibration.variance
        p = float(scipy_stats.f.sf(f, sweep.df, calibration.df))
    else:
        f, p = (math.inf, 0.0) if sweep.variance > 0 else (math.nan, 1.0)
    return CalibrationCheck(scope, sweep, calibration, f, p, level)


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
    all of them (keys: sorted benchmark tuples), pooled with ``calibration`` where it covers the scope and the guard
    lets it (``calibration_checks``); empty with fewer than 2 labels or seeds (nothing to pool)."""
    return sweep_noise_checked(mats, calibration)[0]


def sweep_noise_checked(mats: Mapping[str, Mapping[str, np.ndarray]], calibration: Calibration | None = None
                        ) -> tuple[dict[tuple[str, ...], TrainingNoise], dict[tuple[str, ...], CalibrationCheck]]:
    """``sweep_noise`` and, per scope the calibration covers, its guard (``check_calibration``)."""
    labels = sorted(mats)
    benches = sorted(mats[labels[0]]) if labels else []
    if len(labels) < 2 or mats[labels[0]][benches[0]].shape[0] < 2:
        return {}, {}
    noise, checks = {}, {}
    for scope in [(b,) for b in benches] + [tuple(benches)]:
        pooled = pooled_training_noise({lab: {b: mats[lab][b] for b in scope} for lab in labels})
        external = calibration.noise_for(scope) if calibration else None
        if external:
            checks[scope] = check_calibration(scope, pooled, external)
        noise[scope] = pooled.combined(external) if external and checks[scope].pooled else pooled
    return noise, checks
