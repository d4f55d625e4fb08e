"""Coverage of the leaderboard's paired-difference intervals with few seeds, by simulation (issues #16, #25).

The model is fitted to the committed default sweep (results/example/, ckpt-100; per-problem samples are not
committed, so only the per-seed results.json):

- problems: P(correct) = sigmoid(mu_b + a_p + c_ls + g_lsp), a_p ~ N(0, sd_problem_b^2): (mu_b, sd_problem_b) match
  the runs' mean avg@4 and pass@4 on benchmark b (logit-normal moments by Gauss-Hermite quadrature);
- training noise: c_ls ~ N(0, sd_seed_b^2) per label and seed, sd_seed_b chosen so that the simulated spread of one
  label's per-seed avg@4 (same problems, k = 4 samples) equals the spread in the example, pooled over its 8 labels;
- g_lsp: a seed x problem interaction (each trained model learns its own problems), 0 unless a cell sets it;
- the two benchmarks' sizes (arith 200, arith_ood 100 problems), k = 4, and L = 8 labels (the default sweep's).

A simulated sweep has L labels on the same problems with independent seeds; label 0 is the baseline, label 1 the
tested method, the others run the baseline's method. Cells: ``aa`` (the tested method is the baseline's: true
difference 0) and ``effect`` (it adds delta_p ~ N(0.15, 0.3^2) on the logit scale, a gain that varies across
problems), at the fitted seed spread, 3x it and none; ``interaction`` (g_lsp with sd 0.5 on the logit scale, so the
seed x problem residual holds training noise too); ``noisy pair`` (the tested label's training noise 3x the other
labels': the pooling assumption broken for the pair under test); ``collapse`` (each baseline run collapses with
probability 0.1: its logit drops by 3, a run that diverged; drawn per benchmark). Issue #37's cells: ``calibrated``
(a preset's A/A calibration, the baseline alone with ``CALIBRATION_SEEDS`` seeds of the same model on the same
problems, pooled into the sweep's noise where the report's guard lets it: ``calibration.check_calibration``);
``stale calibration`` (the sweep's training sd 3x the calibration's); ``share 0.8`` (the training sd x``SHARE_SCALE``,
so that training noise is about 0.8 of a paired difference's per-seed variance on the mean, the rest sampling) with
its ``noisy pair`` and ``collapse`` variants; ``collapse to zero`` (1 baseline run in 10 drops to near-zero accuracy
on every benchmark: logit - ``ZERO_LOGIT``). Every cell records its estimated training share (``training_share``:
the pooled noise T over the per-seed variance 2 MS_LS of a paired difference, mean over draws), how often the
outlying-run rule (``outliers.outlying_runs``) flags a run, and, in the collapse cells, how often it flags a
collapsed baseline run. For S = 2, 3, 5 seeds and N_DRAWS sweeps each, per
benchmark and for the mean over benchmarks: coverage and mean half-width of the 95% interval of the tested pair's
difference under four rules (``RULES``): per-pair (``scores.crossed_variance``: the pair's own seeds, never below
the residual floor); pooled (``training_noise.pooled_training_noise`` + ``pooled_variance`` with no moderation: the
training noise pooled over the L labels, the pair's own residual); pooled with a per-pair F test at
``F_TEST_LEVEL`` for S >= 3 (a guard measured and not adopted); and the report's rule, the pooled noise moderated
toward the pair's own where the labels' seed variances spread (``labels_prior_df``, ``TrainingNoise.for_pair``).
In the calibrated cells two more rules: the report's with the calibration always pooled ('calibrated, no guard') and
with the guard ('calibrated'). The rules are computed vectorised here and the harness's ones checked against
``intervals.difference_interval`` (and ``calibration.check_calibration``, ``outliers.outlying_runs``) on the first
draws of every cell.

    nice python -m studies.interval_coverage  # ~6 minutes on 2 shared cores; writes
                                              # results/bench/interval_coverage.json (--results DIR: elsewhere)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats
from scipy.special import expit, polygamma

from bench.machine import environment
from bench.publish import add_path_args, table, update_summary, write_result
from harness.config.paths import REPO_ROOT
from harness.data.score_names import avg_at, pass_at
from harness.report.calibration import GUARD_LEVEL, check_calibration
from harness.report.intervals import difference_interval
from harness.report.outliers import ABSOLUTE_FLOOR, MAD_SCALE, OUTLIER_K, outlying_runs, scores_table
from harness.report.scores import CONFIDENCE
from harness.report.training_noise import CALIBRATED, TrainingNoise, pooled_training_noise, trigamma_inverse

EXAMPLE = REPO_ROOT / "results" / "example"
CKPT = "ckpt-100"
K = 4
SEEDS = (2, 3, 5)
N_LABELS = 8
EFFECT_LOGIT, EFFECT_SD = 0.15, 0.3
INTERACTION_SD = 0.5
NOISY_PAIR_SCALE = 3.0
COLLAPSE_RATE, COLLAPSE_LOGIT = 0.1, 3.0
ZERO_LOGIT = 8.0  # "collapse to zero": arith 23% -> 0.1%, arith_ood 2.7% -> 0.01%
SHARE_SCALE = 1.4  # the training sd's factor that puts the training share of the mean near 0.8 (measured: json)
CALIBRATION_SEEDS = 8  # as ``snakemake calibrate``
STALE_SCALE = 3.0  # the stale calibration: the sweep's training sd this many times the calibration's
F_TEST_LEVEL = 0.25  # the rejected alternative guard: a liberal per-pair F test, S >= 3 only
CHECKED_DRAWS = 20  # draws per cell on which the vectorised rules are checked against the harness's functions


@dataclass(frozen=True)
class Cell:
    """One simulated situation: see the module docstring."""

    name: str
    effect: bool = False
    seed_scale: float = 1.0
    interaction_sd: float = 0.0
    tested_scale: float = 1.0  # the tested label's training noise against the others'
    collapse_rate: float = 0.0  # baseline runs only
    collapse_logit: float = COLLAPSE_LOGIT
    collapse_shared: bool = False  # a collapsed run collapses on every benchmark (else drawn per benchmark)
    calibration_scale: float | None = None  # an A/A calibration's training sd (x the fit's); None: no calibration


CELLS = (Cell("aa"), Cell("effect", effect=True), Cell("aa, seed sd x3", seed_scale=3.0),
         Cell("aa, no seed spread", seed_scale=0.0), Cell("interaction", interaction_sd=INTERACTION_SD),
         Cell("noisy pair", tested_scale=NOISY_PAIR_SCALE), Cell("collapse", collapse_rate=COLLAPSE_RATE),
         Cell("calibrated", calibration_scale=1.0),
         Cell("stale calibration", seed_scale=STALE_SCALE, calibration_scale=1.0),
         Cell("share 0.8", seed_scale=SHARE_SCALE),
         Cell("noisy pair, share 0.8", seed_scale=SHARE_SCALE, tested_scale=NOISY_PAIR_SCALE),
         Cell("collapse, share 0.8", seed_scale=SHARE_SCALE, collapse_rate=COLLAPSE_RATE),
         Cell("collapse to zero", collapse_rate=COLLAPSE_RATE, collapse_logit=ZERO_LOGIT, collapse_shared=True))
RULES = ("per-pair", "pooled", "pooled, F test", "moderated")
CALIBRATED_RULES = ("calibrated, no guard", "calibrated")  # the calibrated cells only
REPORT_RULE = "moderated"  # ``intervals.difference_interval`` with the sweep's pooled noise
CALIBRATED_RULE = "calibrated"  # the same with a preset's A/A calibration, guarded (``calibration.check_calibration``)
# what the report quotes (harness/report/markdown.py): per simulated training share, the cell where the assumption
# holds and those where it fails; and the calibrated cells
REGIMES = {"the example's spread": {"holds": "aa", "noisy pair": "noisy pair", "collapse": "collapse",
                                    "collapse to zero": "collapse to zero"},
           "share 0.8": {"holds": "share 0.8", "noisy pair": "noisy pair, share 0.8",
                         "collapse": "collapse, share 0.8"}}
CALIBRATION_CELLS = {"matches": "calibrated", "stale": "stale calibration"}
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
WEIGHTS = WEIGHTS / np.sqrt(2 * np.pi)


def expect(fn, mu: float, sd: float) -> float:
    """E[fn(sigmoid(mu + sd z))], z ~ N(0, 1)."""
    return float(np.sum(WEIGHTS * fn(expit(mu + sd * NODES))))


def read_example() -> dict:
    sweep = json.loads((EXAMPLE / "sweep.yaml").read_text())
    out = {}
    for bench in ("arith", "arith_ood"):
        per_label = {}
        for label in sweep["methods"]:
            results = [json.loads((EXAMPLE / "eval" / label / f"seed{s}" / CKPT / bench / "results.json").read_text())
                       for s in sweep["seeds"]]
            per_label[label] = results
        every = [r for results in per_label.values() for r in results]
        out[bench] = {
            "n_problems": every[0]["n_problems"],
            "avg": float(np.mean([r["metrics"][avg_at(K)] for r in every])),
            "pass4": float(np.mean([r["metrics"][pass_at(K)] for r in every])),
            "per_seed": {lab: [r["metrics"][avg_at(K)] for r in res] for lab, res in per_label.items()},
        }
    return out


def fit_problems(avg: float, pass4: float) -> tuple[float, float]:
    """(mu, sd) of the logit-normal whose avg@4 and pass@4 are the example's."""
    def residual(params):
        mu, log_sd = params
        sd = np.exp(log_sd)
        return [expect(lambda p: p, mu, sd) - avg, expect(lambda p: 1 - (1 - p) ** K, mu, sd) - pass4]
    mu, log_sd = optimize.fsolve(residual, [np.log(avg / (1 - avg)), 0.0])
    return float(mu), float(np.exp(log_sd))


def row_spread(rng, mu, sd_problem, sd_seed, n_problems, n_draws=4000, n_seeds=2) -> float:
    """Mean within-label variance (ddof 1) of per-seed avg@4 on shared problems, simulated."""
    a = rng.normal(0, sd_problem, (n_draws, 1, n_problems))
    c = rng.normal(0, sd_seed, (n_draws, n_seeds, 1))
    rows = (rng.binomial(K, expit(mu + a + c)) / K).mean(axis=2)
    return float(rows.var(axis=1, ddof=1).mean())


def fit_seed_sd(rng, mu, sd_problem, n_problems, target_var) -> float:
    """sd_seed on the logit scale that reproduces the observed within-label variance (bisection on a grid)."""
    floor = row_spread(rng, mu, sd_problem, 0.0, n_problems)
    if target_var <= floor:
        return 0.0
    low, high = 0.0, 3.0
    for _ in range(18):
        mid = (low + high) / 2
        low, high = (mid, high) if row_spread(rng, mu, sd_problem, mid, n_problems) < target_var else (low, mid)
    return (low + high) / 2


def simulate_sweep(rng, fits, n_seeds, n_draws, cell: Cell):
    """{bench: scores (n_draws, L, S, P)} of a sweep in ``cell``, the tested pair's true difference per bench, which
    baseline runs collapsed (n_draws, S; on any benchmark) and the cell's A/A calibration, {bench: (n_draws,
    ``CALIBRATION_SEEDS``, P)} on the same problems (None without one)."""
    data, truth, calibration = {}, {}, {} if cell.calibration_scale is not None else None
    collapsed = np.zeros((n_draws, n_seeds), dtype=bool)
    shared = (rng.random((n_draws, n_seeds, 1)) < cell.collapse_rate) if cell.collapse_shared else None
    for bench, fit in fits.items():
        mu, sd_p, n = fit["mu"], fit["sd_problem"], fit["n_problems"]
        sd_s = cell.seed_scale * fit["sd_seed"]
        a = rng.normal(0, sd_p, (n_draws, 1, 1, n))
        scale = np.ones((1, N_LABELS, 1, 1))
        scale[0, 1] = cell.tested_scale
        logits = mu + a + rng.normal(0, 1, (n_draws, N_LABELS, n_seeds, 1)) * sd_s * scale
        if cell.interaction_sd:
            logits = logits + rng.normal(0, cell.interaction_sd, (n_draws, N_LABELS, n_seeds, n))
        if cell.effect:
            logits[:, 1] += rng.normal(EFFECT_LOGIT, EFFECT_SD, (n_draws, 1, n))
        if cell.collapse_rate:
            mask = shared if shared is not None else rng.random((n_draws, n_seeds, 1)) < cell.collapse_rate
            logits[:, 0] -= cell.collapse_logit * mask
            collapsed |= mask[:, :, 0]
        data[bench] = rng.binomial(K, expit(logits)) / K
        if calibration is not None:
            noise = rng.normal(0, 1, (n_draws, CALIBRATION_SEEDS, 1)) * cell.calibration_scale * fit["sd_seed"]
            calibration[bench] = rng.binomial(K, expit(mu + a[:, 0] + noise)) / K
        spread = np.sqrt(sd_p**2 + cell.interaction_sd**2)
        tested = np.hypot(spread, sd_s * cell.tested_scale)
        baseline = np.hypot(spread, sd_s)
        method_mean = (expect(lambda p: p, mu + EFFECT_LOGIT, np.hypot(tested, EFFECT_SD)) if cell.effect
                       else expect(lambda p: p, mu, tested))
        base_mean = ((1 - cell.collapse_rate) * expect(lambda p: p, mu, baseline)
                     + cell.collapse_rate * expect(lambda p: p, mu - cell.collapse_logit, baseline))
        truth[bench] = method_mean - base_mean
    return data, truth, collapsed, calibration


def parts(diffs, benches):
    """Vectorised over draws, for the mean over ``benches`` of (n, S, P_b) differences: the seed, problem and
    residual parts and the problem and residual degrees of freedom of ``scores.crossed_variance``."""
    w = 1.0 / len(benches)
    n_seeds = diffs[benches[0]].shape[1]
    rows = np.mean([diffs[b].mean(axis=2) for b in benches], axis=0)  # (n, S)
    seed = rows.var(axis=1, ddof=1) / n_seeds
    problem, residual = 0.0, 0.0
    for b in benches:
        x = diffs[b]
        n_problems = x.shape[2]
        columns = x.mean(axis=1)
        cells = x - x.mean(axis=2, keepdims=True) - columns[:, None, :] + x.mean(axis=(1, 2))[:, None, None]
        ms_resid = (cells**2).sum(axis=(1, 2)) / ((n_seeds - 1) * (n_problems - 1))
        scale = w**2 / (n_seeds * n_problems)
        problem = problem + scale * np.maximum(0.0, n_seeds * columns.var(axis=1, ddof=1) - ms_resid)
        residual = residual + scale * ms_resid
    fewest = min(diffs[b].shape[2] for b in benches)
    return seed, problem, residual, fewest - 1, (n_seeds - 1) * (fewest - 1)


def pooled_noise(sweep, benches):
    """Vectorised ``training_noise.pooled_training_noise`` over draws of {bench: (n, L, S, P)}: (T (n,), df) and
    the per-seed variance of a paired difference, 2 MS_LS (n,), whose share T is (``training_share``)."""
    w = 1.0 / len(benches)
    n_labels, n_seeds = sweep[benches[0]].shape[1:3]
    df = (n_labels - 1) * (n_seeds - 1)
    table = np.mean([sweep[b].mean(axis=3) for b in benches], axis=0)  # (n, L, S)
    ms_ls = (centred(table, (1, 2)) ** 2).sum(axis=(1, 2)) / df
    residual = 0.0
    for b in benches:
        cube = sweep[b]
        n_problems = cube.shape[3]
        interaction = centred(cube - cube.mean(axis=3, keepdims=True), (1, 2))
        residual = residual + w**2 * (interaction**2).sum(axis=(1, 2, 3)) / (df * (n_problems - 1)) / n_problems
    return np.maximum(0.0, 2 * ms_ls - 2 * residual), df, 2 * ms_ls


def row_residuals(scores, benches):
    """Vectorised ``training_noise.row_residual`` of one label's {bench: (n, ..., S, P)} scores: (n, ...)."""
    w = 1.0 / len(benches)
    out = 0.0
    for b in benches:
        x = scores[b]
        n_seeds, n_problems = x.shape[-2:]
        cells = (x - x.mean(axis=-1, keepdims=True) - x.mean(axis=-2, keepdims=True)
                 + x.mean(axis=(-2, -1), keepdims=True))
        out = out + w**2 * (cells**2).sum(axis=(-2, -1)) / ((n_seeds - 1) * (n_problems - 1)) / n_problems
    return out


def calibration_noise(calibration, benches):
    """Vectorised ``training_noise.pooled_training_noise`` of the one calibration label on ``benches``: T_c (n,),
    with ``CALIBRATION_SEEDS`` - 1 df."""
    rows = np.mean([calibration[b].mean(axis=2) for b in benches], axis=0)  # (n, seeds)
    return 2 * np.maximum(0.0, rows.var(axis=1, ddof=1) - row_residuals(calibration, benches))


def flagged_runs(sweep, benches):
    """Vectorised ``outliers.outlying_runs`` on the mean over ``benches``: flags (n, L, S)."""
    table = np.mean([sweep[b].mean(axis=3) for b in benches], axis=0)  # (n, L, S)
    n_seeds = table.shape[2]
    gaps = np.stack([table[:, :, s] - np.median(np.delete(table, s, axis=2), axis=2) for s in range(n_seeds)],
                    axis=2)
    floor = np.sqrt(2 * np.maximum(0.0, row_residuals(sweep, benches).mean(axis=1)))
    scale = np.maximum(np.maximum(MAD_SCALE * np.median(np.abs(gaps).reshape(len(gaps), -1), axis=1), floor),
                       ABSOLUTE_FLOOR)
    return gaps < -OUTLIER_K * scale[:, None, None]


def centred(x, axes):
    """x less its means over each of the two ``axes`` plus the mean over both."""
    a, b = axes
    return x - x.mean(axis=a, keepdims=True) - x.mean(axis=b, keepdims=True) + x.mean(axis=axes, keepdims=True)


def half_widths(sweep, benches, calibration=None):
    """Half-widths (n,) of the tested pair's interval under each rule (``RULES``; with a ``calibration``, also
    ``CALIBRATED_RULES``), where the report's rule moderated (the labels' seed variances spread: finite prior degrees
    of freedom), the estimated training share and where the guard refused the calibration (None without one)."""
    t, f = scipy_stats.t.ppf, scipy_stats.f.ppf
    q = 1 - (1 - CONFIDENCE) / 2
    n_seeds = sweep[benches[0]].shape[2]
    diffs = {b: sweep[b][:, 1] - sweep[b][:, 0] for b in benches}
    seed, problem, residual, df_problem, df_resid = parts(diffs, benches)
    problem_term = np.where(problem > 0, t(q, df_problem) ** 2 * problem, 0.0)
    residual_term = t(q, df_resid) ** 2 * residual

    def width(noise, df):
        return np.sqrt(problem_term + np.maximum(t(q, df) ** 2 * (noise / n_seeds + residual), residual_term))

    own = np.sqrt(problem_term + np.maximum(t(q, n_seeds - 1) ** 2 * seed, residual_term))
    noise, df, per_seed = pooled_noise(sweep, benches)
    pooled = width(noise, df)
    departs = (n_seeds >= 3) & (seed > f(1 - F_TEST_LEVEL, n_seeds - 1, df) * (noise / n_seeds + residual))
    prior = prior_df(sweep, benches)
    moderates = np.isfinite(prior)
    d0 = np.where(moderates, prior, 0.0)
    own_noise = n_seeds * (seed - residual)
    moderated_noise = np.maximum(0.0, (d0 * noise + (n_seeds - 1) * own_noise) / (d0 + n_seeds - 1))
    moderated = width(np.where(moderates, moderated_noise, noise),
                      np.where(moderates, np.minimum(d0 + n_seeds - 1, df), df))
    halves = {"per-pair": own, "pooled": pooled, "pooled, F test": np.where(departs, own, pooled),
              "moderated": moderated}
    share = np.where(per_seed > 0, noise / np.where(per_seed > 0, per_seed, 1.0), np.nan)
    refused = None
    if calibration is not None:
        external = calibration_noise(calibration, benches)
        cal_df = CALIBRATION_SEEDS - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            p = scipy_stats.f.sf(noise / external, df, cal_df)
        refused = np.where(external > 0, p < GUARD_LEVEL, noise > 0)
        combined = (df * noise + cal_df * external) / (df + cal_df)

        def moderated_width(pooled_noise_, pooled_df):
            mod = np.maximum(0.0, (d0 * pooled_noise_ + (n_seeds - 1) * own_noise) / (d0 + n_seeds - 1))
            return width(np.where(moderates, mod, pooled_noise_),
                         np.where(moderates, np.minimum(d0 + n_seeds - 1, pooled_df), pooled_df))

        halves["calibrated, no guard"] = moderated_width(combined, df + cal_df)
        halves["calibrated"] = moderated_width(np.where(refused, noise, combined),
                                               np.where(refused, df, df + cal_df))
    return halves, moderates, share, refused


def prior_df(sweep, benches):
    """Vectorised ``training_noise.labels_prior_df`` over draws: (n,), inf where the labels' seed variances spread no
    more than sampling explains."""
    n_labels, n_seeds = sweep[benches[0]].shape[1:3]
    table = np.mean([sweep[b].mean(axis=3) for b in benches], axis=0)  # (n, L, S)
    spread = n_labels / ((n_labels - 1) * (n_seeds - 1)) * (centred(table, (1, 2)) ** 2).sum(axis=2)
    shown = spread > 0  # labels without any spread are left out, as the harness leaves them out
    logs = np.log(np.where(shown, spread, 1.0))
    counts = shown.sum(axis=1)
    means = (logs * shown).sum(axis=1) / np.maximum(counts, 1)
    variances = (((logs - means[:, None]) * shown) ** 2).sum(axis=1) / np.maximum(counts - 1, 1)
    excess = np.where(counts >= 3, variances - polygamma(1, (n_seeds - 1) / 2), 0.0)
    out = np.full(excess.shape, np.inf)
    out[excess > 0] = 2 * trigamma_inverse(excess[excess > 0])
    return out


def check_against_harness(sweep, benches, halves, draws: int, calibration=None, refused=None, flags=None) -> None:
    """The vectorised rules must give the harness's intervals (``intervals.difference_interval``) draw by draw, its
    calibration guard (``calibration.check_calibration``) and its outlying runs (``outliers.outlying_runs``)."""
    for i in range(draws):
        mats = {f"l{lab}": {b: sweep[b][i, lab] for b in benches} for lab in range(N_LABELS)}
        differences = {b: mats["l1"][b] - mats["l0"][b] for b in benches}
        noise = pooled_training_noise(mats)
        checked = [("per-pair", None), ("pooled", dataclasses.replace(noise, prior_df=math.inf)), ("moderated", noise)]
        if calibration is not None:
            external = pooled_training_noise({"cal": {b: calibration[b][i] for b in benches}})
            external = TrainingNoise(external.variance, external.df, CALIBRATED)
            check = check_calibration(tuple(benches), noise, external)
            assert check.pooled != bool(refused[i]), (i, check, refused[i])
            checked += [("calibrated", noise.combined(external) if check.pooled else noise),
                        ("calibrated, no guard", noise.combined(external))]
        for rule, expected in checked:
            interval = difference_interval(differences, expected)
            half = interval.variance.half_width((1 - CONFIDENCE) / 2)
            assert abs(half - halves[rule][i]) < 1e-9, (rule, i, half, halves[rule][i])
        if flags is not None:
            labels, table, floor = scores_table(mats)
            found = {(run.label, run.seed) for run in outlying_runs(table, labels, range(table.shape[1]), floor)}
            expected_flags = {(f"l{lab}", s) for lab, s in zip(*np.nonzero(flags[i]), strict=True)}
            assert found == expected_flags, (i, found, expected_flags)


def coverage(sweep, truth, checked: int, collapsed=None, calibration=None):
    """Per benchmark and for the mean: coverage and mean half-width (points) of each rule, how often the report's
    rule moderated, and its coverage where it did not; the mean estimated training share; how often the outlying-run
    rule flags a run (on the mean over benchmarks, as the report applies it), the report's coverage where it flags
    none, and how often it flags a collapsed baseline run; with a calibration how often the guard refused it."""
    benches = sorted(sweep)
    truth = {**truth, "mean": float(np.mean([truth[b] for b in benches]))}
    flags = flagged_runs(sweep, benches)
    any_flag = flags.any(axis=(1, 2))
    out = {}
    for scope in [*benches, "mean"]:
        chosen = benches if scope == "mean" else [scope]
        estimates = np.mean([(sweep[b][:, 1] - sweep[b][:, 0]).mean(axis=(1, 2)) for b in chosen], axis=0)
        halves, moderates, share, refused = half_widths(sweep, chosen, calibration)
        check_against_harness(sweep, chosen, halves, checked, calibration, refused,
                              flags if scope == "mean" else None)
        rules = [r for r in (*RULES, *CALIBRATED_RULES) if r in halves]
        report_rule = CALIBRATED_RULE if calibration is not None else REPORT_RULE
        covers = {r: np.abs(estimates - truth[scope]) <= halves[r] for r in rules}
        out[scope] = {"truth_points": 100 * truth[scope], "moderated": float(moderates.mean()),
                      "coverage_not_moderated": float(covers[REPORT_RULE][~moderates].mean()),
                      "coverage": {r: float(covers[r].mean()) for r in rules},
                      "mean_half_width_points": {r: float(100 * halves[r].mean()) for r in rules},
                      "training_share": float(np.nanmean(share)), "flagged": float(any_flag.mean()),
                      "coverage_unflagged": float(covers[report_rule][~any_flag].mean())}
        if refused is not None:
            out[scope]["calibration_refused"] = float(refused.mean())
        if collapsed is not None and collapsed.any():
            hit = collapsed.any(axis=1)
            out[scope]["collapsed"] = float(hit.mean())
            out[scope]["flagged_collapse"] = float((flags[:, 0] & collapsed).any(axis=1)[hit].mean())
    return out


def monte_carlo_se(rate: float, draws: int) -> float:
    return math.sqrt(rate * (1 - rate) / draws)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000, help="simulated sweeps per S and cell")
    parser.add_argument("--seed", type=int, default=25)
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    example = read_example()
    fits = {}
    for bench, obs in example.items():
        mu, sd_problem = fit_problems(obs["avg"], obs["pass4"])
        pooled = float(np.mean([np.var(v, ddof=1) for v in obs["per_seed"].values()]))
        fits[bench] = {"n_problems": obs["n_problems"], "avg@4": obs["avg"], "pass@4": obs["pass4"], "mu": mu,
                       "sd_problem": sd_problem, "sd_seed": fit_seed_sd(rng, mu, sd_problem, obs["n_problems"], pooled),
                       "per_seed_sd_points_pooled_8_labels": 100 * pooled**0.5}
    results = {}
    for cell in CELLS:
        for n_seeds in SEEDS:
            sweep, truth, collapsed, calibration = simulate_sweep(rng, fits, n_seeds, args.draws, cell)
            results[f"{cell.name}/S={n_seeds}"] = coverage(sweep, truth, CHECKED_DRAWS, collapsed, calibration)
            print(f"{cell.name} S={n_seeds}: " + ", ".join(
                f"{scope} " + "/".join(f"{c['coverage'][r]:.3f}" for r in RULES)
                for scope, c in results[f"{cell.name}/S={n_seeds}"].items()), flush=True)
    record = {"name": "interval_coverage", "settings": vars(args) | {
        "k": K, "seeds": SEEDS, "labels": N_LABELS, "effect_logit": EFFECT_LOGIT, "effect_sd": EFFECT_SD,
        "interaction_sd": INTERACTION_SD, "noisy_pair_scale": NOISY_PAIR_SCALE, "collapse_rate": COLLAPSE_RATE,
        "collapse_logit": COLLAPSE_LOGIT, "zero_logit": ZERO_LOGIT, "share_scale": SHARE_SCALE,
        "stale_scale": STALE_SCALE, "calibration_seeds": CALIBRATION_SEEDS, "guard_level": GUARD_LEVEL,
        "outlier_k": OUTLIER_K, "f_test_level": F_TEST_LEVEL, "rules": RULES, "calibrated_rules": CALIBRATED_RULES,
        "report_rule": REPORT_RULE, "calibrated_rule": CALIBRATED_RULE, "regimes": REGIMES,
        "calibration_cells": CALIBRATION_CELLS, "cells": [vars(c) for c in CELLS]},
              "fits": fits, "coverage": results, "seconds": time.time() - started,
              "environment": environment(args.cpu_free_flag)}
    write_result(args.results, "interval_coverage", record)
    fit_rows = [[b, f["n_problems"], f"{100 * f['avg@4']:.1f}", f"{100 * f['pass@4']:.1f}", f"{f['mu']:.2f}",
                 f"{f['sd_problem']:.2f}", f"{f['per_seed_sd_points_pooled_8_labels']:.2f}", f"{f['sd_seed']:.3f}"]
                for b, f in fits.items()]
    fit_table = table(["bench", "P", "avg@4 %", "pass@4 %", "mu (logit)", "sd problem", "per-seed sd, pts",
                       "sd seed (logit)"], fit_rows)
    rows = [[key, scope, f"{c['truth_points']:+.2f}", *(f"{c['coverage'][r]:.3f}" for r in RULES),
             *(f"{c['mean_half_width_points'][r]:.1f}" for r in RULES),
             f"{c['moderated']:.2f}: {c['coverage_not_moderated']:.3f}"]
            for key, per_scope in results.items() for scope, c in per_scope.items()]
    coverage_table = table(["cell/S", "scope", "true Δ, pts", *(f"coverage {r}" for r in RULES),
                            *(f"mean half-width {r}, pts" for r in RULES),
                            "moderated: share, coverage of the rest"], rows)
    mean_rows = []
    for key, per_scope in results.items():
        c = per_scope["mean"]
        calibrated = "calibration_refused" in c
        mean_rows.append([
            key, f"{c['training_share']:.2f}", f"{c['coverage'][REPORT_RULE]:.3f}",
            *((f"{c['coverage'][r]:.3f}" for r in CALIBRATED_RULES) if calibrated else ("", "")),
            *((f"{c['mean_half_width_points'][r]:.1f}" for r in (REPORT_RULE, *CALIBRATED_RULES)) if calibrated
              else (f"{c['mean_half_width_points'][REPORT_RULE]:.1f}", "", "")),
            f"{c['calibration_refused']:.2f}" if calibrated else "", f"{c['flagged']:.3f}",
            f"{c['coverage_unflagged']:.3f}",
            f"{c['collapsed']:.2f}: {c['flagged_collapse']:.2f}" if "collapsed" in c else ""])
    mean_table = table(["cell/S", "training share", "coverage moderated", "coverage calibrated, no guard",
                        "coverage calibrated (guard)", "half-width moderated, pts", "calibrated, no guard",
                        "calibrated (guard)", "guard refused", "a run flagged", "coverage where none is",
                        "sweeps with a collapse: share, flagged"], mean_rows)
    body = (f"## Interval coverage (`studies/interval_coverage.py`, {args.draws} sweeps of {N_LABELS} labels per "
            "row)\n\nModel fitted to results/example (ckpt-100):\n\n" + fit_table + "\n\nCoverage of the tested "
            "pair's 95% paired-difference interval (Monte Carlo standard error sqrt(c (1 - c) / draws): "
            f"{monte_carlo_se(0.95, args.draws):.3f} at 0.95, {monte_carlo_se(0.85, args.draws):.3f} at 0.85): "
            "per-pair (the pair's own seeds); pooled (the training "
            "noise pooled over the labels, no guard); pooled, F test (S >= 3: a pair whose own seed part exceeds the "
            f"pooled one by F(S - 1, df_T) at {F_TEST_LEVEL:.0%} keeps its own); moderated (the report's rule: the "
            "pooled noise moderated toward the pair's own where the labels' seed variances spread, limma's "
            "empirical Bayes; 'moderated': how often the prior degrees of freedom were finite):\n\n"
            + coverage_table + "\n\nOn the mean over benchmarks: the estimated training share of a paired "
            "difference's per-seed variance (T / 2 MS_LS, mean over draws); with an A/A calibration of "
            f"{CALIBRATION_SEEDS} seeds, the report's rule with it always pooled and with the guard (one-sided F "
            f"test at {GUARD_LEVEL:g}: refused where the sweep's pooled noise is significantly larger) and how often "
            f"the guard refused it; how often the outlying-run rule ({OUTLIER_K:g} robust scales below the label's "
            "other seeds) flags some run of the sweep, the report's coverage (calibrated in the calibrated cells) "
            "in sweeps where it flags none, and in the collapse cells how many sweeps had a collapsed baseline run "
            "and how often one of those was flagged:\n\n" + mean_table + "\n")
    update_summary(args.results, "interval_coverage", body)
    print(body)
    print(f"{time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
