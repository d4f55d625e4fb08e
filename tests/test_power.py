"""harness.report.power: variance components recovered from simulated sweeps, the detectable-effect formula against
simulated verdicts, seeds needed, the pilot reader on the committed example, and the GPU-hours from
``harness plan``'s arithmetic."""

from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from harness.config.loading import resolve
from harness.config.paths import REPO_ROOT
from harness.ops.resources import plan
from harness.report import power
from harness.report.intervals import paired_difference
from harness.report.scores import CrossedVariance, crossed_variance
from harness.report.training_noise import TrainingNoise


def crossed(rng, n_draws, n_seeds, n_problems, sd_seed, sd_problem, sd_resid, effect=0.0):
    """(n_draws, S, P) paired differences from d = effect + a_s + b_p + e_sp (normal)."""
    return (effect + rng.normal(0, sd_seed, (n_draws, n_seeds, 1)) + rng.normal(0, sd_problem, (n_draws, 1, n_problems))
            + rng.normal(0, sd_resid, (n_draws, n_seeds, n_problems)))


def test_variance_components_recover_the_simulated_ones():
    rng = np.random.default_rng(0)
    comps = [power.variance_components({"b": d}) for d in crossed(rng, 40, 30, 300, 0.02, 0.05, 0.2)]
    assert np.mean([c.seed for c in comps]) == pytest.approx(0.02**2, rel=0.15)
    assert np.mean([c.problem["b"] for c in comps]) == pytest.approx(0.05**2, rel=0.15)
    assert np.mean([c.residual["b"] for c in comps]) == pytest.approx(0.2**2, rel=0.02)
    with pytest.raises(ValueError, match="needs >= 2 seeds"):
        power.variance_components({"b": np.zeros((1, 5))})


def test_expected_variance_is_what_the_interval_estimates():
    # a problem component well above its noise, so that the truncation at 0 (an upward bias) rarely acts
    rng = np.random.default_rng(1)
    truth = power.VarianceComponents(0.02**2, {"b": 0.1**2}, {"b": 0.2**2}, {"b": 100}, 3)
    expected = power.mean_variance(truth, 3)
    estimated = [crossed_variance({"b": d}) for d in crossed(rng, 4000, 3, 100, 0.02, 0.1, 0.2)]
    assert np.mean([v.seed for v in estimated]) == pytest.approx(expected.seed, rel=0.05)
    assert np.mean([v.problem for v in estimated]) == pytest.approx(expected.problem, rel=0.05)
    assert np.mean([v.residual for v in estimated]) == pytest.approx(expected.residual, rel=0.01)
    assert (expected.residual, expected.residual_df) == pytest.approx((0.2**2 / 300, 2 * 99))


def test_power_without_a_floor_is_the_noncentral_t():
    # seed part only (no problem or residual part): the verdict is the seed-level t test with 2 df, whose power at
    # effect / se = 2 is the noncentral t's P(T_2(2) > t_{2, 0.975}) = 0.2180 (scipy.stats.nct).
    seed_only = CrossedVariance(0.01**2, 2, 0.0, 99)
    critical = scipy_stats.t.ppf(0.975, 2)
    expected = scipy_stats.nct.sf(critical, 2, 2.0)
    assert power.power_at(0.02, seed_only) == pytest.approx(expected, abs=1e-9)
    assert expected == pytest.approx(0.2180, abs=1e-4)
    # a residual floor only widens the interval (the estimate must clear the wider of the two half-widths), so it
    # never adds power; the floor-only case is the normal test, P(Z > 1.96 - 3) = 0.851
    floored = power.power_at(0.02, CrossedVariance(0.01**2, 2, 0.0, 99, 0.005**2, 500))
    assert 0.9 * expected < floored < expected
    floor_only = CrossedVariance(0.0, 1, 0.0, 99, 0.01**2, 10**6)
    assert power.power_at(0.03, floor_only) == pytest.approx(scipy_stats.norm.sf(1.96 - 3), abs=1e-4)


@pytest.mark.parametrize(("n_seeds", "sd_seed", "sd_problem"), [
    (2, 0.03, 0.0),  # seed part dominates: the seed-level t test with 1 df
    (3, 0.015, 0.1),  # both parts matter: the approximation between the two exact cases
    (5, 0.01, 0.05),
    (2, 0.0, 0.0),  # no training randomness: the residual floor decides in ~12% of the sweeps
    (3, 0.0, 0.05),
])
def test_detectable_effect_has_the_stated_power_in_simulation(n_seeds, sd_seed, sd_problem):
    rng = np.random.default_rng(n_seeds)
    n_problems, sd_resid = 100, 0.2
    comps = power.VarianceComponents(sd_seed**2, {"b": sd_problem**2}, {"b": sd_resid**2}, {"b": n_problems},
                                     n_seeds)
    effect = power.detectable_effect(comps, n_seeds)
    draws = crossed(rng, 3000, n_seeds, n_problems, sd_seed, sd_problem, sd_resid, effect)
    reproduced = np.mean([paired_difference(d, np.zeros_like(d)).low > 0 for d in draws])
    assert reproduced == pytest.approx(power.POWER, abs=0.04), (effect, reproduced)
    assert power.power_at(effect, power.mean_variance(comps, n_seeds)) == pytest.approx(power.POWER)


def test_seeds_needed_is_the_first_seed_count_that_detects_the_effect():
    comps = power.VarianceComponents(0.03**2, {"b": 0.0}, {"b": 0.1**2}, {"b": 200}, 2)
    needed = power.seeds_needed(comps, 0.02)
    assert power.detectable_effect(comps, needed) <= 0.02 < power.detectable_effect(comps, needed - 1)
    effects = [power.detectable_effect(comps, s) for s in (2, 3, 5, 10, 40)]
    assert effects == sorted(effects, reverse=True)  # more seeds, smaller detectable effects
    # a problem part that no number of seeds removes: 0.03 / sqrt(50) = 0.42 points floor
    floor = power.VarianceComponents(0.0, {"b": 0.03**2}, {"b": 0.0}, {"b": 50}, 2)
    assert power.seeds_needed(floor, 0.005) is None


def test_pilot_from_the_committed_example():
    pilot = power.read_pilot(REPO_ROOT / "results" / "example")
    assert (pilot.ckpt, pilot.benches, len(pilot.seeds)) == ("ckpt-100", ["arith", "arith_ood"], 2)
    assert pilot.aa_pairs() == [("uniform-aa", "uniform")]
    assert not pilot.matrices  # no samples.jsonl committed: per-seed accuracies only
    aa = pilot.components("uniform-aa", "uniform", ["arith"])
    rows = pilot.seed_means[("uniform-aa", "arith")] - pilot.seed_means[("uniform", "arith")]
    assert aa.seed == pytest.approx(np.var(rows, ddof=1))
    # per-seed accuracies only: the pooled noise is 2 MS_LS of the labels x seeds table, (8 - 1)(2 - 1) df
    noise = pilot.training_noise(["arith"])
    table = np.array([pilot.seed_means[(lab, "arith")] for lab in pilot.labels])
    interaction = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0) + table.mean()
    assert noise.variance == pytest.approx(2 * (interaction**2).sum() / 7) and noise.df == 7
    assert power.aa_components(pilot, ["arith"]).seed == noise.variance
    text = power.power_report(pilot, [None, ("entropy", "uniform")], [2.0])
    assert "A/A (two labels of one method" in text and "entropy - uniform, mean" in text
    assert "effect 2 pts:" in text


def test_gpu_hours_come_from_harness_plan():
    resolved = resolve(REPO_ROOT / "configs" / "sweeps" / "paper-ktae.yaml", [])
    assert power.gpu_hours(resolved, 3) == pytest.approx(sum(r.gpu_hours for r in plan(resolved)))
    train = {s: next(r for r in plan(power.with_seeds(resolved, s)) if r.rule == "train") for s in (3, 6)}
    assert train[6].jobs == 2 * train[3].jobs
    assert power.gpu_hours(resolved, 6) > power.gpu_hours(resolved, 3)
    assert resolved.sweep.seeds == [0, 1, 2]  # the resolved sweep itself is unchanged


def test_pilot_errors():
    with pytest.raises(FileNotFoundError, match="sweep.yaml is missing"):
        power.read_pilot(Path("/nonexistent"))


def test_harness_power_command(capsys):
    from harness.cli import main

    example = str(REPO_ROOT / "results" / "example")
    assert main(["power", "--sweep", str(REPO_ROOT / "configs" / "sweeps" / "paper-ktae.yaml"), "--pilot", example,
                 "--pair", "uniform-aa,uniform"]) == 0
    out = capsys.readouterr().out
    # the effect comes from the paper's claim (configs/reported/paper-ktae.yaml: +2.26 greedy on the mean)
    assert "uniform-aa - uniform, mean:" in out and "effect 2.26 pts:" in out and "GPU-hours" in out
    assert main(["power", "--pilot", example, "--effect", "5", "--effect", "2"]) == 0
    out = capsys.readouterr().out
    assert "A/A (two labels of one method), mean: training-noise sd" in out and "(7 df; 90% bound" in out
    assert "effect 5 pts:" in out and "effect 2 pts:" in out
    assert main(["power", "--pilot", example, "--pair", "nope,uniform"]) == 2
    assert "label 'nope' is not in the pilot" in capsys.readouterr().err


def test_pilot_with_samples_uses_the_per_problem_matrices(tmp_path):
    import json

    from report_fixture import LABELS, build_sweep

    from harness.report.evidence import read_sweep

    resolved, paths = build_sweep(tmp_path, fractions=(1.0,))
    (paths.root / "sweep.yaml").write_text(json.dumps({"methods": list(LABELS), "seeds": [0, 1, 2]}))
    pilot = power.read_pilot(paths.root)
    assert pilot.matrices and pilot.aa_pairs() == [("uniform-aa", "uniform")]
    evidence = read_sweep(resolved, paths)  # the report's matrices: the same problems, the same scores
    for bench in pilot.benches:
        np.testing.assert_array_equal(pilot.matrices[("entropy", bench)],
                                      evidence.scores[("entropy", "ckpt-100", bench, "avg@4")])
    comp = pilot.components("entropy", "uniform")
    expected = power.variance_components({b: evidence.scores[("entropy", "ckpt-100", b, "avg@4")]
                                          - evidence.scores[("uniform", "ckpt-100", b, "avg@4")]
                                          for b in pilot.benches})
    assert comp == expected and comp.problem["arith"] > 0  # the per-problem path sees a problem component
    aa = power.aa_components(pilot, pilot.benches)
    assert aa.residual["arith"] > 0 and set(aa.problem.values()) == {0.0}
    assert aa.seed_df(3) == (len(LABELS) - 1) * 2 and aa.seed_df(5) == (len(LABELS) - 1) * 4  # (L - 1)(S - 1)
    assert pilot.sampling("entropy", "uniform", ["arith"])["arith"] > 0
    text = power.power_report(pilot, [None], [10.0])
    assert "training-noise sd" in text and "problem sd" in text and "effect 10 pts:" in text
    assert "more samples per problem at 3 seeds: x2" in text and "more problems at 3 seeds: x2" in text


def test_upper_bound_on_the_training_noise():
    # df T / chi2_{0.10, df}: with 7 df the bound is 7 / 2.833 = 2.47 times the estimate
    bound = power.upper_bound(TrainingNoise(1.0, 7))
    assert bound.variance == pytest.approx(7 / scipy_stats.chi2.ppf(0.10, 7)) and bound.df == 7
    assert power.upper_bound(TrainingNoise(1.0, 7), 0.5).variance == pytest.approx(
        7 / scipy_stats.chi2.ppf(0.5, 7))


def test_levers_samples_and_problems():
    # x (1 - x) / (k - 1): unbiased for p (1 - p) / k over the cells (a cell at 0.5 gives 0.25 / 3)
    assert power.sampling_variance(np.full((2, 3), 0.5), 4) == pytest.approx(0.25 / 3)
    assert power.sampling_variance(np.full((2, 3), 0.5), 1) == 0.0
    comp = power.VarianceComponents(1e-4, {"b": 1e-3}, {"b": 0.05}, {"b": 100}, 2)
    # residual 0.05 of which 0.04 sampling: at 4x k it is 0.01 + 0.04 / 4 = 0.02
    assert power.with_samples(comp, {"b": 0.04}, 4, 16).residual["b"] == pytest.approx(0.02)
    assert power.with_problems(comp, 2).n_problems == {"b": 200}
    assert (power.detectable_effect(power.with_samples(comp, {"b": 0.04}, 4, 16), 2)
            < power.detectable_effect(comp, 2))
