"""Coverage of the leaderboard's paired-difference intervals with few seeds, by simulation (issue #16).

The model is fitted to the committed default sweep (results/example/, ckpt-100; per-problem samples are not
committed, so only the per-seed results.json):

- problems: P(correct) = sigmoid(mu_b + a_p + c_s), a_p ~ N(0, sd_problem_b^2): (mu_b, sd_problem_b) match the
  runs' mean avg@4 and pass@4 on benchmark b (logit-normal moments by Gauss-Hermite quadrature);
- seeds: c_s ~ N(0, sd_seed_b^2), sd_seed_b chosen so that the simulated spread of one label's per-seed avg@4 (same
  problems, k = 4 samples) equals the spread in the example, pooled over its 8 labels (8 x 1 degrees of freedom);
  the A/A pair's own spread is printed beside it as a check;
- the two benchmarks' sizes (arith 200, arith_ood 100 problems) and k = 4.

Scenarios, each a pair of labels on the same problems with independent seeds (as the A/A pair's seed_offset):
``aa`` (identical methods: the true difference is 0) and ``effect`` (the method adds delta_p ~ N(0.15, 0.3^2) on the
logit scale, a gain that varies across problems; the true difference is its expectation over problems and seeds).
``aa`` is repeated with the seed sd 3x the fitted one (training randomness dominating the problem sampling), 1/3 of
it and 0 (the seed x problem residual dominating, so that two seeds' means often agree by chance: where the earlier
t interval collapsed). For S = 2, 3, 5 seeds and N_DRAWS simulated sweeps each, per benchmark and for the mean over
benchmarks: the coverage and mean half-width of the 95% paired-difference interval under each rule weighed in
``harness.report.bootstrap`` (its module docstring): the percentile interval of the crossed Rao-Wu bootstrap (1000
resamples), the earlier t interval (seed part at t_{S-1}), the split rule (seed excess over the residual at t_{S-1},
residual at t_{(S-1)(P-1)}), the standard estimator with Satterthwaite's degrees of freedom floored at the residual
part, and the interval now shipped; and the coverage among the draws where the earlier t interval collapsed.

    python bench/interval_coverage.py            # ~3 minutes on 2 cores; writes results/bench/interval_coverage.json
                                                 # (--results DIR: elsewhere)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import optimize
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_path_args, environment, table, update_summary, write_result  # noqa: E402

from harness.config.paths import REPO_ROOT  # noqa: E402
from harness.report import bootstrap as stats  # noqa: E402

EXAMPLE = REPO_ROOT / "results" / "example"
CKPT = "ckpt-100"
K = 4
SEEDS = (2, 3, 5)
EFFECT_LOGIT, EFFECT_SD = 0.15, 0.3
# (scenario, seed sd as a multiple of the fitted one): the example's spread, 3x it (training randomness dominating),
# a third of it and none at all (the residual dominating: two seeds' means often agree by chance)
SCENARIOS = (("aa", 1.0), ("effect", 1.0), ("aa", 3.0), ("aa", 1 / 3), ("aa", 0.0))
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
            "avg": float(np.mean([r["metrics"]["avg@4"] for r in every])),
            "pass4": float(np.mean([r["metrics"]["pass@4"] for r in every])),
            "per_seed": {lab: [r["metrics"]["avg@4"] for r in res] for lab, res in per_label.items()},
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


def simulate_pair(rng, fits, n_seeds, n_draws, scenario, seed_scale=1.0):
    """{bench: (method, baseline) scores (n_draws, S, P)} and the true paired difference per bench."""
    data, truth = {}, {}
    for bench, fit in fits.items():
        mu, sd_p, sd_s, n = fit["mu"], fit["sd_problem"], seed_scale * fit["sd_seed"], fit["n_problems"]
        a = rng.normal(0, sd_p, (n_draws, 1, n))
        base = rng.binomial(K, expit(mu + a + rng.normal(0, sd_s, (n_draws, n_seeds, 1)))) / K
        shift = 0.0 if scenario == "aa" else rng.normal(EFFECT_LOGIT, EFFECT_SD, (n_draws, 1, n))
        method = rng.binomial(K, expit(mu + a + shift + rng.normal(0, sd_s, (n_draws, n_seeds, 1)))) / K
        data[bench] = (method, base)
        both = np.hypot(sd_p, sd_s)
        truth[bench] = 0.0 if scenario == "aa" else (expect(lambda p: p, mu + EFFECT_LOGIT, np.hypot(both, EFFECT_SD))
                                                     - expect(lambda p: p, mu, both))
    return data, truth


def mean_squares(diffs, benches):
    """Vectorised over draws, for the mean over ``benches`` of (n, S, P_b) differences: the seed part var_s(R_s) / S
    and, per benchmark, (w^2 MS_problem / (S P), w^2 MS_resid / (S P), P - 1, (S - 1)(P - 1))."""
    w = 1.0 / len(benches)
    n_seeds = diffs[benches[0]].shape[1]
    rows = np.mean([diffs[b].mean(axis=2) for b in benches], axis=0)  # (n, S)
    seed = rows.var(axis=1, ddof=1) / n_seeds
    per_bench = []
    for b in benches:
        x = diffs[b]
        n_problems = x.shape[2]
        columns = x.mean(axis=1)
        cells = x - x.mean(axis=2, keepdims=True) - columns[:, None, :] + x.mean(axis=(1, 2))[:, None, None]
        df_resid = (n_seeds - 1) * (n_problems - 1)
        scale = w**2 / (n_seeds * n_problems)
        per_bench.append((scale * n_seeds * columns.var(axis=1, ddof=1),
                          scale * (cells**2).sum(axis=(1, 2)) / df_resid, n_problems - 1, df_resid))
    return seed, per_bench


def candidate_half_widths(seed, per_bench, n_seeds):
    """Half-widths (n,) of the rules weighed against each other (the module docstring of harness.report.bootstrap):
    'old t' (seed part MS_seed / (S P) at t_{S-1}, problem part at t_{P-1}, in quadrature), 'split' (the seed excess
    max(0, seed - residual) at t_{S-1}, the residual at t_{(S-1)(P-1)}, the problem part, in quadrature) and
    'Satterthwaite' ((MS_seed + MS_problem - MS_resid) / (S P) with Satterthwaite's df, floored at the residual part
    with its own df)."""
    t = stats.scipy_stats.t.ppf
    problem = sum(np.maximum(0.0, p - r) for p, r, _, _ in per_bench)
    residual = sum(r for _, r, _, _ in per_bench)
    df_problem = min(d for _, _, d, _ in per_bench)
    df_resid = min(d for _, _, _, d in per_bench)
    old = np.sqrt(t(0.975, n_seeds - 1) ** 2 * seed + t(0.975, df_problem) ** 2 * problem)
    split = np.sqrt(t(0.975, n_seeds - 1) ** 2 * np.maximum(0.0, seed - residual) + t(0.975, df_resid) ** 2 * residual
                    + t(0.975, df_problem) ** 2 * problem)
    linear = seed + sum(p - r for p, r, _, _ in per_bench)
    df_linear = linear**2 / (seed**2 / (n_seeds - 1) + sum(p**2 / dp + r**2 / dr for p, r, dp, dr in per_bench))
    floored = linear < residual
    satterthwaite = np.where(floored, t(0.975, df_resid) * np.sqrt(residual),
                             t(0.975, np.where(floored, 1.0, df_linear)) * np.sqrt(np.maximum(linear, residual)))
    # where the old interval collapsed: narrower than the residual part alone implies
    collapsed = t(0.975, n_seeds - 1) ** 2 * seed < t(0.975, df_resid) ** 2 * residual
    return {"old t": old, "split": split, "Satterthwaite": satterthwaite}, collapsed


RULES = ("bootstrap", "old t", "split", "Satterthwaite", "new")


def coverage(data, truth, n_seeds, n_resamples, seed):
    """Per benchmark and for the mean: coverage and mean half-width (points) of each rule, and coverage among the
    draws where the old t interval collapsed (its seed part at t_{S-1} below the residual part at t_{(S-1)(P-1)}:
    two seeds' means that agree by chance)."""
    benches = sorted(data)
    n_draws = data[benches[0]][0].shape[0]
    plan = stats.make_plan(n_seeds, {b: data[b][0].shape[2] for b in benches}, n_resamples, seed)
    diffs = {b: data[b][0] - data[b][1] for b in benches}
    replicates = {b: stats.bootstrap_means(diffs[b], plan.seed_weights, plan.problem_weights[b]) for b in benches}
    replicates["mean"] = np.mean([replicates[b] for b in benches], axis=0)
    truth = {**truth, "mean": float(np.mean([truth[b] for b in benches]))}
    out = {}
    for scope in [*benches, "mean"]:
        chosen = benches if scope == "mean" else [scope]
        estimates = np.mean([diffs[b].mean(axis=(1, 2)) for b in chosen], axis=0)
        low, high = stats.percentile_bounds(replicates[scope])
        halves, collapsed = candidate_half_widths(*mean_squares(diffs, chosen), n_seeds)
        halves = {"bootstrap": (high - low) / 2, **halves}
        covers = {"bootstrap": (low <= truth[scope]) & (truth[scope] <= high)}
        for rule, half in halves.items():
            if rule != "bootstrap":
                covers[rule] = np.abs(estimates - truth[scope]) <= half
        new_covers, new_halves = np.empty(n_draws, dtype=bool), np.empty(n_draws)
        for i in range(n_draws):  # the interval the harness ships, draw by draw
            variance = stats.crossed_variance({b: diffs[b][i] for b in chosen})
            interval = stats.t_interval(float(estimates[i]), variance)
            new_covers[i], new_halves[i] = interval.covers(truth[scope]), (interval.high - interval.low) / 2
        covers["new"], halves["new"] = new_covers, new_halves
        seed, per_bench = mean_squares(diffs, chosen)
        out[scope] = {"truth_points": 100 * truth[scope], "collapsed_share": float(collapsed.mean()),
                      # E[seed part] / E[residual part] = 1 + P sigma_seed^2 / sigma_resid^2: 1 without training
                      # randomness, large where it dominates
                      "seed_to_residual": float(seed.mean() / sum(r for _, r, _, _ in per_bench).mean()),
                      "coverage": {r: float(covers[r].mean()) for r in RULES},
                      "coverage_when_collapsed": {r: float(covers[r][collapsed].mean()) if collapsed.any() else None
                                                  for r in RULES},
                      "mean_half_width_points": {r: float(100 * halves[r].mean()) for r in RULES}}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="simulated sweeps per S and scenario")
    parser.add_argument("--resamples", type=int, default=1000, help="resamples of the (earlier) bootstrap interval")
    parser.add_argument("--seed", type=int, default=16)
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    example = read_example()
    fits = {}
    for bench, obs in example.items():
        mu, sd_problem = fit_problems(obs["avg"], obs["pass4"])
        per_seed = obs["per_seed"]
        pooled = float(np.mean([np.var(v, ddof=1) for v in per_seed.values()]))
        aa = float(np.var(np.subtract(per_seed["uniform-aa"], per_seed["uniform"]), ddof=1) / 2)
        sd_seed = fit_seed_sd(rng, mu, sd_problem, obs["n_problems"], pooled)
        fits[bench] = {"n_problems": obs["n_problems"], "avg@4": obs["avg"], "pass@4": obs["pass4"], "mu": mu,
                       "sd_problem": sd_problem, "sd_seed": sd_seed,
                       "per_seed_sd_points_pooled_8_labels": 100 * pooled**0.5,
                       "per_seed_sd_points_from_aa_pair": 100 * aa**0.5}
    results = {}
    for scenario, scale in SCENARIOS:
        for n_seeds in SEEDS:
            data, truth = simulate_pair(rng, fits, n_seeds, args.draws, scenario, scale)
            name = scenario if scale == 1.0 else f"{scenario}, seed sd x{scale:.2g}"
            results[f"{name}/S={n_seeds}"] = coverage(data, truth, n_seeds, args.resamples, args.seed + n_seeds)
    record = {"name": "interval_coverage", "settings": vars(args) | {"k": K, "seeds": SEEDS,
                                                                     "effect_logit": EFFECT_LOGIT,
                                                                     "effect_sd": EFFECT_SD},
              "fits": fits, "coverage": results, "seconds": time.time() - started,
              "environment": environment(args.cpu_free_flag)}
    write_result(args.results, "interval_coverage", record)
    fit_rows = [[b, f["n_problems"], f"{100 * f['avg@4']:.1f}", f"{100 * f['pass@4']:.1f}", f"{f['mu']:.2f}",
                 f"{f['sd_problem']:.2f}", f"{f['per_seed_sd_points_pooled_8_labels']:.2f} "
                 f"(A/A pair {f['per_seed_sd_points_from_aa_pair']:.2f})", f"{f['sd_seed']:.3f}"]
                for b, f in fits.items()]
    fit_table = table(["bench", "P", "avg@4 %", "pass@4 %", "mu (logit)", "sd problem", "per-seed sd, pts",
                       "sd seed (logit)"], fit_rows)
    rows = []
    for key, per_scope in results.items():
        for scope, c in per_scope.items():
            collapsed = c["coverage_when_collapsed"]
            rows.append([key, scope, f"{c['truth_points']:+.2f}", f"{c['seed_to_residual']:.1f}",
                         *(f"{c['coverage'][r]:.3f}" for r in RULES),
                         f"{c['collapsed_share']:.2f}: " + " / ".join(
                             "-" if collapsed[r] is None else f"{collapsed[r]:.2f}" for r in ("old t", "new")),
                         *(f"{c['mean_half_width_points'][r]:.1f}" for r in ("old t", "split", "new"))])
    coverage_table = table(["scenario/S", "scope", "true Δ, pts", "seed / residual part",
                            *(f"coverage {r}" for r in RULES), "old t collapsed: share, coverage old t / new",
                            "mean half-width old t, pts", "split", "new"], rows)
    body = (f"## Interval coverage (`bench/interval_coverage.py`, {args.draws} sweeps per row)\n\n"
            "Model fitted to results/example (ckpt-100):\n\n" + fit_table + "\n\nPaired-difference coverage of the "
            "95% interval under each rule (`new`: the one in harness/report/bootstrap.py); 'old t collapsed': the "
            "draws whose old t interval is narrower than the residual part alone implies (two seeds' means agreeing "
            "by chance), where old and new differ:\n\n"
            + coverage_table + "\n")
    update_summary(args.results, "interval_coverage", body)
    print(body)
    print(f"{time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
