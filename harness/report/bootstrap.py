"""The bootstrap for the leaderboard's rank-based statistics: the stratified resample over seeds and problems,
percentile intervals, the probability of improvement and the aggregates over benchmarks. Pure functions over numpy
arrays; no I/O. Measurements of these rules: docs/statistics.md.

The bootstrap serves the rank-based statistics, which have no variance formula: the IQM over benchmarks and the
probability of improvement P(X > Y). A replicate draws S seed indices with replacement (shared by all benchmarks: one
seed is one model evaluated on every benchmark) and, for each benchmark separately (the strata), P_b problem indices
with replacement; as weights, with c_i the number of times unit i of n was drawn,

    w_i = 1/n + sqrt(n / (n - 1)) * (c_i / n - 1/n)        (n > 1; w_i = 1 when n = 1)

(Rao & Wu 1988, JASA 83(401)); the rank-based statistics use the plain counts (``seed_indices``). Their intervals
are percentile intervals (rliable's default); with 2-3 seeds their tails are normal-like where the seed part needs
Student tails, so they are narrower than they should be: read them as descriptive; verdicts never use them.

rliable (Agarwal et al. 2021, arXiv:2108.13264) is not a dependency: its stratified bootstrap resamples runs within
tasks only, not the problems inside a benchmark. The formulas taken from it (IQM, probability of improvement,
percentile intervals) are a few lines of numpy each, written out below; the probability of improvement is checked
against scipy's Mann-Whitney U in tests/test_stats.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from harness.report.intervals import SCORE_RANGE, Interval, t_interval
from harness.report.scores import CONFIDENCE, crossed_variance

N_RESAMPLES = 2000
IQM_TRIM = 0.25  # interquartile mean: drop the lowest and the highest 25% (rliable)


@dataclass(frozen=True)
class BootstrapPlan:
    """The resample weights shared by every method of a report (so comparisons are paired).

    ``seed_weights`` (B, S) and ``problem_weights[bench]`` (B, P_b): Rao-Wu rescaled weights; rows sum to 1.
    ``seed_indices`` (B, S): the drawn seed indices themselves, for the rank-based statistics.
    """

    seed_weights: np.ndarray
    problem_weights: Mapping[str, np.ndarray]
    seed_indices: np.ndarray

    @property
    def seed_counts(self) -> np.ndarray:
        """(B, S) plain resample weights c_s / S (non-negative), for P(X > Y)."""
        n = self.n_seeds
        offsets = n * np.arange(self.n_resamples)[:, None]
        counts = np.bincount((self.seed_indices + offsets).ravel(), minlength=self.n_resamples * n)
        return counts.reshape(self.n_resamples, n) / n

    @property
    def n_resamples(self) -> int:
        return self.seed_weights.shape[0]

    @property
    def n_seeds(self) -> int:
        return self.seed_weights.shape[1]


# --- resampling ---------------------------------------------------------------------------------------------------


def resample_counts(rng: np.random.Generator, n: int, n_resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_resamples`` draws of n indices with replacement from range(n): (indices (B, n), counts (B, n))."""
    indices = rng.integers(0, n, size=(n_resamples, n))
    offsets = n * np.arange(n_resamples)[:, None]  # one bincount for all rows: row b's bins are [b n, (b+1) n)
    counts = np.bincount((indices + offsets).ravel(), minlength=n_resamples * n).reshape(n_resamples, n)
    return indices, counts


def rescaled_weights(counts: np.ndarray) -> np.ndarray:
    """Rao & Wu (1988) weights 1/n + sqrt(n/(n-1)) (c/n - 1/n) from resample counts (B, n); c/n when n = 1."""
    n = counts.shape[-1]
    plain = counts / n
    if n == 1:
        return plain
    return 1 / n + np.sqrt(n / (n - 1)) * (plain - 1 / n)


def make_plan(n_seeds: int, n_problems: Mapping[str, int], n_resamples: int = N_RESAMPLES,
              seed: int = 0) -> BootstrapPlan:
    """Draw the stratified resample: seeds once (shared by benchmarks), problems within each benchmark."""
    if n_seeds < 1 or any(n < 1 for n in n_problems.values()):
        raise ValueError(f"make_plan needs at least one seed and one problem per benchmark, got n_seeds={n_seeds}, "
                         f"n_problems={dict(n_problems)}")
    rng = np.random.default_rng(seed)
    seed_indices, seed_counts = resample_counts(rng, n_seeds, n_resamples)
    problem_weights = {}
    for bench in sorted(n_problems):  # sorted: the draw must not depend on dict order
        _, counts = resample_counts(rng, n_problems[bench], n_resamples)
        problem_weights[bench] = rescaled_weights(counts)
    return BootstrapPlan(rescaled_weights(seed_counts), problem_weights, seed_indices)


def single_seed_plan(plan: BootstrapPlan) -> BootstrapPlan:
    """The same problem resamples for a one-seed row (the warm start): its seed weight is always 1."""
    ones = np.ones((plan.n_resamples, 1))
    return BootstrapPlan(ones, plan.problem_weights, np.zeros((plan.n_resamples, 1), dtype=int))


def percentile_bounds(replicates: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """The (1-c)/2 and (1+c)/2 quantiles of replicates (..., B) along the last axis."""
    alpha = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [alpha, 100 - alpha], axis=-1)
    return low, high


def percentile_interval(estimate: float, replicates: np.ndarray, confidence: float = CONFIDENCE,
                        bounds: tuple[float, float] | None = None) -> Interval:
    """Percentile interval around the plug-in estimate, clipped to ``bounds`` (the range the quantity can take)."""
    low, high = percentile_bounds(replicates, confidence)
    if bounds is not None:
        low, high = np.clip([low, high], *bounds)
    return Interval(float(estimate), float(low), float(high))


def bootstrap_means(scores: np.ndarray, seed_weights: np.ndarray, problem_weights: np.ndarray) -> np.ndarray:
    """Replicates of the grand mean of ``scores`` (..., S, P) -> (..., B); leading axes are independent data sets.

    mean_b = sum_s sum_p w_seed[b, s] X[s, p] w_problem[b, p]
    """
    assert scores.shape[-2:] == (seed_weights.shape[1], problem_weights.shape[1]), (
        scores.shape, seed_weights.shape, problem_weights.shape)
    per_seed = scores @ problem_weights.T  # (..., S, B): each seed's mean over the resampled problems
    return np.einsum("...sb,bs->...b", per_seed, seed_weights)


# --- probability of improvement -----------------------------------------------------------------------------------


def improvement_probability(x: np.ndarray, y: np.ndarray, x_weights: np.ndarray | None = None,
                            y_weights: np.ndarray | None = None) -> np.ndarray:
    """P(X > Y) between run scores x (..., N) and y (..., M): the Mann-Whitney statistic (rliable).

    P = sum_i sum_j wx_i wy_j S(x_i, y_j), S = 1 if x > y, 1/2 if equal, 0 otherwise; weights default to 1/N, 1/M.
    """
    versus = (x[..., :, None] > y[..., None, :]) + 0.5 * (x[..., :, None] == y[..., None, :])  # (..., N, M)
    if x_weights is None and y_weights is None:
        return versus.mean(axis=(-2, -1))
    x_weights = np.full(x.shape[-1], 1 / x.shape[-1]) if x_weights is None else x_weights
    y_weights = np.full(y.shape[-1], 1 / y.shape[-1]) if y_weights is None else y_weights
    return np.einsum("...ij,...i,...j->...", versus, x_weights, y_weights)


def improvement_replicates(scores: np.ndarray, baseline: np.ndarray, plan: BootstrapPlan, bench: str) -> np.ndarray:
    """Replicates (B,) of P(X > Y) over seeds: per-seed scores on the resampled problems, seeds resampled."""
    x = (scores @ plan.problem_weights[bench].T).T  # (B, S) per-seed means on the resampled problems
    y = (baseline @ plan.problem_weights[bench].T).T
    return improvement_probability(x, y, plan.seed_counts, plan.seed_counts)  # rank-based: plain counts


def improvement_interval(scores: np.ndarray, baseline: np.ndarray, plan: BootstrapPlan, bench: str,
                         confidence: float = CONFIDENCE) -> Interval:
    """P(X > Y): the probability that a seed of this method beats a seed of the baseline on this benchmark."""
    estimate = improvement_probability(scores.mean(axis=1), baseline.mean(axis=1))
    return percentile_interval(float(estimate), improvement_replicates(scores, baseline, plan, bench), confidence)


# --- over benchmarks (rliable's aggregates) -----------------------------------------------------------------------


def iqm(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean, 25% cut at each end), as rliable."""
    return scipy_stats.trim_mean(values, IQM_TRIM, axis=axis)


def aggregate_intervals(scores: Mapping[str, np.ndarray], plan: BootstrapPlan,
                        confidence: float = CONFIDENCE) -> dict[str, Interval]:
    """Over benchmarks: 'mean' = unweighted mean of the per-benchmark means (each benchmark counts once, whatever
    its size), with the crossed t interval; 'iqm' = IQM of the S x M per-seed, per-benchmark scores (rliable's
    run-by-task IQM), with the percentile bootstrap (seeds once for all benchmarks, problems within each).
    """
    benches = sorted(scores)
    point_means = np.array([scores[b].mean() for b in benches])
    per_seed = np.stack([scores[b].mean(axis=1) for b in benches], axis=-1)  # (S, M)
    per_seed_replicates = np.stack([(scores[b] @ plan.problem_weights[b].T).T for b in benches], axis=-1)  # (B,S,M)
    resampled = np.take_along_axis(per_seed_replicates, plan.seed_indices[:, :, None], axis=1)  # (B, S, M)
    iqm_replicates = iqm(resampled.reshape(plan.n_resamples, -1), axis=1)
    return {"mean": t_interval(float(point_means.mean()), crossed_variance(scores), confidence, SCORE_RANGE),
            "iqm": percentile_interval(float(iqm(per_seed.ravel())), iqm_replicates, confidence, SCORE_RANGE)}


def aggregate_improvement(scores: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                          plan: BootstrapPlan, confidence: float = CONFIDENCE) -> Interval:
    """rliable's P(X > Y) over tasks: the mean over benchmarks of the per-benchmark probability of improvement."""
    benches = sorted(scores)
    estimate = np.mean([improvement_probability(scores[b].mean(axis=1), baseline[b].mean(axis=1)) for b in benches])
    replicates = np.mean([improvement_replicates(scores[b], baseline[b], plan, b) for b in benches], axis=0)
    return percentile_interval(float(estimate), replicates, confidence)
