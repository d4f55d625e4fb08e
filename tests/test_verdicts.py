"""harness.report.verdicts: claims validation, the verdict rules on constructed intervals, Holm's correction by
hand, and claims judged on score matrices."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from harness.config.schema import ConfigError
from harness.report import power, sequential, verdicts
from harness.report.intervals import DIFFERENCE_RANGE, Interval, holm_adjust, t_interval
from harness.report.scores import CrossedVariance

PATH = Path("configs/reported/paper-x.yaml")
GOOD = {"method": "ktae", "benchmark": "mean", "metric": "greedy", "difference": 2.26, "kind": "improvement",
        "where": "Table 1"}


def interval(estimate: float, seed_sd: float, seed_df: int = 2) -> Interval:
    """A paired-difference interval with a seed part only (sd of the mean ``seed_sd``)."""
    return t_interval(estimate, CrossedVariance(seed_sd**2, seed_df, 0.0, 99), bounds=DIFFERENCE_RANGE)


# --- claims validation --------------------------------------------------------------------------------------------


def test_claims_parse_with_defaults():
    parity = {"method": "nat", "benchmark": "aime24", "metric": "avg@k", "difference": 0.0, "kind": "parity",
              "where": "abstract", "margin": 1.5}
    claims = verdicts.parse_claims(PATH, [GOOD, parity])
    assert claims[0] == verdicts.Claim("ktae", "uniform", "mean", "greedy", 2.26, "improvement", "Table 1",
                                       verdicts.PARITY_MARGIN_POINTS)
    assert (claims[1].kind, claims[1].margin, claims[1].baseline) == ("parity", 1.5, "uniform")
    assert verdicts.parse_claims(PATH, None) == []


@pytest.mark.parametrize(("claims", "message"), [
    ({"method": "ktae"}, r"key 'claims' must be a list"),
    (["ktae"], r"key 'claims\[0\]' must be a mapping"),
    ([{k: v for k, v in GOOD.items() if k != "where"}], r"key 'claims\[0\]' lacks \['where'\]"),
    ([GOOD, {**GOOD, "paper": "x"}], r"key 'claims\[1\]' has unknown key\(s\) \['paper'\]"),
    ([{**GOOD, "metric": "avg@16"}], r"key 'claims\[0\].metric': 'avg@16'; allowed: \['avg@k', 'greedy'\]"),
    ([{**GOOD, "kind": "better"}], r"key 'claims\[0\].kind': 'better'"),
    ([{**GOOD, "difference": "2.3"}], r"key 'claims\[0\].difference': '2.3' is not a number"),
    ([{**GOOD, "difference": -1.0}], r"key 'claims\[0\].difference': an improvement claim needs a difference > 0"),
    ([{**GOOD, "margin": 1.0}], r"key 'claims\[0\].margin' applies to kind 'parity' only"),
    ([{**GOOD, "kind": "parity", "difference": 1.5}], r"key 'claims\[0\].margin': a parity claim needs"),
    ([{**GOOD, "baseline": "ktae"}], r"key 'claims\[0\].baseline': the same label as its method"),
    ([{**GOOD, "method": ""}], r"key 'claims\[0\].method': '' is not a non-empty string"),
    ([{**GOOD, "min_baseline_gain": -0.5}], r"key 'claims\[0\].min_baseline_gain': the baseline's gain over the "),
])
def test_claims_validation_names_the_file_and_key(claims, message):
    with pytest.raises(ConfigError, match=message) as error:
        verdicts.parse_claims(PATH, claims)
    assert str(error.value).startswith(str(PATH))


# --- the verdict rules --------------------------------------------------------------------------------------------


def verdict_of(claim, iv, detectable=0.05):
    return verdicts.decide(claim, iv, *verdicts.claim_pvalues(claim, iv), detectable)


IMPROVEMENT = verdicts.Claim("m", "uniform", "mean", "avg@k", 2.0, "improvement", "here")
PARITY = verdicts.Claim("m", "uniform", "mean", "avg@k", 0.0, "parity", "here", margin=1.0)


def test_improvement_verdicts():
    # half-width t_{2, 0.975} * sd = 4.303 sd
    assert verdict_of(IMPROVEMENT, interval(0.03, 0.002)) == ("reproduced", "interval excludes 0")
    verdict, reason = verdict_of(IMPROVEMENT, interval(0.008, 0.001))  # [0.4, 1.2] pts: real, below +2
    assert verdict == "reproduced" and "smaller effect" in reason
    assert verdict_of(IMPROVEMENT, interval(0.002, 0.002))[0] == "contradicted"  # [-0.7, 1.1] excludes +2
    assert "excludes the paper's +2.00" in verdict_of(IMPROVEMENT, interval(0.002, 0.002))[1]
    assert verdict_of(IMPROVEMENT, interval(-0.03, 0.002)) == ("contradicted",
                                                               "interval below 0: the opposite of the claim")
    verdict, reason = verdict_of(IMPROVEMENT, interval(0.01, 0.01), detectable=0.123)  # [-3.3, 5.3] pts
    assert verdict == "inconclusive" and "covers 0 and the paper's +2.00" in reason and "12.3 pts" in reason
    # the verdict is exactly the interval: low > 0 <=> reproduced, high < delta <=> contradicted
    for estimate in np.linspace(-0.05, 0.06, 23):
        iv = interval(float(estimate), 0.004)
        verdict = verdict_of(IMPROVEMENT, iv)[0]
        expected = "reproduced" if iv.low > 0 else "contradicted" if iv.high < 0.02 else "inconclusive"
        assert verdict == expected, (estimate, iv)


def test_parity_verdicts():
    assert verdict_of(PARITY, interval(0.001, 0.001))[0] == "reproduced"  # [-0.3, 0.5] inside +-1
    assert verdict_of(PARITY, interval(0.03, 0.002))[0] == "contradicted"  # [2.1, 3.9] beyond +1
    assert verdict_of(PARITY, interval(-0.03, 0.002))[0] == "contradicted"
    assert verdict_of(PARITY, interval(0.005, 0.002))[0] == "inconclusive"  # [-0.4, 1.4] straddles +1
    for estimate in np.linspace(-0.03, 0.03, 25):
        iv = interval(float(estimate), 0.002)
        verdict = verdict_of(PARITY, iv)[0]
        expected = ("reproduced" if -0.01 < iv.low and iv.high < 0.01 else
                    "contradicted" if iv.low > 0.01 or iv.high < -0.01 else "inconclusive")
        assert verdict == expected, (estimate, iv)


def test_parity_quotes_the_smallest_margin_the_sweep_establishes():
    iv = interval(0.001, 0.001)  # [-0.33, 0.53] pts: the margin it establishes is +-0.5
    verdict, reason = verdict_of(PARITY, iv)
    assert verdict == "reproduced" and "smallest margin this sweep establishes is ±0.5" in reason
    verdict, reason = verdict_of(PARITY, interval(0.005, 0.002), detectable=0.031)  # [-0.4, 1.4]
    assert verdict == "inconclusive" and "establishes is ±1.4" in reason and "(±3.1 with 80% power)" in reason


def test_headline_is_holm_unless_the_sweep_cannot_detect_the_claim():
    iv = interval(0.03, 0.002)
    strong = verdicts.Verdict(IMPROVEMENT, "reproduced", "", iv, detectable=0.015, holm="reproduced")
    assert strong.headline == "reproduced" and not strong.underpowered
    weak = dataclasses.replace(strong, detectable=0.037)  # detects 3.7 points where the paper claims 2
    assert weak.underpowered and weak.headline == "insufficient replication (detects 3.7, claim 2.0)"
    parity = verdicts.Verdict(PARITY, "inconclusive", "", iv, detectable=0.047, holm="inconclusive")
    assert parity.headline == "insufficient replication (detects 4.7, claim 1.0)"  # the margin is the claim
    assert dataclasses.replace(strong, holm="inconclusive").headline == "inconclusive"  # Holm leads, not per-claim
    assert verdicts.Verdict(IMPROVEMENT, "not evaluated", "").headline == "not evaluated"


def test_parity_detectable_is_the_margin_at_ninety_percent_per_side():
    rng = np.random.default_rng(4)
    differences = {"a": rng.normal(0.0, 0.05, (3, 40)) + rng.normal(0, 0.01, (3, 1))}
    improvement = verdicts.judge(IMPROVEMENT, differences)
    parity = verdicts.judge(PARITY, differences)
    components = power.variance_components(differences)
    assert improvement.detectable == pytest.approx(power.detectable_effect(components, 3, 0.80))
    assert parity.detectable == pytest.approx(power.detectable_effect(components, 3, 0.90))
    assert parity.detectable > improvement.detectable


# --- group-sequential boundaries ----------------------------------------------------------------------------------


@pytest.mark.parametrize("looks, published", [
    # Lan-DeMets O'Brien-Fleming-type spending, equally spaced looks, one-sided 0.025 (gsDesign sfLDOF; Jennison &
    # Turnbull 2000, table 7.5)
    (2, [2.963, 1.969]),
    (3, [3.710, 2.511, 1.993]),
    (4, [4.333, 2.963, 2.359, 2.014]),
])
def test_alpha_spending_boundaries_match_published_values(looks, published):
    fractions = [(k + 1) / looks for k in range(looks)]
    assert sequential.boundaries(fractions, 0.025) == pytest.approx(published, abs=2e-3)
    assert sequential.obrien_fleming_spent(1.0, 0.025) == pytest.approx(0.025)


def test_stage_seeds_and_look_decide_and_open_labels():
    assert sequential.stage_seeds(2, 2, 7) == [2, 4, 6, 7]
    with pytest.raises(ValueError, match="first"):
        sequential.stage_seeds(1, 2, 7)
    other = verdicts.Claim("n", "uniform", "mean", "avg@k", 2.0, "improvement", "here")
    clear = verdicts.Verdict(IMPROVEMENT, "reproduced", "", interval(0.05, 0.002), p_reproduce=1e-9,
                             p_contradict=1.0)
    unclear = verdicts.Verdict(other, "inconclusive", "", interval(0.01, 0.01), p_reproduce=0.1, p_contradict=0.2)
    first = sequential.look([clear, unclear], 2, [2, 4, 6])
    # two claims: each test at 0.025 / 2, spent by the first of three looks: 1 - Phi(3.710 at 0.0125 ...)
    assert first.level == pytest.approx(sequential.nominal_levels([1 / 3, 2 / 3, 1], 0.0125)[0])
    assert first.decided == [clear] and first.open_labels == ["n", "uniform"] and first.next_seeds == 4
    last = sequential.look([clear, unclear], 6, [2, 4, 6])
    assert last.next_seeds is None and last.open_labels == []
    with pytest.raises(ValueError, match="not a stage"):
        sequential.look([clear], 3, [2, 4, 6])


# --- Holm ---------------------------------------------------------------------------------------------------------


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04)
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.5]) == [1.0, 1.0]  # capped at 1
    assert holm_adjust([0.02]) == [0.02]  # a family of one: no correction
    assert holm_adjust([0.001, 0.001, 0.2]) == pytest.approx([0.003, 0.003, 0.2])


def test_holm_verdicts_beside_the_per_comparison_ones():
    # Three improvement claims, each reproduced on its own: p_reproduce 0.001, 0.010 and 0.020. Holm: 0.003,
    # 0.020, 0.020 (the last capped by monotonicity) all < 0.025: all stay. A fourth with p 0.024 makes m = 4:
    # 0.004, 0.030, 0.040, 0.040: only the first stays reproduced.
    def judged(p):
        estimate = 0.02 * (1 + p)  # any interval: decide() reads the p-values
        return verdicts.Verdict(IMPROVEMENT, "reproduced", "", interval(estimate, 0.001), 0.01, p, 0.9)

    three = verdicts.with_holm([judged(p) for p in (0.001, 0.010, 0.020)])
    assert [v.holm for v in three] == ["reproduced"] * 3
    assert [v.holm_p_reproduce for v in three] == pytest.approx([0.003, 0.020, 0.020])
    four = verdicts.with_holm([judged(p) for p in (0.001, 0.010, 0.020, 0.024)])
    assert [v.holm for v in four] == ["reproduced", "inconclusive", "inconclusive", "inconclusive"]
    assert [v.verdict for v in four] == ["reproduced"] * 4  # the per-comparison verdicts are kept


# --- claims on score matrices -------------------------------------------------------------------------------------


def sweep_scores(rng, n_seeds=3, effect=0.1):
    scores = {}
    for bench, n in (("a", 60), ("b", 40)):
        difficulty = rng.random(n)
        for label, shift in (("uniform", 0.0), ("uniform-aa", 0.0), ("good", effect)):
            seed_effect = rng.normal(0, 0.005, (n_seeds, 1))
            scores[(label, "ckpt-100", bench, "avg@4")] = np.clip(difficulty + shift + seed_effect
                                                                  + rng.normal(0, 0.05, (n_seeds, n)), 0, 1)
    return scores


def test_judge_claims_on_scores_and_default_claims():
    rng = np.random.default_rng(3)
    scores = sweep_scores(rng)
    names = {"uniform": "uniform", "uniform-aa": "uniform", "good": "entropy"}
    claims = verdicts.default_claims(["uniform", "good", "uniform-aa"], names, "uniform")
    assert [(c.method, c.kind, c.difference) for c in claims] == [("good", "improvement", 2.0),
                                                                  ("uniform-aa", "parity", 0.0)]
    missing = verdicts.Claim("nat", "uniform", "mean", "avg@k", 0.0, "parity", "abstract")
    greedy = verdicts.Claim("good", "uniform", "a", "greedy", 1.0, "improvement", "t")
    judged = verdicts.judge_claims([*claims, missing, greedy], scores, ["a", "b"], "ckpt-100", "avg@4")
    assert judged[0].verdict == "reproduced" and judged[0].interval.estimate == pytest.approx(0.1, abs=0.01)
    assert judged[0].holm == "reproduced" and judged[0].detectable > 0
    assert judged[1].verdict in {"reproduced", "inconclusive"}  # the A/A pair is never called different here
    assert [v.verdict for v in judged[2:]] == ["not evaluated", "not evaluated"]  # no nat label, no greedy scores
    assert verdicts.default_claims(["a", "b"], {"a": "x", "b": "y"}, None) == []


def test_detectability_rows_per_benchmark_and_mean():
    rng = np.random.default_rng(4)
    rows = verdicts.detectability_rows(sweep_scores(rng), ["uniform", "uniform-aa", "good"], "uniform", ["a", "b"],
                                       "ckpt-100", "avg@4")
    assert [(r["method"], r["bench"]) for r in rows] == [("uniform-aa", "a"), ("uniform-aa", "b"),
                                                         ("uniform-aa", "mean"), ("good", "a"), ("good", "b"),
                                                         ("good", "mean")]
    assert all(r["detectable"] > 0 and r["n_seeds"] == 3 for r in rows)
    one_seed = {key: x[:1] for key, x in sweep_scores(rng).items()}
    rows = verdicts.detectability_rows(one_seed, ["uniform", "good"], "uniform", ["a", "b"], "ckpt-100", "avg@4")
    assert {r["detectable"] for r in rows} == {None}


def test_detectable_effects_take_the_pooled_noise_at_its_upper_bound_as_harness_power_does():
    from harness.report.intervals import difference_interval
    from harness.report.scores import crossed_variance
    from harness.report.training_noise import TrainingNoise

    rng = np.random.default_rng(5)
    differences = {"a": rng.normal(0.01, 0.05, (2, 60)) + rng.normal(0, 0.01, (2, 1))}
    claim = verdicts.Claim("good", "uniform", "a", "avg@k", 2.0, "improvement", "t")
    noise = TrainingNoise(0.02**2, 7)  # a 2-seed sweep of 8 labels pooled: 7 df
    judged = verdicts.judge(claim, differences, noise)
    own = power.variance_components(differences)
    bound = power.upper_bound(noise.for_pair(crossed_variance(differences)))
    assert bound.variance == pytest.approx(7 * 0.02**2 / 2.8331, rel=1e-4)  # df T / chi2_{0.10, 7}
    assert judged.detectable == pytest.approx(power.detectable_effect(own.pooled(bound), 2))
    at_estimate = power.detectable_effect(own.pooled(noise), 2)
    assert judged.detectable > 1.3 * at_estimate  # 2 seeds: the bound is 2.5x the variance
    assert judged.seeds_to_settle == power.seeds_needed(own.pooled(bound), 0.02)
    # the interval and the verdict keep the estimate
    assert judged.interval == difference_interval(differences, noise)
    # with many degrees of freedom the bound comes close to the estimate
    many = verdicts.judge(claim, differences, TrainingNoise(0.02**2, 400))
    assert many.detectable < 1.1 * power.detectable_effect(own.pooled(TrainingNoise(0.02**2, 400)), 2)
    # the table shows both, its detectable effect at the bound
    scores = {("good", "c", "a", "m"): differences["a"] + 0.3, ("uniform", "c", "a", "m"): np.full((2, 60), 0.3)}
    [row, _] = verdicts.detectability_rows(scores, ["uniform", "good"], "uniform", ["a"], "c", "m",
                                           {("a",): noise})
    assert row["seed_sd_bound"] == pytest.approx(100 * bound.variance**0.5)
    assert row["seed_sd"] == pytest.approx(2.0) and row["detectable"] == pytest.approx(100 * judged.detectable)


def test_every_reported_file_loads_and_its_claims_name_labels_of_its_sweep():
    import yaml

    from harness.config.paths import CONFIG_DIR
    from harness.report.reported import load_reported

    files = sorted((CONFIG_DIR / "reported").glob("*.yaml"))
    assert len(files) == 8
    for path in files:
        sweep = yaml.safe_load((CONFIG_DIR / "sweeps" / path.name).read_text())
        for claim in load_reported(path).claims:
            assert {claim.method, claim.baseline} <= set(sweep["methods"]), (path.name, claim)
            assert claim.where
    claimed = {p.stem: len(load_reported(p).claims) for p in files}
    assert claimed == {"paper-8020": 1, "paper-d3s": 1, "paper-gmts": 1, "paper-ktae": 1, "paper-ktae-grpo": 1,
                       "paper-nat": 2, "paper-rsi": 1, "published-checkpoints": 0}


def test_claim_effects_are_the_differences_and_margins():
    assert verdicts.claim_effects([IMPROVEMENT, PARITY, IMPROVEMENT]) == [1.0, 2.0]
    assert verdicts.claim_effects([]) == []


def test_paper_sweeps_carry_the_aa_label_the_papers_claim_kinds_and_their_training_length():
    """Every paper sweep runs uniform-aa (uniform under other seeds); 80/20 at 8B is a parity claim (the abstract's
    'comparable'); each reported file says how long the paper trained, or that it is not public."""
    import yaml

    from harness.config.loading import load_method
    from harness.config.paths import CONFIG_DIR
    from harness.report.reported import load_reported

    for path in sorted((CONFIG_DIR / "sweeps").glob("paper-*.yaml")):
        labels = yaml.safe_load(path.read_text())["methods"]
        aa = [load_method(label) for label in labels if label != "uniform"]
        assert any(spec.name == "uniform" and spec.seed_offset > 0 for spec in aa), path.name
        reported = load_reported(CONFIG_DIR / "reported" / path.name)
        assert reported.training is not None and reported.training.where, path.name
    claim = load_reported(CONFIG_DIR / "reported" / "paper-8020.yaml").claims[0]
    assert (claim.kind, claim.margin) == ("parity", 1.0) and "comparable" in claim.where
    ktae = load_reported(CONFIG_DIR / "reported" / "paper-ktae.yaml").training
    assert (ktae.steps, ktae.rollouts) == (60, 20 * (7500 // 2048) * 2048 * 16)
    grpo = load_reported(CONFIG_DIR / "reported" / "paper-ktae-grpo.yaml")
    assert not any("128-prompt" in d for d in grpo.differences)  # the stale "one step per 128 prompts" is gone


@pytest.mark.parametrize("training, message", [
    ({"steps": "many", "where": "x"}, "key 'training.steps'"),
    ({"steps": -1, "where": "x"}, "key 'training.steps'"),
    ({"steps": 1}, "key 'training' must map"),
    ({"steps": 1, "where": "x", "epochs": 2}, "key 'training' must map"),
])
def test_a_bad_training_length_names_the_key(tmp_path, training, message):
    import yaml

    from harness.report.reported import load_reported

    path = tmp_path / "paper-x.yaml"
    path.write_text(yaml.safe_dump({"source": "s", "numbers": {}, "training": training}))
    with pytest.raises(ConfigError, match=message) as info:
        load_reported(path)
    assert str(path) in str(info.value)


def test_one_seed_or_an_interval_without_width_is_not_judged():
    """A rehearsal (one seed per label) or a floor (both arms 0 on every problem) gives no verdict, and Holm's family
    leaves the claim out; before, a [0.0, 0.0] interval 'contradicted' a +2.26 claim."""
    claim = verdicts.Claim("ktae", "uniform", "mean", "greedy", 2.26, "improvement", "table")
    rng = np.random.default_rng(0)
    one_seed = verdicts.judge(claim, {"a": rng.normal(0.0, 0.1, (1, 30))})
    assert one_seed.verdict == "not judged" and "one seed" in one_seed.reason and one_seed.interval is not None
    floor = verdicts.judge(claim, {"a": np.zeros((3, 2)), "b": np.zeros((3, 2))})
    assert floor.verdict == "not judged" and "without width" in floor.reason
    judged = verdicts.with_holm([one_seed, floor, verdicts.judge(claim, {"a": rng.normal(0.1, 0.1, (3, 30))})])
    assert [v.holm for v in judged] == ["not judged", "not judged", judged[2].verdict]
    assert judged[2].holm_p_reproduce == judged[2].p_reproduce  # a family of one: Holm changes nothing


# --- no verdict from under-training -------------------------------------------------------------------------------


def scores_for(baseline_rows: np.ndarray, method_rows: np.ndarray, warm: np.ndarray) -> tuple[dict, dict]:
    """(scores, reference) for one benchmark 'b' at ckpt-100: method 'm', baseline 'uniform', the warm start."""
    scores = {("uniform", "ckpt-100", "b", "avg@4"): baseline_rows, ("m", "ckpt-100", "b", "avg@4"): method_rows}
    return scores, {("b", "avg@4"): warm}


def test_the_baselines_gain_over_the_warm_start_by_hand():
    scores, reference = scores_for(np.array([[0.5, 0.7], [0.6, 0.6]]), np.zeros((2, 2)), np.array([[0.5, 0.5]]))
    claim = verdicts.Claim("m", "uniform", "b", "avg@k", 0.0, "parity", "x", 2.0)
    # baseline mean 0.6, warm start 0.5: +10 points
    assert verdicts.baseline_gain(claim, scores, ["b"], "ckpt-100", "avg@4", reference) == pytest.approx(10.0)
    assert verdicts.baseline_gain(claim, scores, ["b"], "ckpt-100", "avg@4", {}) is None  # no warm-start row
    assert claim.learned_threshold == 2.0  # the margin, unless the claim sets its own
    assert dataclasses.replace(claim, min_baseline_gain=15.0).learned_threshold == 15.0


@pytest.mark.parametrize(("kind", "difference", "verdict", "gain", "headline"), [
    ("parity", 0.0, "reproduced", 0.4, "under-trained (uniform +0.4 pts over the warm start, threshold +1.0)"),
    ("parity", 0.0, "reproduced", 1.5, "reproduced"),
    ("parity", 0.0, "inconclusive", 0.4, "inconclusive"),
    ("improvement", 2.0, "contradicted", 0.4,
     "contradicted, baseline under-trained (uniform +0.4 pts over the warm start, threshold +1.0)"),
    ("improvement", 2.0, "reproduced", 0.4, "reproduced"),  # a gain the method made while the baseline stood still
    ("parity", 0.0, "reproduced", None, "reproduced"),  # no warm-start row: nothing to check against
])
def test_a_verdict_cannot_come_from_an_untrained_baseline(kind, difference, verdict, gain, headline):
    claim = verdicts.Claim("m", "uniform", "mean", "avg@k", difference, kind, "x")
    judged = verdicts.Verdict(claim, verdict, "", interval(0.0, 0.002), detectable=0.005, holm=verdict,
                              baseline_gain=gain)
    assert judged.headline == headline


def test_judge_claims_reports_the_gain_and_the_seeds_that_would_settle_it():
    rng = np.random.default_rng(0)
    baseline = rng.binomial(1, 0.5, size=(3, 200)).astype(float)
    method = np.clip(baseline + rng.binomial(1, 0.05, size=(3, 200)), 0, 1)
    scores, reference = scores_for(baseline, method, np.full((1, 200), baseline.mean() - 0.003))
    claim = verdicts.Claim("m", "uniform", "b", "avg@k", 0.0, "parity", "x", 1.0)
    [judged] = verdicts.judge_claims([claim], scores, ["b"], "ckpt-100", "avg@4", reference=reference)
    assert judged.baseline_gain == pytest.approx(0.3) and judged.undertrained
    components = power.variance_components({"b": method - baseline})
    assert judged.seeds_to_settle == power.seeds_needed(components, 0.01, verdicts.PARITY_POWER)
