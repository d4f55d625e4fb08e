"""harness.report.bootstrap: intervals on constructed data against hand and analytic values, paired differences,
probability
of improvement, IQM, ties and ranks, and the coverage of the intervals on simulated sweeps (the calibration)."""

import dataclasses

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.special import expit

from harness.report import bootstrap as stats


def plan_for(scores: dict[str, np.ndarray], n_resamples: int = 4000, seed: int = 0) -> stats.BootstrapPlan:
    n_seeds = next(iter(scores.values())).shape[0]
    return stats.make_plan(n_seeds, {b: x.shape[1] for b, x in scores.items()}, n_resamples, seed)


# --- per-problem scores -------------------------------------------------------------------------------------------


def test_per_problem_scores_average_the_samples_and_skip_ungradable_problems():
    rows = [{"id": "a", "mode": "sampled", "correct": True}, {"id": "a", "mode": "sampled", "correct": False},
            {"id": "b", "mode": "sampled", "correct": True}, {"id": "b", "mode": "sampled", "correct": True},
            {"id": "c", "mode": "sampled", "correct": True, "gradable": False},
            {"id": "c", "mode": "sampled", "correct": False},
            {"id": "a", "mode": "greedy", "correct": True}]
    assert stats.per_problem_scores(rows) == {"a": 0.5, "b": 1.0}
    assert stats.per_problem_scores(rows, "greedy") == {"a": 1.0}
    matrix = stats.score_matrix([{"a": 0.5, "b": 1.0}, {"b": 0.0, "a": 0.25}], ["a", "b"])
    np.testing.assert_array_equal(matrix, [[0.5, 1.0], [0.25, 0.0]])
    with pytest.raises(ValueError, match="no score for problem"):
        stats.score_matrix([{"a": 0.5}], ["a", "b"])


# --- the bootstrap ------------------------------------------------------------------------------------------------


def test_plan_weights_are_rao_wu_rescaled_resample_counts():
    plan = stats.make_plan(3, {"x": 5, "y": 2}, n_resamples=50, seed=1)
    assert plan.seed_weights.shape == (50, 3) and plan.problem_weights["x"].shape == (50, 5)
    np.testing.assert_allclose(plan.seed_weights.sum(axis=1), 1.0)
    np.testing.assert_allclose(plan.problem_weights["y"].sum(axis=1), 1.0)
    counts = np.stack([np.bincount(row, minlength=3) for row in plan.seed_indices])
    np.testing.assert_allclose(plan.seed_counts, counts / 3)
    np.testing.assert_allclose(plan.seed_weights, 1 / 3 + np.sqrt(3 / 2) * (counts / 3 - 1 / 3))
    # the rescaling makes the bootstrap variance of a mean the unbiased one, s^2 / n (plain: (n-1)/n of it)
    x = np.array([[0.0], [0.3], [1.0]])
    big = stats.make_plan(3, {"b": 1}, n_resamples=200_000, seed=2)
    replicates = stats.bootstrap_means(x, big.seed_weights, big.problem_weights["b"])
    assert replicates.var() == pytest.approx(x.var(ddof=1) / 3, rel=0.02)


def test_bootstrap_mean_equals_the_mean_of_the_resampled_matrix():
    rng = np.random.default_rng(0)
    x = rng.random((3, 7))
    indices, counts = stats.resample_counts(rng, 7, 1)
    plan = stats.make_plan(3, {"b": 7}, n_resamples=1, seed=5)
    seeds = plan.seed_indices[0]
    problem_counts = np.bincount(indices[0], minlength=7)
    problems = np.repeat(np.arange(7), problem_counts)
    expected = x[seeds][:, problems].mean()  # the plain bootstrap replicate: resampled rows and columns
    plain = stats.bootstrap_means(x, plan.seed_counts[:1], problem_counts[None] / 7)[0]
    assert plain == pytest.approx(expected)
    np.testing.assert_array_equal(counts[0], np.bincount(indices[0], minlength=7))


def test_hand_computed_intervals():
    # Problems only: two seeds with equal rows (0.5), columns 0.2, 0.5, 0.8. MS_problem = 2 var(0.2, 0.5, 0.8) =
    # 0.18, residuals +-0.1 and 0 -> MS_resid = 0.04 / 2 = 0.02 with (2-1)(3-1) = 2 df; problem part (0.18 - 0.02) /
    # (2 * 3) = 0.02667 with 2 df; seed part var(0.5, 0.5) / 2 = 0, below the residual part 0.02 / 6 = 0.00333 (2 df),
    # which takes its place. Half-width t_{2, 0.975} sqrt(0.02667 + 0.00333) = 4.303 * 0.1732 = 0.7453.
    x = np.array([[0.1, 0.5, 0.9], [0.3, 0.5, 0.7]])
    parts = stats.crossed_variance({"b": x})
    assert (parts.seed, parts.problem, parts.problem_df) == pytest.approx((0.0, 0.16 / 6, 2))
    assert (parts.residual, parts.residual_df) == pytest.approx((0.02 / 6, 2))
    difference = stats.paired_difference(x, np.full_like(x, 0.5))
    assert (difference.estimate, difference.low, difference.high) == pytest.approx((0.0, -0.7453, 0.7453), abs=1e-4)
    # Seeds only: rows 0.1, 0.2, 0.3 on two identical problems: seed part var / 3 = 0.01 / 3 with 2 df, no problem
    # part; t_{2, 0.975} sqrt(0.01 / 3) = 0.2484 around 0.2.
    seeds = np.array([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]])
    parts = stats.crossed_variance({"b": seeds})
    assert (parts.seed, parts.seed_df, parts.problem) == pytest.approx((0.01 / 3, 2, 0.0))
    interval = stats.paired_difference(seeds, np.zeros_like(seeds))  # a difference may be negative: not clipped
    assert (interval.low, interval.high) == pytest.approx((0.2 - 0.2484, 0.2 + 0.2484), abs=1e-4)
    assert stats.mean_interval(seeds).low == 0.0  # a mean is clipped to [0, 1]
    # Both parts: each with its own t quantile, added in quadrature; a residual part below the seed part is no floor.
    both = stats.CrossedVariance(0.01, 2, 0.0004, 99, 0.001, 198)
    expected = np.hypot(scipy_stats.t.ppf(0.975, 2) * 0.1, scipy_stats.t.ppf(0.975, 99) * 0.02)
    assert both.half_width(0.025) == pytest.approx(expected)
    # clipped to the range of a score; a constant matrix has a zero-width interval
    assert (stats.mean_interval(np.array([[0.0] * 5, [1.0] * 5])).low,
            stats.mean_interval(np.array([[0.0] * 5, [1.0] * 5])).high) == (0.0, 1.0)
    interval = stats.mean_interval(np.full((3, 4), 0.25))
    assert (interval.low, interval.high) == pytest.approx((0.25, 0.25))


def test_two_seeds_that_agree_do_not_collapse_the_interval():
    # Seeds 0.1 0.3 0.2 and 0.3 0.1 0.2: equal rows (0.2) and equal columns (0.2), so MS_seed = MS_problem = 0; the
    # residuals are +-0.1 and 0, MS_resid = 0.04 / ((2-1)(3-1)) = 0.02. The seed part var_s / S = 0 would make the
    # interval a point; its floor, the residual part 0.02 / (2 * 3) = 0.003333 with 2 df, gives the half-width
    # t_{2, 0.975} sqrt(0.003333) = 4.3027 * 0.057735 = 0.24842.
    x = np.array([[0.1, 0.3, 0.2], [0.3, 0.1, 0.2]])
    parts = stats.crossed_variance({"b": x})
    assert (parts.seed, parts.problem, parts.residual, parts.residual_df) == pytest.approx((0.0, 0.0, 0.02 / 6, 2))
    interval = stats.paired_difference(x, np.zeros_like(x))
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((0.2, 0.2 - 0.24842, 0.2 + 0.24842),
                                                                             abs=1e-5)
    # read backwards: 0 lies 0.2 = 3.4641 residual standard errors below the estimate, p = P(t_2 > 3.4641) = 0.0371
    assert stats.p_value(interval, 0.0) == pytest.approx(scipy_stats.t.sf(0.2 / np.sqrt(0.02 / 6), 2))
    assert stats.p_value(interval, 0.0) == pytest.approx(0.0371, abs=1e-4)
    # Seeds far apart (rows 0.8 and 0.2, the residuals +-0.05 and 0): the seed part var(0.8, 0.2) / 2 = 0.09 with
    # 1 df is above the floor 0.005 / 6, so the half-width is the seed-level t_{1, 0.975} * 0.3 = 3.8119.
    apart = stats.crossed_variance({"b": np.array([[0.8, 0.8, 0.8], [0.1, 0.3, 0.2]])})
    assert (apart.seed, apart.problem, apart.residual) == pytest.approx((0.09, 0.0, 0.005 / 6))
    assert apart.half_width(0.025) == pytest.approx(3.8119, abs=1e-4)
    # Over both benchmarks (weights 1/2): residual (0.02 / 6 + 0.02 / 6) / 4, df min(2, 2); the benchmark-averaged
    # rows (0.35, 0.35) agree, so the seed part is 0 and the floor holds.
    both = stats.crossed_variance({"a": x, "b": np.array([[0.1, 0.5, 0.9], [0.3, 0.5, 0.7]])})
    assert (both.seed, both.problem, both.residual, both.residual_df) == pytest.approx(
        (0.0, 0.16 / 6 / 4, 0.04 / 6 / 4, 2))
    assert both.half_width(0.025) == pytest.approx(scipy_stats.t.ppf(0.975, 2) * np.sqrt(0.2 / 6 / 4))


def test_an_interval_rests_on_the_floor_where_the_residual_term_exceeds_the_seed_term():
    # The agreeing table above (rows 0.2 and 0.2, columns 0.2, residuals +-0.1 and 0). Shifting the second row by c
    # leaves the residuals and the columns as they are and makes the seed part var(0.2, 0.2 + c) / 2 = c^2 / 4 with
    # 1 df. The floor's term is t_{2, 0.975}^2 * 0.02 / 6 = 18.513 * 0.0033333 = 0.061711; the seed term
    # t_{1, 0.975}^2 c^2 / 4 = 161.45 c^2 / 4 passes it at c = 2 sqrt(0.061711 / 161.45) = 0.0391.
    x = np.array([[0.1, 0.3, 0.2], [0.3, 0.1, 0.2]])
    near = stats.crossed_variance({"b": x + [[0.0], [0.02]]})  # seed part 0.0001 > 0, its term 0.016145: the floor
    assert (near.seed, near.residual) == pytest.approx((0.0001, 0.02 / 6))
    assert near.rests_on_floor and near.half_width(0.025) == pytest.approx(0.24842, abs=1e-5)
    far = stats.crossed_variance({"b": x + [[0.0], [0.06]]})  # seed part 0.0009, its term 0.14531: seed level
    assert far.seed == pytest.approx(0.0009)
    assert not far.rests_on_floor and far.half_width(0.025) == pytest.approx(12.7062 * 0.03, abs=1e-4)
    # the 2 x 3 tables above: equal rows (0.5, 0.5) with the problems apart rest on the floor, rows 0.8 and 0.2 not
    assert stats.crossed_variance({"b": np.array([[0.1, 0.5, 0.9], [0.3, 0.5, 0.7]])}).rests_on_floor
    assert not stats.crossed_variance({"b": np.array([[0.8, 0.8, 0.8], [0.1, 0.3, 0.2]])}).rests_on_floor
    # the Interval says what its parts say; one seed has no residual part, a percentile interval no floor
    assert stats.paired_difference(x, np.zeros_like(x)).rests_on_floor
    assert not stats.paired_difference(x + [[0.0], [0.06]], np.zeros_like(x)).rests_on_floor
    assert not stats.crossed_variance({"b": x[:1]}).rests_on_floor
    assert not stats.percentile_interval(0.5, np.linspace(0.0, 1.0, 101)).rests_on_floor


def test_aggregate_interval_shares_the_seeds_across_benchmarks():
    # Two benchmarks whose seed effects cancel: the benchmark-averaged rows are equal, so no seed part at all.
    a = np.array([[0.2, 0.2], [0.4, 0.4]])
    b = np.array([[0.4, 0.4], [0.2, 0.2]])
    parts = stats.crossed_variance({"a": a, "b": b})
    assert parts.seed == pytest.approx(0.0) and parts.problem == pytest.approx(0.0)
    # one benchmark alone has them: rows 0.2 and 0.4
    assert stats.crossed_variance({"a": a}).seed == pytest.approx(0.02 / 2)


def test_p_value_is_the_interval_read_backwards():
    rng = np.random.default_rng(9)
    x, y = rng.random((3, 40)), rng.random((3, 40))
    difference = stats.paired_difference(x + 0.05, y)
    assert stats.p_value(difference, difference.low, "greater") == pytest.approx(0.025, abs=1e-6)
    assert stats.p_value(difference, difference.high, "less") == pytest.approx(0.025, abs=1e-6)
    assert stats.p_value(difference, difference.estimate) == pytest.approx(0.5)
    upper = stats.p_value(difference, 0.0, "greater")
    assert stats.p_value(difference, 0.0, "less") == pytest.approx(1 - upper)
    exact = stats.paired_difference(x + 0.05, x)  # no spread: the estimate is certain
    assert stats.p_value(exact, 0.0) < 1e-9 and stats.p_value(exact, 0.1) > 1 - 1e-9


def test_one_seed_interval_matches_the_normal_approximation():
    # One seed, many problems: the interval of a mean is close to mean +- 1.96 s / sqrt(P).
    rng = np.random.default_rng(3)
    x = {"b": rng.binomial(4, 0.4, size=(1, 400)) / 4}
    interval = stats.mean_interval(x["b"])
    half = 1.96 * x["b"].std(ddof=1) / np.sqrt(400)
    assert interval.low == pytest.approx(x["b"].mean() - half, abs=0.1 * half)
    assert interval.high == pytest.approx(x["b"].mean() + half, abs=0.1 * half)


def test_bootstrap_intervals_are_deterministic_given_the_seed():
    rng = np.random.default_rng(0)
    x = {"b": rng.random((3, 20))}
    first = stats.aggregate_intervals(x, plan_for(x, seed=11))["iqm"]
    assert stats.aggregate_intervals(x, plan_for(x, seed=11))["iqm"] == first
    assert stats.aggregate_intervals(x, plan_for(x, seed=12))["iqm"] != first


# --- paired differences, probability of improvement, verdicts -----------------------------------------------------


def test_paired_difference_sign_and_verdict():
    rng = np.random.default_rng(1)
    baseline = rng.random((3, 30))
    better = stats.paired_difference(baseline + 0.1, baseline)
    assert better.estimate == pytest.approx(0.1) and better.low == pytest.approx(0.1)
    assert stats.verdict(better) == "better"
    assert stats.verdict(stats.paired_difference(baseline - 0.05, baseline)) == "worse"
    assert stats.verdict(stats.paired_difference(baseline, baseline)) == "tied"
    assert stats.verdict(stats.Interval(0.01, -0.01, 0.03)) == "tied"
    with pytest.raises(ValueError, match="shapes differ"):
        stats.paired_difference(baseline[:2], baseline)


def test_pairing_removes_the_shared_problem_difficulty():
    # Same problems, hard and easy ones: unpaired intervals overlap, the paired difference separates.
    rng = np.random.default_rng(2)
    difficulty = rng.random(60)
    baseline = np.clip(difficulty + rng.normal(0, 0.02, (3, 60)), 0, 1)
    method = np.clip(baseline + 0.03, 0, 1)
    a, b = stats.mean_interval(method), stats.mean_interval(baseline)
    assert a.low < b.high  # the intervals of the two means overlap
    assert stats.verdict(stats.paired_difference(method, baseline)) == "better"


def test_probability_of_improvement_known_cases_and_mann_whitney():
    assert stats.improvement_probability(np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.5])) == 1.0
    assert stats.improvement_probability(np.array([0.0, 0.5]), np.array([1.0, 2.0, 3.0])) == 0.0
    assert stats.improvement_probability(np.array([0.3, 0.3]), np.array([0.3])) == 0.5  # ties count half
    assert stats.improvement_probability(np.array([1.0, 2.0]), np.array([1.5])) == 0.5
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 5, 7).astype(float), rng.integers(0, 5, 5).astype(float)  # with ties
    u = scipy_stats.mannwhitneyu(x, y, alternative="greater").statistic
    assert stats.improvement_probability(x, y) == pytest.approx(u / (7 * 5))


def test_improvement_interval_for_clearly_separated_methods():
    rng = np.random.default_rng(5)
    baseline = rng.random((4, 40)) * 0.5
    plan = plan_for({"b": baseline})
    interval = stats.improvement_interval(baseline + 0.5, baseline, plan, "b")
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((1.0, 1.0, 1.0))
    same = stats.improvement_interval(baseline, baseline, plan, "b")
    assert same.estimate == 0.5 and same.covers(0.5)


# --- aggregates and ranks -----------------------------------------------------------------------------------------


def test_iqm_is_the_mean_of_the_middle_half():
    assert stats.iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm(np.array([1.0, 2.0, 3.0, 100.0])) == pytest.approx(2.5)  # the outlier is trimmed
    assert stats.iqm(np.array([[0.0, 0.0, 10.0, 10.0]] * 2), axis=1).tolist() == [5.0, 5.0]


def test_aggregate_weights_each_benchmark_once():
    scores = {"small": np.full((2, 4), 1.0), "large": np.full((2, 400), 0.0)}
    plan = plan_for(scores)
    aggregate = stats.aggregate_intervals(scores, plan)
    assert aggregate["mean"].estimate == pytest.approx(0.5)  # not 4/404
    assert aggregate["iqm"].estimate == pytest.approx(0.5)
    difference = stats.aggregate_difference({b: x + 0.1 for b, x in scores.items()}, scores)
    assert difference.estimate == pytest.approx(0.1) and stats.verdict(difference) == "better"
    improvement = stats.aggregate_improvement({"small": scores["small"] + 1, "large": scores["large"]}, scores, plan)
    assert improvement.estimate == pytest.approx(0.75)  # (1 + 0.5) / 2 over benchmarks


def test_ranks_only_where_intervals_separate():
    better, tied = stats.Interval(0.1, 0.05, 0.15), stats.Interval(0.01, -0.02, 0.04)

    def flip(i):
        return stats.Interval(-i.estimate, -i.high, -i.low)

    differences = {("a", "b"): tied, ("a", "c"): better, ("b", "c"): tied}
    differences.update({(y, x): flip(i) for (x, y), i in list(differences.items())})
    # a beats c; b is tied with both: a and b share rank 1, c is behind a only
    assert stats.separation_ranks(["a", "b", "c"], differences) == {"a": 1, "b": 1, "c": 2}


# --- coverage: the calibration of the interval machinery ----------------------------------------------------------


def true_mean(mu: float, sd: float) -> float:
    """E[sigmoid(mu + z)], z ~ N(0, sd^2), by Gauss-Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    return float(np.sum(weights * expit(mu + sd * nodes)) / np.sqrt(2 * np.pi))


def simulate(rng, n_draws: int, n_seeds: int, n_problems: int, k: int, mu: float, sd_problem: float,
             sd_seed: float, difficulty: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sweeps from a crossed random-effects model: P(correct) = sigmoid(mu + a_problem + b_seed); k samples each.

    Returns scores (n_draws, S, P) and the problem effects (so an A/A partner can share the problems)."""
    a = rng.normal(0.0, sd_problem, (n_draws, 1, n_problems)) if difficulty is None else difficulty
    b = rng.normal(0.0, sd_seed, (n_draws, n_seeds, 1))
    return rng.binomial(k, expit(mu + a + b)) / k, a


# One design: 5 seeds, 100 problems, k = 4 samples, accuracy near 45%, problem spread sd 1.5 and a seed (training
# randomness) spread sd 0.3 on the logit scale. 400 simulated sweeps, 1000 resamples each; one plan serves every
# draw (the resample indices do not depend on the data), so the whole check is a few matrix products.
N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED = 400, 5, 100, 4, -0.3, 1.5, 0.3


def covered(intervals, truth: float) -> float:
    return float(np.mean([i.covers(truth) for i in intervals]))


def test_mean_interval_covers_the_population_mean_at_nominal_rate():
    rng = np.random.default_rng(2024)
    scores, _ = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED)
    truth = true_mean(MU, np.hypot(SD_PROBLEM, SD_SEED))
    coverage = covered([stats.mean_interval(x) for x in scores], truth)
    assert 0.90 <= coverage <= 0.995, coverage


def test_aa_difference_is_tied_at_nominal_rate():
    # Two labels of the same method: same problems, independent seeds. The difference interval must cover 0.
    rng = np.random.default_rng(7)
    first, difficulty = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED)
    second, _ = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED, difficulty)
    tied = np.mean([stats.verdict(stats.paired_difference(a, b)) == "tied" for a, b in zip(first, second,
                                                                                         strict=True)])
    assert tied >= 0.93, tied


def test_one_seed_cannot_see_training_randomness():
    # The documented limit: with one seed per label the seed spread is invisible, so an A/A pair with a real
    # seed-to-seed spread is called different far more often than 5% of the time.
    rng = np.random.default_rng(8)
    first, difficulty = simulate(rng, N_DRAWS, 1, PROBLEMS, K, MU, SD_PROBLEM, 0.5)
    second, _ = simulate(rng, N_DRAWS, 1, PROBLEMS, K, MU, SD_PROBLEM, 0.5, difficulty)
    assert covered([stats.paired_difference(a, b) for a, b in zip(first, second, strict=True)], 0.0) < 0.8


def test_two_seeds_agreeing_by_chance_no_longer_collapse_the_interval():
    # An A/A pair without training randomness (seed sd 0): the seeds' means agree up to the seed x problem residual,
    # and with 2 seeds the seed part (1 df) falls below the residual part's t_{(S-1)(P-1)} half-width in ~12% of the
    # sweeps (chi2_1 < (1.97 / 12.7)^2 = 0.024). There the old seed-level interval covered ~70% (measured 0.68-0.71
    # on 3 generator seeds); the floor brings those sweeps back to ~95% (0.96-0.98), and the whole to 0.994-0.997
    # (the price of never collapsing, README 'Intervals, verdicts and power').
    rng = np.random.default_rng(11)
    first, difficulty = simulate(rng, 1000, 2, PROBLEMS, K, MU, SD_PROBLEM, 0.0)
    second, _ = simulate(rng, 1000, 2, PROBLEMS, K, MU, SD_PROBLEM, 0.0, difficulty)
    differences = [stats.paired_difference(a, b) for a, b in zip(first, second, strict=True)]
    seed_level = np.array([dataclasses.replace(d.variance, residual=0.0).half_width(0.025) for d in differences])
    floor = np.array([dataclasses.replace(d.variance, seed=0.0).half_width(0.025) for d in differences])
    estimates = np.array([d.estimate for d in differences])
    collapsed = seed_level < floor
    assert 0.07 <= collapsed.mean() <= 0.17, collapsed.mean()
    assert np.mean(np.abs(estimates[collapsed]) <= seed_level[collapsed]) < 0.8  # the old interval there
    assert np.all([d.high - d.low >= 2 * f - 1e-12 for d, f in zip(differences, floor, strict=True)])
    assert np.mean([d.covers(0.0) for d in np.array(differences)[collapsed]]) >= 0.9
    assert covered(differences, 0.0) <= 0.999


# --- robustness: verdicts on resampled seeds flip as often as the stated coverage allows ---------------------------

# A fixture population of 400 seeds per label of an A/A pair on 100 shared problems, with a seed spread that
# dominates the problem sampling (sd 0.6 on the logit scale, 3x the default sweep's: the regime where few seeds are
# hardest). Each replicate draws S seeds of each label without replacement and reruns the verdict; a verdict
# "flips" when the interval misses the population's own difference. At 95% coverage the flip rate is 5%: with 400
# replicates the test allows 5% + 3 standard errors (8.3%). Measured: 4.25% / 5.0% / 6.25% at S = 2 / 3 / 5 (the t
# interval without the residual floor: 4.5% / 5.0% / 6.25%; here the seed part is rarely below the floor); the
# earlier percentile bootstrap flips 23% / 12.5% / 9%.
POPULATION, REPLICATES, FLIP_TOLERANCE = 400, 400, 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400)


def seed_population(rng):
    first, difficulty = simulate(rng, 1, POPULATION, PROBLEMS, K, MU, SD_PROBLEM, 0.6)
    second, _ = simulate(rng, 1, POPULATION, PROBLEMS, K, MU, SD_PROBLEM, 0.6, difficulty)
    return first[0], second[0]


def resampled_pairs(rng, first, second, n_seeds):
    """(REPLICATES, S, P) matrices of both labels: each replicate draws S seeds of each without replacement."""
    pick = np.argsort(rng.random((2, REPLICATES, POPULATION)), axis=2)[:, :, :n_seeds]
    return first[pick[0]], second[pick[1]]


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_verdict_flip_rate_on_resampled_seeds_is_what_the_coverage_implies(n_seeds):
    rng = np.random.default_rng(16 + n_seeds)
    first, second = seed_population(rng)
    truth = first.mean() - second.mean()  # the population difference (not exactly 0: a finite population)
    a, b = resampled_pairs(rng, first, second, n_seeds)
    flips = 1 - covered([stats.paired_difference(x, y) for x, y in zip(a, b, strict=True)], truth)
    assert 0.005 <= flips <= FLIP_TOLERANCE, flips
    # the same check fails the earlier interval (percentile bootstrap over seeds and problems) at 2 and 3 seeds
    plan = stats.make_plan(n_seeds, {"b": PROBLEMS}, n_resamples=1000, seed=n_seeds)
    low, high = stats.percentile_bounds(stats.bootstrap_means(a - b, plan.seed_weights, plan.problem_weights["b"]))
    old_flips = 1 - np.mean((low <= truth) & (truth <= high))
    if n_seeds <= 3:
        assert old_flips > FLIP_TOLERANCE, old_flips
