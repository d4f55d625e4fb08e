"""Sizing before spending: the prior's variance components by hand, the detectable effect they give against the
formulas it must equal, the bound on the method x problem interaction against simulated difficulties, and what
``harness plan`` prints for every paper sweep (harness/report/plan_power.py, configs/priors/)."""

import re

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as scipy_stats

from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.config.schema import ConfigError
from harness.data.files import read_jsonl
from harness.report import plan_power, power
from harness.report.calibration import calibration_file, load_calibration
from harness.report.reported import load_reported

SWEEPS = REPO_ROOT / "configs" / "sweeps"
PAPER_SWEEPS = sorted(SWEEPS.glob("paper-*.yaml"))


def test_sampling_and_interaction_parts_by_hand():
    # two arms of k = 4 samples at p = 0.5: 2 x 0.25 / 4; greedy (k = 1): 2 x 0.25
    assert power.sampling_part(0.5, 4) == pytest.approx(0.125)
    assert power.sampling_part(0.5, 1) == pytest.approx(0.5)
    # (0.5 / 2)^2 x 0.25 = 0.015625; nothing to move at p = 0 or 1
    assert power.interaction_part(0.5, 0.5) == pytest.approx(0.015625)
    assert power.sampling_part(1.0, 4) == power.interaction_part(0.0, 0.5) == 0.0


def test_detectable_effect_of_a_prior_by_hand():
    """One benchmark, p = 0.5, k = 4, P = 100, training noise 0.01^2, no interaction, 3 labels x 3 seeds: the residual
    is 2 x 0.25 / 4 = 0.125 per cell, the paired mean's seed part (0.01^2 + 0.125 / 100) / 3 = 4.5e-4 with
    (3 - 1)(3 - 1) = 4 df, its residual floor 0.125 / 300 with 2 x 99 df. With the noise known (a calibration of
    practically infinite df) the MDE is (z_{0.975} + z_{0.80}) sqrt(4.5e-4) = 2.8016 x 0.021213 = 5.943 pts (the
    floor's half-width, t_{198} sqrt(0.125 / 300) = 4.03 pts, stays below the seed level's 1.96 sqrt(V) = 4.16)."""
    comp = power.prior_components({"b": 0.5}, {"b": 100}, 4, 0.01**2, n_labels=3, n_seeds=3)
    assert (comp.residual, comp.problem, comp.seed) == ({"b": 0.125}, {"b": 0.0}, 0.01**2)
    parts = power.mean_variance(comp, 3)
    assert (parts.seed, parts.seed_df, parts.problem) == (pytest.approx(4.5e-4), 4, 0.0)
    assert (parts.residual, parts.residual_df) == (pytest.approx(0.125 / 300), 198)
    known = power.prior_components({"b": 0.5}, {"b": 100}, 4, 0.01**2, 3, 3, external_df=1e9)
    expected = (scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)) * np.sqrt(4.5e-4)
    assert expected == pytest.approx(0.05943, abs=1e-5)
    # power_at's quadrature is built for the few degrees of freedom a verdict has; at 1e9 its chi-square factor is a
    # step, which 200 nodes resolve to 0.2%
    assert power.detectable_effect(known, 3) == pytest.approx(expected, rel=5e-3)
    assert power.detectable_effect(comp, 3) > power.detectable_effect(known, 3)  # 4 df: t_4, not z


def test_a_prior_of_training_noise_alone_is_the_noncentral_t():
    """p = 1 leaves no sampling or interaction: the verdict is the seed-level t test on the pooled noise with
    (L - 1)(S - 1) degrees of freedom (plus a calibration's), whose 80% power point solves
    P(T_df(delta) > t_{df, 0.975}) = 0.8 (scipy.stats.nct)."""
    def mde(df, n_seeds, variance):
        delta = optimize.brentq(lambda d: scipy_stats.nct.sf(scipy_stats.t.ppf(0.975, df), df, d) - 0.8, 0, 50)
        return delta * np.sqrt(variance / n_seeds)

    comp = power.prior_components({"b": 1.0}, {"b": 30}, 16, 0.01**2, n_labels=3, n_seeds=3, interaction_logit_sd=0.5)
    assert comp.seed_df(3) == 4
    assert power.detectable_effect(comp, 3) == pytest.approx(mde(4, 3, 0.01**2), rel=1e-4)
    calibrated = power.prior_components({"b": 1.0}, {"b": 30}, 16, 0.01**2, 3, 3, external_df=7)
    assert power.detectable_effect(calibrated, 3) == pytest.approx(mde(11, 3, 0.01**2), rel=1e-4)


@pytest.mark.parametrize(("a", "b"), [(0.3, 0.3), (2.0, 2.0), (0.5, 2.0), (5.0, 1.0), (1.0, 20.0), (50.0, 50.0)])
def test_interaction_bound_holds_for_spread_difficulties(a, b):
    """A method that moves each problem's log-odds by N(0, s^2): the variance of the per-problem accuracy change
    stays below s^2 p (1 - p) / 4 at the mean accuracy p, whatever the spread of difficulties (Beta(a, b))."""
    rng = np.random.default_rng(0)
    q = np.clip(rng.beta(a, b, 200_000), 1e-9, 1 - 1e-9)
    for sd in (0.25, 0.5, 1.0):
        moved = 1 / (1 + np.exp(-(np.log(q / (1 - q)) + rng.normal(0, sd, q.size))))
        assert np.var(moved - q) <= power.interaction_part(q.mean(), sd)


def test_more_seeds_lower_the_detectable_effect_and_seeds_needed_agrees():
    sizing = plan_power.read_sizing(resolve(SWEEPS / "paper-ktae.yaml", []))
    noise = plan_power.scope_noise(list(sizing.n_problems), sizing.n_problems, sizing.prior, None)
    comp = sizing.components("uniform", list(sizing.n_problems), sizing.k, sizing.prior.interaction_sd, noise)
    effects = [power.detectable_effect(comp, s) for s in (2, 3, 5, 10, 20)]
    assert effects == sorted(effects, reverse=True) and len(set(effects)) == len(effects)
    needed = power.seeds_needed(comp, effects[2])  # what 5 seeds detect needs 5 seeds
    assert needed == 5


def test_problems_per_benchmark_come_from_the_files_the_generator_and_limit():
    preset = resolve(SWEEPS / "paper-ktae.yaml", []).preset
    expected = {name: len(read_jsonl(REPO_ROOT / bench.file)) for name, bench in preset.eval.benchmarks.items()}
    assert plan_power.benchmark_problems(preset) == expected
    assert expected["aime24"] == 30 and expected["math500"] == 500
    tiny = resolve(SWEEPS / "default.yaml", []).preset  # {data_dir}/eval.jsonl and ood.jsonl: n_eval, n_ood
    assert plan_power.benchmark_problems(tiny) == {"arith": 200, "arith_ood": 100}
    smol = resolve(SWEEPS / "smol.yaml", []).preset  # a file capped by limit, a generated one too
    assert plan_power.benchmark_problems(smol) == {"gsm8k": 20, "sums": 50}


def test_every_paper_preset_has_a_prior_whose_assumptions_say_so():
    for sweep in PAPER_SWEEPS:
        preset = resolve(sweep, []).preset.name
        prior = plan_power.load_prior(plan_power.prior_file(preset))
        assert prior is not None and prior.preset == preset, sweep
        assert calibration_file(preset).is_file() or "assumption" in prior.noise_source  # no measurement: said
        assert "assumption" in prior.interaction_source
        reported = load_reported(CONFIG_DIR / "reported" / f"{sweep.stem}.yaml")
        benches = plan_power.benchmark_problems(resolve(sweep, []).preset)
        accuracy, sources = plan_power.baseline_accuracy(list(benches), "uniform", reported, prior)
        assert set(accuracy) == set(benches) and all(0 < p < 1 for p in accuracy.values())


def test_the_paper_baseline_comes_before_the_prior():
    _, ktae = plan_power.baseline_accuracy(["amc23"], "uniform", load_reported(
        CONFIG_DIR / "reported" / "paper-ktae-grpo.yaml"), plan_power.load_prior(plan_power.prior_file("paper-ktae")))
    assert ktae == {"amc23": "configs/reported/paper-ktae-grpo.yaml, uniform"}
    prior = plan_power.load_prior(plan_power.prior_file("paper-gmts"))
    accuracy, sources = plan_power.baseline_accuracy(["amc23"], "ets", load_reported(
        CONFIG_DIR / "reported" / "paper-gmts.yaml"), prior)  # GMTS publishes gains only
    assert accuracy == {"amc23": pytest.approx(0.47)} and sources["amc23"].startswith("configs/priors/paper-gmts")
    with pytest.raises(ValueError, match="no accuracy for benchmark 'gsm8k'"):
        plan_power.baseline_accuracy(["gsm8k"], "ets", None, prior)


def claim_line(out: str, claim) -> str:
    lines = [line for line in out.splitlines() if line.startswith(f"  claim: {claim.describe()}: ")]
    assert len(lines) == 1, (claim.describe(), out)
    return lines[0]


@pytest.mark.parametrize("sweep", PAPER_SWEEPS, ids=lambda p: p.stem)
def test_harness_plan_prints_the_power_of_every_paper_sweep(sweep, capsys):
    from harness.cli import main

    assert main(["plan", "--sweep", str(sweep)]) == 0
    out = capsys.readouterr().out
    n_seeds = len(resolve(sweep, []).sweep.seeds)
    assert re.search(rf"^  detectable on the mean \(avg@\d+, a method - uniform, 80% power\): [\d.]+ pts with "
                     rf"{n_seeds} seeds; 5 seeds [\d.]+, 10 seeds [\d.]+$", out, flags=re.M)
    assert "interaction sd 0 / x2:" in out  # an assumption's sensitivity: always assumed
    if not calibration_file(resolve(sweep, []).preset.name).is_file():  # the training noise too, unless measured
        assert "training-noise sd x0.5 / x2:" in out
    claims = load_reported(CONFIG_DIR / "reported" / f"{sweep.stem}.yaml").claims
    assert claims
    for claim in claims:
        line = claim_line(out, claim)
        detected = float(re.search(rf"detects ([\d.]+) pts with {n_seeds} seeds", line).group(1))
        assert re.search(r"\d+ seeds needed", line), line
        underpowered = f"underpowered: {claim.describe()}: the sweep detects {detected:.1f} pts"
        assert (underpowered in out) == (detected > claim.effect), (line, detected, claim.effect)


def test_the_underpowered_line_goes_with_the_seeds_it_asks_for():
    resolved = resolve(SWEEPS / "default.yaml", [])  # stand-in claims of 2 points, 2 seeds
    lines, underpowered = plan_power.plan_power_lines(resolved)
    entropy = next(line for line in lines if line.startswith("  claim: entropy beats uniform"))
    needed = int(re.search(r"(\d+) seeds needed", entropy).group(1))
    assert needed > 2 and any(line.startswith("underpowered: entropy beats uniform") for line in underpowered)
    for n_seeds, flagged in ((needed - 1, True), (needed, False)):
        _, underpowered = plan_power.plan_power_lines(power.with_seeds(resolved, n_seeds))
        assert any(line.startswith("underpowered: entropy beats uniform") for line in underpowered) == flagged


def test_the_calibration_replaces_the_assumed_noise_where_it_fits():
    resolved = resolve(SWEEPS / "default.yaml", [])
    sizing = plan_power.read_sizing(resolved)
    calibration = load_calibration(calibration_file("tiny"))
    noise = plan_power.scope_noise(list(sizing.n_problems), sizing.n_problems, sizing.prior, sizing.calibration)
    assert (noise.variance, noise.external_df, noise.assumed) == (calibration.noise["mean"].variance, 7, False)
    lines, _ = plan_power.plan_power_lines(resolved)
    text = "\n".join(lines)
    assert "A/A calibration `tiny.json`" in text and "training-noise sd x0.5" not in text
    # other problem counts: the calibration does not fit (the report's rule), the prior's 0.94 points stand in
    other = resolve(SWEEPS / "default.yaml", ["data.synthetic.n_eval=150"])
    lines, _ = plan_power.plan_power_lines(other)
    text = "\n".join(lines)
    assert "sd 0.94 pts" in text and "training-noise sd x0.5" in text and "tiny.json" not in text


def test_sweeps_that_cannot_be_sized_say_why(monkeypatch, tmp_path):
    lines, underpowered = plan_power.plan_power_lines(resolve(SWEEPS / "published-checkpoints.yaml", []))
    assert lines == ["power: not sized: the sweep trains no 'uniform' baseline to pair a method with"]
    lines, _ = plan_power.plan_power_lines(resolve(SWEEPS / "smol.yaml", []))
    assert lines[0].startswith("power: not sized: preset 'smol' has no prior (configs/priors/smol.yaml")
    assert not underpowered
    # a prior without the accuracy of a benchmark the paper does not report either: said, the plan goes on
    (tmp_path / "paper-rsi.yaml").write_text(plan_power.prior_file("paper-rsi").read_text().replace(
        "aime25: 4.2, ", ""))
    monkeypatch.setattr(plan_power, "PRIOR_DIR", tmp_path)
    lines, _ = plan_power.plan_power_lines(resolve(SWEEPS / "paper-rsi.yaml", []))
    assert len(lines) == 1 and "not sized" in lines[0] and "accuracy.percent.aime25" in lines[0]


def test_a_malformed_prior_names_the_key(tmp_path):
    good = (plan_power.prior_file("paper-rsi")).read_text()
    path = tmp_path / "p.yaml"
    for broken, key in ((good.replace("sd: 1.0", "sd: -1"), "training_noise.sd"),
                        (good.replace("aime25: 4.2", "aime25: 420"), "accuracy.percent.aime25"),
                        (good.replace("  logit_sd: 0.5\n", ""), "'interaction' must map exactly"),
                        (good + "extra: 1\n", "the top level must map exactly"),
                        (good + "  : [\n", "not valid YAML")):
        path.write_text(broken)
        with pytest.raises(ConfigError, match=re.escape(key)):
            plan_power.load_prior(path)
    assert plan_power.load_prior(tmp_path / "absent.yaml") is None


def test_the_head_to_head_has_the_fewest_seeds_that_detect_its_2_point_claims():
    """configs/sweeps/head-to-head.yaml's seeds are what `harness plan` asks for from configs/priors/head-to-head.yaml:
    no stand-in 2-point improvement claim is underpowered with them, every one is with a seed fewer."""
    resolved = resolve(SWEEPS / "head-to-head.yaml", [])
    n_seeds = len(resolved.sweep.seeds)
    for seeds, flagged in ((n_seeds - 1, True), (n_seeds, False)):
        _, underpowered = plan_power.plan_power_lines(power.with_seeds(resolved, seeds))
        improvements = [line for line in underpowered if " beats uniform on mean over benchmarks by +2.00" in line]
        assert len(improvements) == (6 if flagged else 0), (seeds, underpowered)
