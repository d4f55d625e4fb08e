"""harness.report.bootstrap: intervals on constructed data against hand and analytic values, paired differences,
probability
of improvement, IQM, ties and ranks, and the coverage of the intervals on simulated sweeps (the calibration)."""

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
    # Two problems scored 0.4 and 0.6 (one seed): a replicate draws (2, 0), (1, 1) or (0, 2) with probability
    # 1/4, 1/2, 1/4; the rescaled weight of the first is 1/2 + sqrt(2) (c/2 - 1/2), so the replicate mean is
    # 0.5 -+ 0.1 sqrt(2) or 0.5, and the 95% percentile interval is [0.5 - 0.1414, 0.5 + 0.1414].
    problems = {"b": np.array([[0.4, 0.6]])}
    interval = stats.mean_interval(problems["b"], plan_for(problems), "b")
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((0.5, 0.5 - 0.1 * 2**0.5,
                                                                              0.5 + 0.1 * 2**0.5))
    # The same with two seeds scoring 0 and 1 on every problem: -0.207 and 1.207, clipped to [0, 1].
    seeds = {"b": np.array([[0.0] * 5, [1.0] * 5])}
    interval = stats.mean_interval(seeds["b"], plan_for(seeds), "b")
    assert (interval.estimate, interval.low, interval.high) == (0.5, 0.0, 1.0)
    constant = {"b": np.full((3, 4), 0.25)}
    interval = stats.mean_interval(constant["b"], plan_for(constant), "b")
    assert (interval.low, interval.high) == pytest.approx((0.25, 0.25))


def test_one_seed_interval_matches_the_normal_approximation():
    # One seed, many problems: the bootstrap of a mean is close to mean +- 1.96 s / sqrt(P).
    rng = np.random.default_rng(3)
    x = {"b": rng.binomial(4, 0.4, size=(1, 400)) / 4}
    interval = stats.mean_interval(x["b"], plan_for(x, n_resamples=8000), "b")
    half = 1.96 * x["b"].std(ddof=1) / np.sqrt(400)
    assert interval.low == pytest.approx(x["b"].mean() - half, abs=0.1 * half)
    assert interval.high == pytest.approx(x["b"].mean() + half, abs=0.1 * half)


def test_intervals_are_deterministic_given_the_seed():
    rng = np.random.default_rng(0)
    x = {"b": rng.random((3, 20))}
    first = stats.mean_interval(x["b"], plan_for(x, seed=11), "b")
    assert stats.mean_interval(x["b"], plan_for(x, seed=11), "b") == first
    assert stats.mean_interval(x["b"], plan_for(x, seed=12), "b") != first


# --- paired differences, probability of improvement, verdicts -----------------------------------------------------


def test_paired_difference_sign_and_verdict():
    rng = np.random.default_rng(1)
    baseline = rng.random((3, 30))
    plan = plan_for({"b": baseline})
    better = stats.paired_difference(baseline + 0.1, baseline, plan, "b")
    assert better.estimate == pytest.approx(0.1) and better.low == pytest.approx(0.1)
    assert stats.verdict(better) == "better"
    assert stats.verdict(stats.paired_difference(baseline - 0.05, baseline, plan, "b")) == "worse"
    assert stats.verdict(stats.paired_difference(baseline, baseline, plan, "b")) == "tied"
    assert stats.verdict(stats.Interval(0.01, -0.01, 0.03)) == "tied"
    with pytest.raises(ValueError, match="shapes differ"):
        stats.paired_difference(baseline[:2], baseline, plan, "b")


def test_pairing_removes_the_shared_problem_difficulty():
    # Same problems, hard and easy ones: unpaired intervals overlap, the paired difference separates.
    rng = np.random.default_rng(2)
    difficulty = rng.random(60)
    baseline = np.clip(difficulty + rng.normal(0, 0.02, (3, 60)), 0, 1)
    method = np.clip(baseline + 0.03, 0, 1)
    plan = plan_for({"b": baseline})
    a, b = stats.mean_interval(method, plan, "b"), stats.mean_interval(baseline, plan, "b")
    assert a.low < b.high  # the intervals of the two means overlap
    assert stats.verdict(stats.paired_difference(method, baseline, plan, "b")) == "better"


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
    difference = stats.aggregate_difference({b: x + 0.1 for b, x in scores.items()}, scores, plan)
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


def test_mean_interval_covers_the_population_mean_at_nominal_rate():
    rng = np.random.default_rng(2024)
    scores, _ = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED)
    truth = true_mean(MU, np.hypot(SD_PROBLEM, SD_SEED))
    plan = stats.make_plan(SEEDS, {"b": PROBLEMS}, n_resamples=1000, seed=0)
    low, high = stats.percentile_bounds(stats.bootstrap_means(scores, plan.seed_weights, plan.problem_weights["b"]))
    coverage = np.mean((low <= truth) & (truth <= high))
    assert 0.90 <= coverage <= 0.995, coverage
    # the vectorised path is the one the report uses, draw by draw
    single = stats.mean_interval(scores[0], plan, "b")
    assert (single.low, single.high) == pytest.approx((low[0], high[0]))


def test_aa_difference_is_tied_at_nominal_rate():
    # Two labels of the same method: same problems, independent seeds. The difference interval must cover 0.
    rng = np.random.default_rng(7)
    first, difficulty = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED)
    second, _ = simulate(rng, N_DRAWS, SEEDS, PROBLEMS, K, MU, SD_PROBLEM, SD_SEED, difficulty)
    plan = stats.make_plan(SEEDS, {"b": PROBLEMS}, n_resamples=1000, seed=1)
    low, high = stats.percentile_bounds(stats.bootstrap_means(first - second, plan.seed_weights,
                                                              plan.problem_weights["b"]))
    tied = np.mean((low <= 0) & (0 <= high))
    assert tied >= 0.90, tied


def test_one_seed_cannot_see_training_randomness():
    # The documented limit: with one seed per label the seed spread is invisible, so an A/A pair with a real
    # seed-to-seed spread is called different far more often than 5% of the time.
    rng = np.random.default_rng(8)
    first, difficulty = simulate(rng, N_DRAWS, 1, PROBLEMS, K, MU, SD_PROBLEM, 0.5)
    second, _ = simulate(rng, N_DRAWS, 1, PROBLEMS, K, MU, SD_PROBLEM, 0.5, difficulty)
    plan = stats.make_plan(1, {"b": PROBLEMS}, n_resamples=1000, seed=1)
    low, high = stats.percentile_bounds(stats.bootstrap_means(first - second, plan.seed_weights,
                                                              plan.problem_weights["b"]))
    assert np.mean((low <= 0) & (0 <= high)) < 0.8
