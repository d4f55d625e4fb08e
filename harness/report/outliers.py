"""Outlying runs: a seed of a label far below that label's other seeds (a collapsed or diverged training run), by a
robust rule on the labels x seeds table of benchmark-averaged seed means. Pure functions over numpy arrays; no I/O.
The rule and its measured flag rates: docs/statistics.md ('Outlying runs').

For run (l, s) with benchmark-averaged accuracy R_ls, its gap g_ls = R_ls - median_{s' != s} R_ls' (its label's other
seeds; with 2 seeds, the other one). The scale is the sweep's own: 1.4826 x the median |g| over every run (a MAD,
robust to the few runs it looks for), never below ``floor``, the sd a gap has from the seed x problem residual alone
(sqrt(2 r), r the labels' mean row residual, ``training_noise.row_residual``; per-seed accuracies alone do not show
it) nor below ``ABSOLUTE_FLOOR``. A run is flagged when g_ls < -``OUTLIER_K`` x scale: low side only (a collapse), and
with 2 seeds the lower of a label's two. Under normal training noise the rule flags some run of an 8 x 2 sweep about
3% of the time (1-2% at 3-10 seeds); a flagged run is a question to its logs, not a verdict.

A variance rule covers a rare collapse badly whatever it pools (the coverage study's collapse cells): its truth is an
average over collapses that most few-seed sweeps never see. So the report shows each Δ with and without the flagged
runs, and collapse-prone training needs more seeds, not a narrower interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from harness.report.training_noise import row_residual

OUTLIER_K = 4.0  # a run this many robust scales below its label's other seeds is flagged
MAD_SCALE = 1.4826  # the MAD's factor to a normal sd
ABSOLUTE_FLOOR = 0.005  # half a point of accuracy: the scale never goes below it
COLLAPSE_ADVICE = ("collapse-prone training needs more seeds (and the flagged runs investigated), not a narrower "
                   "interval: no variance rule covers a collapse that few seeds rarely show")


@dataclass(frozen=True)
class OutlyingRun:
    """A flagged run: its label and seed, its benchmark-averaged accuracy, the median of its label's other seeds, and
    the rule's scale and threshold (all accuracy fractions)."""

    label: str
    seed: int
    score: float
    others: float
    scale: float
    threshold: float

    @property
    def gap(self) -> float:
        return self.score - self.others

    def describe(self) -> str:
        return (f"`{self.label}` seed {self.seed}: {100 * self.score:.1f} on the mean over benchmarks, "
                f"{100 * -self.gap:.1f} pts below its label's other seed(s) ({100 * self.others:.1f}); flagged below "
                f"{OUTLIER_K:g} x {100 * self.scale:.2f} = {100 * self.threshold:.1f} pts")


def seed_gaps(table: np.ndarray) -> np.ndarray:
    """g (L, S): each run's benchmark-averaged accuracy less the median of its label's other seeds (S >= 2)."""
    n_seeds = table.shape[1]
    return np.stack([table[:, s] - np.median(np.delete(table, s, axis=1), axis=1) for s in range(n_seeds)], axis=1)


def rule_scale(gaps: np.ndarray, floor: float = 0.0) -> float:
    """The rule's scale: the MAD-based sd of every run's gap, never below ``floor`` or ``ABSOLUTE_FLOOR``."""
    return max(MAD_SCALE * float(np.median(np.abs(gaps))), floor, ABSOLUTE_FLOOR)


def outlying_runs(table: np.ndarray, labels: Sequence[str], seeds: Sequence[int], floor: float = 0.0,
                  k: float = OUTLIER_K) -> list[OutlyingRun]:
    """The runs of the labels x seeds table (L, S) of benchmark-averaged accuracies the rule flags (module
    docstring); none with fewer than 2 seeds."""
    if table.shape[1] < 2:
        return []
    gaps = seed_gaps(table)
    scale = rule_scale(gaps, floor)
    return [OutlyingRun(labels[i], int(seeds[j]), float(table[i, j]), float(table[i, j] - gaps[i, j]), scale,
                        k * scale)
            for i, j in zip(*np.nonzero(gaps < -k * scale), strict=True)]


def scores_table(scores: Mapping[str, Mapping[str, np.ndarray]]) -> tuple[list[str], np.ndarray, float]:
    """From {label: {bench: (S, P_b)}}: the labels, their (L, S) table of benchmark-averaged seed means and the
    residual floor of a gap, sqrt(2 r) with r the labels' mean row residual (0 with one seed or one problem)."""
    labels = list(scores)
    benches = sorted(scores[labels[0]])
    table = np.mean([np.stack([scores[lab][b].mean(axis=1) for lab in labels]) for b in benches], axis=0)
    residual = float(np.mean([row_residual(scores[lab]) for lab in labels]))
    return labels, table, math.sqrt(2 * max(0.0, residual))
