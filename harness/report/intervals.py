"""t intervals over the crossed seed x problem design (``harness.report.scores``): means, paired differences to the
baseline (their seed part pooled by ``harness.report.training_noise``), their p-values, Holm's correction, the
verdicts and the ranks. Pure functions over numpy arrays; no I/O. Measurements of these rules: docs/statistics.md.

Better / worse and ranks: a difference's two-sided p (``two_sided_p``, from the same t parts as its interval),
Holm-adjusted over the comparisons of one table (``holm_verdicts``; Holm 1979 holds under any dependence, and the
comparisons share the baseline and the seeds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from harness.report.scores import CONFIDENCE, CrossedVariance, crossed_variance
from harness.report.training_noise import TrainingNoise, pooled_variance

SCORE_RANGE = (0.0, 1.0)  # per-problem scores are fractions of correct samples
DIFFERENCE_RANGE = (-1.0, 1.0)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its (low, high) interval; for the t intervals also the variance parts behind it (so
    a verdict can be tested at another level: ``p_value``, Holm)."""

    estimate: float
    low: float
    high: float
    variance: CrossedVariance | None = None  # the t intervals' parts (p_value, Holm); None for percentile ones

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def rests_on_floor(self) -> bool:
        """A t interval at the residual floor (``CrossedVariance.rests_on_floor``); a percentile one never is."""
        return self.variance is not None and self.variance.rests_on_floor


# --- means and paired differences ---------------------------------------------------------------------------------


def t_interval(estimate: float, variance: CrossedVariance, confidence: float = CONFIDENCE,
               bounds: tuple[float, float] | None = None) -> Interval:
    """estimate +- ``variance.half_width((1 - c) / 2)``, clipped to ``bounds``; the parts stay on the Interval."""
    half = variance.half_width((1 - confidence) / 2)
    low, high = estimate - half, estimate + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Interval(float(estimate), float(low), float(high), variance)


def mean_interval(scores: np.ndarray, confidence: float = CONFIDENCE,
                  bounds: tuple[float, float] = SCORE_RANGE) -> Interval:
    """Mean of (S, P) scores with its crossed-variance t interval (analytic: no resampling)."""
    return t_interval(float(scores.mean()), crossed_variance({"b": scores}), confidence, bounds)


def paired_difference(scores: np.ndarray, baseline: np.ndarray, confidence: float = CONFIDENCE,
                      noise: TrainingNoise | None = None) -> Interval:
    """mean(scores) - mean(baseline) over the same seed indices and problems, with its paired interval.

    Seed index i of both matrices is the sweep's i-th seed (same data order and initial randomness unless a
    label sets ``seed_offset``); the interval is the crossed t interval of the cell-wise difference
    D = X - X_baseline, so what the two share (problem difficulty, a seed's data order) cancels. With ``noise``
    (the sweep's pooled training noise) its seed part is the pooled one (``pooled_variance``).
    """
    if scores.shape != baseline.shape:
        raise ValueError(f"paired_difference: shapes differ, {scores.shape} vs baseline {baseline.shape}; "
                         "both need the same seeds and problems")
    return difference_interval({"b": scores - baseline}, noise, confidence)


def difference_interval(differences: Mapping[str, np.ndarray], noise: TrainingNoise | None = None,
                        confidence: float = CONFIDENCE) -> Interval:
    """The benchmark-averaged mean of paired differences {bench: (S, P_b)} with its crossed t interval, the seed
    part pooled when ``noise`` is given (``pooled_variance``)."""
    estimate = float(np.mean([differences[b].mean() for b in sorted(differences)]))
    variance = pooled_variance(crossed_variance(differences), noise)
    return t_interval(estimate, variance, confidence, DIFFERENCE_RANGE)


def aggregate_difference(scores: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                         confidence: float = CONFIDENCE, noise: TrainingNoise | None = None) -> Interval:
    """Paired difference of the benchmark-averaged means (each benchmark weighted equally), crossed t interval."""
    return difference_interval({b: scores[b] - baseline[b] for b in sorted(scores)}, noise, confidence)


# --- p-values, Holm's correction, verdicts and ranks --------------------------------------------------------------


def p_value(difference: Interval, null: float = 0.0, alternative: str = "greater") -> float:
    """One-sided p of H0: delta <= null ('greater') or delta >= null ('less'): the level a at which the interval's
    one-sided half-width ``half_width(a)`` equals the distance of the estimate from ``null``. So p < 0.025 exactly
    when the 95% interval excludes ``null`` on that side (the verdicts and Holm's correction use it)."""
    distance = difference.estimate - null if alternative == "greater" else null - difference.estimate
    variance = difference.variance
    if variance is None or variance.total <= 0:  # no spread at all: the estimate is the truth on this evidence
        return 0.0 if distance > 0 else 1.0
    if distance == 0:
        return 0.5
    upper = _one_sided_level(variance, abs(distance))
    return upper if distance > 0 else 1.0 - upper


def _one_sided_level(variance: CrossedVariance, distance: float) -> float:
    """The a in (0, 0.5] with half_width(a) = distance > 0 (half_width falls from infinity at 0 to 0 at 0.5)."""
    tiny = 1e-12
    if variance.half_width(tiny) <= distance:
        return tiny
    return float(optimize.brentq(lambda a: variance.half_width(a) - distance, tiny, 0.5, xtol=1e-14))


def two_sided_p(difference: Interval) -> float:
    """Two-sided p of H0: no difference, from the interval's t parts (twice the smaller one-sided p)."""
    return min(1.0, 2 * min(p_value(difference, 0.0, "greater"), p_value(difference, 0.0, "less")))


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the input order: p_(i) -> max_{j <= i} min(1, (m - j + 1)
    p_(j)); valid under any dependence between the tests (they share the baseline and the seeds)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted.tolist()


def holm_verdicts(differences: Mapping[str, Interval], confidence: float = CONFIDENCE) -> dict[str, str]:
    """'better' / 'worse' / 'tied' per key, each difference's two-sided p Holm-adjusted over the table's family
    (all of ``differences``) and called at 1 - ``confidence``."""
    keys = list(differences)
    adjusted = holm_adjust([two_sided_p(differences[k]) for k in keys])
    return {k: ("tied" if p >= 1 - confidence else "better" if differences[k].estimate > 0 else "worse")
            for k, p in zip(keys, adjusted, strict=True)}


def verdict(difference: Interval) -> str:
    """'better' / 'worse' when the difference interval excludes zero; 'tied' when it covers zero."""
    if difference.low > 0:
        return "better"
    if difference.high < 0:
        return "worse"
    return "tied"


def separation_ranks(labels: Sequence[str], differences: Mapping[tuple[str, str], Interval]) -> dict[str, int]:
    """Rank = 1 + the number of methods whose paired difference against this one is significant, Holm-adjusted over
    the table's L (L - 1) / 2 pairs.

    ``differences[(a, b)]`` is mean(a) - mean(b) for every ordered pair. Methods no other method separates from share
    rank 1; equal ranks mean "not separated" (ties need not be transitive: A may beat C while both tie with B).
    """
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]
    called = holm_verdicts({pair: differences[pair] for pair in pairs}) if pairs else {}
    beaten_by = {label: 0 for label in labels}
    for (a, b), call in called.items():
        if call != "tied":
            beaten_by[b if call == "better" else a] += 1
    return {label: 1 + beaten_by[label] for label in labels}
