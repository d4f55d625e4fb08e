"""Seeds where a claim is still open: a group-sequential design over stages of seeds (``harness extend-seeds``).

The schedule: a first stage of S_1 seeds, then ``add`` seeds per stage up to S_max, K looks in all at information
fractions t_k = S_k / S_max (the variance of a paired difference falls as 1 / S when training noise dominates it).
Each claim's two one-sided tests (reproduce, contradict: ``verdicts.claim_pvalues``) spend their error over the
looks by the Lan-DeMets O'Brien-Fleming-type function alpha(t) = 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t))) (Lan &
DeMets 1983, Biometrika 70(3)): almost nothing early, nearly the whole alpha at the last look. The boundaries c_k solve
P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1}) for the cumulative z statistics
of a Brownian motion (corr(Z_i, Z_j) = sqrt(t_i / t_j)); a claim is decided at look k when a p-value falls below the
nominal level 1 - Phi(c_k). The family: every claim gets alpha / m (Bonferroni over the m judged claims), so the
family-wise error of the claims stays at alpha whichever claims stop early. Labels with an open claim (and the
baseline every claim compares with) get the next stage's seeds; decided ones stop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

from harness.report.verdicts import ALPHA_ONE_SIDED, NOT_JUDGED, Verdict


def stage_seeds(first: int, add: int, maximum: int) -> list[int]:
    """Seeds after each stage: first, first + add, ... capped at maximum (the last stage reaches it)."""
    if not 2 <= first <= maximum or add < 1:
        raise ValueError(f"extend-seeds: need 2 <= first ({first}) <= max ({maximum}) and add ({add}) >= 1")
    stages = list(range(first, maximum, add))
    return stages + [maximum]


def obrien_fleming_spent(fraction: float, alpha: float) -> float:
    """The one-sided error spent by information fraction t: 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t)))."""
    return 2 * scipy_stats.norm.sf(scipy_stats.norm.isf(alpha / 2) / math.sqrt(fraction))


def boundaries(fractions: Sequence[float], alpha: float) -> list[float]:
    """The z boundaries c_1..c_K of the looks at ``fractions`` (increasing, the last 1) for one-sided ``alpha``."""
    fractions = list(fractions)
    found: list[float] = []
    for k, t in enumerate(fractions):
        target = obrien_fleming_spent(t, alpha) - (obrien_fleming_spent(fractions[k - 1], alpha) if k else 0.0)
        corr = np.sqrt(np.minimum.outer(fractions[:k + 1], fractions[:k + 1])
                       / np.maximum.outer(fractions[:k + 1], fractions[:k + 1]))
        def crossing(c, k=k, corr=corr, target=target):
            if k == 0:
                return scipy_stats.norm.sf(c) - target
            below = scipy_stats.multivariate_normal(np.zeros(k), corr[:k, :k]).cdf(np.array(found))
            below_all = scipy_stats.multivariate_normal(np.zeros(k + 1), corr).cdf(np.array([*found, c]))
            return (below - below_all) - target
        found.append(float(optimize.brentq(crossing, 0.0, 10.0, xtol=1e-6)))
    return found


def nominal_levels(fractions: Sequence[float], alpha: float) -> list[float]:
    """The one-sided p-value each look calls a test at: 1 - Phi(c_k)."""
    return [float(scipy_stats.norm.sf(c)) for c in boundaries(fractions, alpha)]


@dataclass(frozen=True)
class Look:
    """One look of the schedule: the claims decided at it and the labels that get the next stage's seeds."""

    n_seeds: int
    next_seeds: int | None  # None: the last look
    level: float  # the nominal one-sided level of this look, per test
    decided: list[Verdict]
    open_labels: list[str]  # methods of the open claims, and their baselines


def look(verdicts: Sequence[Verdict], n_seeds: int, schedule: Sequence[int],
         alpha: float = 2 * ALPHA_ONE_SIDED) -> Look:
    """The decisions at ``n_seeds`` (one of ``schedule``): each judged claim's two one-sided p-values against this
    look's nominal level at alpha / 2 / m (one-sided per test, Bonferroni over the m judged claims)."""
    if n_seeds not in schedule:
        raise ValueError(f"extend-seeds: the sweep has {n_seeds} seeds, not a stage of the schedule {list(schedule)}")
    judged = [v for v in verdicts if v.interval is not None and v.verdict != NOT_JUDGED]
    if not judged:
        raise ValueError("extend-seeds: no judged claim (a claim needs 2 or more seeds and scores at the full budget)")
    k = list(schedule).index(n_seeds)
    level = nominal_levels([s / schedule[-1] for s in schedule], alpha / 2 / len(judged))[k]
    decided = [v for v in judged if min(v.p_reproduce, v.p_contradict) < level]
    open_claims = [v for v in judged if v not in decided]
    last = k == len(schedule) - 1
    labels = [] if last else sorted({lab for v in open_claims for lab in (v.claim.method, v.claim.baseline)})
    return Look(n_seeds, None if last else schedule[k + 1], level, decided, labels)

