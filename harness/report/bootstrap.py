"""Statistics for the leaderboard: intervals over seeds and problems, paired differences to the baseline,
probability of improvement, and aggregates over benchmarks. Pure functions over numpy arrays; no I/O.

Data. For one method, checkpoint and benchmark the evidence is a matrix ``scores`` (S, P): S seeds (the unit of
replication: one trained model each) by P problems (the unit of evaluation), each cell the mean correctness of the
k sampled completions of that problem (avg@k of one problem). Every method of a sweep shares the seeds' indices
(the sweep's seed list) and the benchmark's problems, so two methods' matrices are paired cell by cell.

Means and paired differences: a t interval on the crossed seed x problem variance (``crossed_variance``). The
cells follow the two-way random-effects model x_sp = mu + a_s + b_p + e_sp (seeds and problems crossed, not
nested), so the grand mean has variance sigma_a^2 / S + sigma_b^2 / P + sigma_e^2 / (S P). From the mean squares
(ANOVA; Searle, Casella & McCulloch 1992, "Variance Components", ch. 4)

    MS_seed = P var(row means)  (S - 1 df),   E = P sigma_a^2 + sigma_e^2
    MS_problem = S var(column means)  (P - 1 df),   E = S sigma_b^2 + sigma_e^2
    MS_resid = residual mean square  ((S - 1)(P - 1) df),   E = sigma_e^2

its unbiased estimate is (MS_seed + MS_problem - MS_resid) / (S P) = seed part + problem part, with

    seed part = MS_seed / (S P) = var(row means) / S,  estimating sigma_a^2 / S + sigma_e^2 / (S P), S - 1 df,
    problem part = max(0, MS_problem - MS_resid) / (S P)  (a variance component is not negative), about P - 1 df,
    residual part = MS_resid / (S P),  estimating sigma_e^2 / (S P), (S - 1)(P - 1) df.

The residual part is in the seed part's expectation: the rows' spread holds the seed x problem residual as well as
training randomness, so t_{S-1} sqrt(seed part) is the exact seed-level t interval whatever the split. But with
S = 2 it rests on one degree of freedom: when two seeds' means agree by chance the seed part falls far below the
residual part it contains, and the interval collapsed to the problem part (the committed example's ktae vs
uniform: -0.9 [-1.4, -0.3] where the residual part alone gives +-1.7). So the interval is the wider of

    seed level:  sqrt((t_{S-1, 0.975} sqrt(seed part))^2 + (t_{P-1, 0.975} sqrt(problem part))^2)
    floor:       sqrt((t_{(S-1)(P-1), 0.975} sqrt(residual part))^2 + (t_{P-1, 0.975} sqrt(problem part))^2),

the floor being the interval that would be right if training added nothing, estimated from (S - 1)(P - 1) degrees
of freedom; ``CrossedVariance.half_width``. It changes only the intervals narrower than the floor (the seed part
below (t_{(S-1)(P-1)} / t_{S-1})^2 residual parts: 12% of 2-seed sweeps without training randomness), and can only
widen them. ``bench/interval_coverage.py`` (2000 simulated sweeps per cell, a model fitted to results/example, S = 2,
3, 5, seed spread 0, 1/3, 1 and 3x the example's) chose it over two rules that would re-estimate the seed part:

- the split rule (the seed excess max(0, seed - residual part) at t_{S-1}, the residual part at t_{(S-1)(P-1)}, in
  quadrature) and the standard estimator with Satterthwaite's degrees of freedom, floored at the residual part, both
  cover 0.97-0.98 without training randomness but down to 0.87 at S = 2 and 0.92 at S = 3 with the example's spread
  or 3x it (arith and the mean): moving the residual onto a large-df quantile whenever the seeds happen to agree
  undercovers whenever training randomness is real;
- the floor on the seed part with t_{S-1} on it (tried before) covered 0.997 at 2 seeds.

The interval here covers 0.950-0.992 with the example's spread or 3x it and 0.975-0.996 when the seeds add little
or nothing (0.996 at 2 seeds: the price of never collapsing; the seed-level interval alone was nominal there on
average, 0.95-0.97, but covered 0.61-0.72 of the collapsed 2-seed sweeps, now 0.94-0.97). When the seed part dominates
(training randomness larger than the problem sampling of a difference) the interval is the seed-level t interval;
when the problem part dominates, the normal interval over problems. A single Satterthwaite degrees of freedom for
seed part + problem part was tried first and undercovered (0.91 on the mean at 2 seeds, 300 simulated sweeps): when
the seed part is underestimated by chance, the pooled degrees of freedom grow and the quantile shrinks at the same
time. With 2 seeds t_{1, 0.975} = 12.7, so the interval is honest about what two seeds can show. Over benchmarks
(each weighted 1/M, seeds shared) the rows are the benchmark-averaged per-seed scores, each benchmark adds its own
problem and residual terms (w^2 each), and the degrees of freedom are the smallest benchmark's. With one seed the
seed part cannot be estimated and the interval covers problem sampling only (the documented limit below).

What remains (README, "Known limit"): a floor cannot tell chance agreement from small training randomness. When
the seeds agree by chance and training randomness is in fact large, the floor is still too narrow: at the
example's seed spread the collapsed 2-seed sweeps of the mean are covered 0.76-0.85 (0.51-0.53 before), at 3x it
0.40 (0.18). A 2-seed verdict whose interval is the floor is a candidate for more seeds; the reports mark every
such interval (``CrossedVariance.rests_on_floor``: ‡ in the tables, ``ci_at_floor`` in leaderboard.csv).

Why not the percentile bootstrap any more. The earlier intervals were percentile intervals of a crossed
("pigeonhole", McCullagh 2000) bootstrap with Rao & Wu (1988) rescaled weights. With 2 to 5 seeds its tails are
normal-like where the seed part needs Student tails with S - 1 degrees of freedom, so its coverage depends on how
large the seed spread is against the problem sampling. ``bench/interval_coverage.py`` measured its paired-difference
coverage at 0.956 to 0.998 with the default sweep's seed spread but 0.81 / 0.86 / 0.91 on arith at S = 2 / 3 / 5
with 3x that spread, where the t intervals cover 0.95 to 0.96 (README, "Intervals, verdicts and power").

The bootstrap remains for the rank-based statistics, which have no variance formula: the IQM over benchmarks and
the probability of improvement P(X > Y). A replicate draws S seed indices with replacement (shared by all
benchmarks: one seed is one model evaluated on every benchmark) and, for each benchmark separately (the strata),
P_b problem indices with replacement; as weights, with c_i the number of times unit i of n was drawn,

    w_i = 1/n + sqrt(n / (n - 1)) * (c_i / n - 1/n)        (n > 1; w_i = 1 when n = 1)

(Rao & Wu 1988, JASA 83(401)); the rank-based statistics use the plain counts (``seed_indices``). Their intervals
are percentile intervals (rliable's default) and, with 2-3 seeds, narrower than they should be for the reason
above: read them as descriptive; verdicts never use them.

Known limits, measured in tests/test_stats.py: with one seed, the seed-to-seed variance is invisible (the interval
covers problem sampling only); with 2 seeds that agree by chance, the floor above.

rliable (Agarwal et al. 2021, arXiv:2108.13264) is not a dependency: its stratified bootstrap resamples runs within
tasks only, not the problems inside a benchmark. The formulas taken from it (IQM, probability of improvement,
percentile intervals) are a few lines of numpy each, written out below; the probability of improvement is checked
against scipy's Mann-Whitney U in tests/test_stats.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
IQM_TRIM = 0.25  # interquartile mean: drop the lowest and the highest 25% (rliable)
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


# --- per-problem scores -------------------------------------------------------------------------------------------


def per_problem_scores(samples: Iterable[Mapping], mode: str = "sampled") -> dict[str, float]:
    """Rows of ``samples.jsonl`` -> {problem id: mean correctness of its ``mode`` samples}.

    Problems with an ungradable sample are left out, as ``harness.evaluation.driver.summarize`` leaves them out of
    avg@k.
    """
    correct: dict[str, list[bool]] = {}
    ungradable: set[str] = set()
    for row in samples:
        if row["mode"] != mode:
            continue
        pid = str(row["id"])
        correct.setdefault(pid, []).append(bool(row["correct"]))
        if not row.get("gradable", True):
            ungradable.add(pid)
    return {pid: sum(c) / len(c) for pid, c in correct.items() if pid not in ungradable}


def score_matrix(per_seed: Sequence[Mapping[str, float]], problem_ids: Sequence[str]) -> np.ndarray:
    """Per-seed {problem id: score} -> (S, P) in ``problem_ids`` order; a missing problem raises."""
    matrix = np.empty((len(per_seed), len(problem_ids)))
    for i, scores in enumerate(per_seed):
        missing = [pid for pid in problem_ids if pid not in scores]
        if missing:
            raise ValueError(f"seed index {i}: no score for problem(s) {missing[:5]} (of {len(missing)})")
        matrix[i] = [scores[pid] for pid in problem_ids]
    return matrix


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


# --- one benchmark ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrossedVariance:
    """The parts of the variance of a (benchmark-averaged) grand mean over a seed x problem design.

    ``seed``: var_s(R_s) / S = MS_seed / (S P), the spread of the seeds' (benchmark-averaged) rows, with ``seed_df``
    = S - 1 (0 and nan with one seed); ``problem``: sum_b w^2 max(0, MS_problem_b - MS_resid_b) / (S P_b), the
    sampling of the problems, with ``problem_df`` = min_b P_b - 1 (with one seed: sum_b w^2 var(column means) /
    P_b); ``residual``: sum_b w^2 MS_resid_b / (S P_b), the seed x problem part that the seed part holds in
    expectation, with ``residual_df`` = min_b (S - 1)(P_b - 1) (0 and nan with one seed).
    """

    seed: float
    seed_df: float
    problem: float
    problem_df: float
    residual: float = 0.0
    residual_df: float = math.nan

    @property
    def total(self) -> float:
        """The variance the interval stands on: the seed part, never below the residual part, plus the problem
        part."""
        return max(self.seed, self.residual) + self.problem

    def _terms(self, one_sided_level: float) -> tuple[float, float, float]:
        """The squared half-width terms t^2 * part of the problem, seed and residual parts at this level."""
        def term(variance: float, df: float) -> float:
            return scipy_stats.t.ppf(1 - one_sided_level, df) ** 2 * variance if variance > 0 else 0.0

        return (term(self.problem, self.problem_df), term(self.seed, self.seed_df),
                term(self.residual, self.residual_df))

    def half_width(self, one_sided_level: float) -> float:
        """The wider of the seed-level half-width sqrt((t_{S-1} sqrt(seed))^2 + (t_{P-1} sqrt(problem))^2) and the
        residual floor sqrt((t_{(S-1)(P-1)} sqrt(residual))^2 + (t_{P-1} sqrt(problem))^2) (module docstring)."""
        problem, seed, residual = self._terms(one_sided_level)
        return math.sqrt(problem + max(seed, residual))

    @property
    def rests_on_floor(self) -> bool:
        """Whether the 95% (``CONFIDENCE``) interval is the residual floor: the residual term t_{(S-1)(P-1)}^2
        residual exceeds the seed term t_{S-1}^2 seed, i.e. the seeds agreed more closely than their seed x problem
        residual implies. Such an interval is too narrow if training randomness is in fact large (module docstring,
        "What remains"), so the reports mark it. Never with one seed (no residual part)."""
        _, seed, residual = self._terms((1 - CONFIDENCE) / 2)
        return bool(residual > seed)  # a Python bool: it goes into leaderboard.json


def crossed_variance(scores: Mapping[str, np.ndarray]) -> CrossedVariance:
    """The seed, problem and residual parts of the variance of the benchmark-averaged grand mean of ``scores``
    {bench: (S, P_b)} (module docstring). Each benchmark weighs 1/M; the seeds (rows) are shared by the benchmarks.

    seed = var_s(R_s) / S,   R_s = sum_b w mean_p x_b[s, p]
    problem = sum_b w^2 max(0, MS_problem_b - MS_resid_b) / (S P_b)
    residual = sum_b w^2 MS_resid_b / (S P_b)
    """
    benches = sorted(scores)
    w = 1.0 / len(benches)
    n_seeds = scores[benches[0]].shape[0]
    seed, seed_df = 0.0, math.nan
    if n_seeds > 1:
        rows = np.mean([scores[b].mean(axis=1) for b in benches], axis=0)  # (S,) benchmark-averaged seed scores
        seed, seed_df = float(rows.var(ddof=1)) / n_seeds, n_seeds - 1
    problem, residual, residual_dfs = 0.0, 0.0, []
    for bench in benches:
        x = scores[bench]
        assert x.shape[0] == n_seeds, (bench, x.shape, n_seeds)
        n_problems = x.shape[1]
        if n_problems < 2:
            continue
        columns = x.mean(axis=0)
        if n_seeds == 1:  # no seed part: the column variance is the problem sampling of the one model
            problem += w**2 * float(columns.var(ddof=1)) / n_problems
            continue
        ms_problem = n_seeds * float(columns.var(ddof=1))
        cells = x - x.mean(axis=1, keepdims=True) - columns + x.mean()
        df = (n_seeds - 1) * (n_problems - 1)
        ms_resid = float((cells**2).sum()) / df
        problem += w**2 * max(0.0, ms_problem - ms_resid) / (n_seeds * n_problems)
        residual += w**2 * ms_resid / (n_seeds * n_problems)
        residual_dfs.append(df)
    problem_df = max(1, min(scores[b].shape[1] for b in benches) - 1)
    return CrossedVariance(seed, seed_df, problem, problem_df, residual, min(residual_dfs, default=math.nan))


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


def paired_difference(scores: np.ndarray, baseline: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """mean(scores) - mean(baseline) over the same seed indices and problems, with its paired interval.

    Seed index i of both matrices is the sweep's i-th seed (same data order and initial randomness unless a
    label sets ``seed_offset``); the interval is the crossed t interval of the cell-wise difference
    D = X - X_baseline, so what the two share (problem difficulty, a seed's data order) cancels.
    """
    if scores.shape != baseline.shape:
        raise ValueError(f"paired_difference: shapes differ, {scores.shape} vs baseline {baseline.shape}; "
                         "both need the same seeds and problems")
    return mean_interval(scores - baseline, confidence, DIFFERENCE_RANGE)


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


def verdict(difference: Interval) -> str:
    """'better' / 'worse' when the difference interval excludes zero; 'tied' when it covers zero."""
    if difference.low > 0:
        return "better"
    if difference.high < 0:
        return "worse"
    return "tied"


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


def aggregate_difference(scores: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                         confidence: float = CONFIDENCE) -> Interval:
    """Paired difference of the benchmark-averaged means (each benchmark weighted equally), crossed t interval."""
    differences = {b: scores[b] - baseline[b] for b in sorted(scores)}
    estimate = float(np.mean([d.mean() for d in differences.values()]))
    return t_interval(estimate, crossed_variance(differences), confidence, DIFFERENCE_RANGE)


def aggregate_improvement(scores: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                          plan: BootstrapPlan, confidence: float = CONFIDENCE) -> Interval:
    """rliable's P(X > Y) over tasks: the mean over benchmarks of the per-benchmark probability of improvement."""
    benches = sorted(scores)
    estimate = np.mean([improvement_probability(scores[b].mean(axis=1), baseline[b].mean(axis=1)) for b in benches])
    replicates = np.mean([improvement_replicates(scores[b], baseline[b], plan, b) for b in benches], axis=0)
    return percentile_interval(float(estimate), replicates, confidence)


# --- ranking ------------------------------------------------------------------------------------------------------


def separation_ranks(labels: Sequence[str], differences: Mapping[tuple[str, str], Interval]) -> dict[str, int]:
    """Rank = 1 + the number of methods whose paired difference against this one is significantly positive.

    ``differences[(a, b)]`` is mean(a) - mean(b). Methods no other method separates from share rank 1; equal ranks
    mean "not separated by the intervals" (ties need not be transitive: A may beat C while both tie with B).
    """
    return {b: 1 + sum(verdict(differences[(a, b)]) == "better" for a in labels if a != b) for b in labels}
