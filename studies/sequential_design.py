"""The group-sequential seed design of ``harness extend-seeds`` (harness/report/sequential.py), simulated: is the
family-wise error held, and how many seeds does it save against the fixed design of the same power (issue #25)?

Model: m improvement claims against one baseline, each judged on its label's paired difference with the baseline.
Per seed a label's difference row is delta + N(0, sigma^2) (sigma: the sd of one seed's benchmark-averaged paired
difference, training noise and residual together; default 1.6 points, the committed example's pooled training noise
0.94 points with its residual share 1.3), treated as known (z statistics: the pooled noise has many degrees of
freedom). Schedule: stages of seeds ``--first``, + ``--add``, ... up to ``--max-seeds``; at each look a claim is
decided when its one-sided p (reproduce: H0 delta <= 0; contradict: H0 delta >= claim) falls below the look's
nominal level of ``sequential.nominal_levels`` at alpha / 2 / m; open labels and the baseline get the next stage.
Scenarios: every delta 0 (a 'reproduced' is an error), every delta at the claim (a 'contradicted' is an error, and
'reproduced' is power), and half at the claim, half at 0. The fixed design: the fewest seeds per label whose one-look
test at alpha / 2 / m reaches the sequential design's power at the claim. Seeds are counted per label, the
baseline's included (it runs as long as any claim is open).

    python -m studies.sequential_design     # seconds; writes results/bench/sequential_design.json
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from scipy import stats as scipy_stats

from bench.machine import environment
from bench.publish import add_path_args, table, update_summary, write_result
from harness.report.sequential import nominal_levels, stage_seeds

ALPHA = 0.05  # two one-sided tests at 2.5% each: the verdicts' level


def simulate(deltas: np.ndarray, claim: float, sigma: float, schedule: list[int], draws: int,
             rng: np.random.Generator) -> dict:
    """Sequential looks for claims with true ``deltas`` (m,): error and power shares, seeds per label used."""
    m = len(deltas)
    levels = np.array(nominal_levels([s / schedule[-1] for s in schedule], ALPHA / 2 / m))
    rows = rng.normal(deltas[None, :, None], sigma, (draws, m, schedule[-1]))  # per seed difference rows
    open_ = np.ones((draws, m), dtype=bool)
    reproduced = np.zeros((draws, m), dtype=bool)
    contradicted = np.zeros((draws, m), dtype=bool)
    seeds_used = np.zeros((draws, m))
    baseline_seeds = np.zeros(draws)
    for n_seeds, level in zip(schedule, levels, strict=True):
        se = sigma / np.sqrt(n_seeds)
        estimate = rows[:, :, :n_seeds].mean(axis=2)
        p_reproduce = scipy_stats.norm.sf(estimate / se)
        p_contradict = scipy_stats.norm.cdf((estimate - claim) / se)
        seeds_used[open_] = n_seeds
        baseline_seeds[open_.any(axis=1)] = n_seeds
        reproduced |= open_ & (p_reproduce < level)
        contradicted |= open_ & (p_contradict < level)
        open_ &= ~((p_reproduce < level) | (p_contradict < level))
    return {"reproduced": reproduced, "contradicted": contradicted,
            "seeds_per_label": (seeds_used.sum(axis=1) + baseline_seeds) / (m + 1)}


def fixed_seeds(claim: float, sigma: float, m: int, power: float, limit: int = 200) -> int | None:
    """The fewest seeds of a one-look design at alpha / 2 / m with ``power`` at delta = claim."""
    z = scipy_stats.norm.isf(ALPHA / 2 / m)
    for n_seeds in range(2, limit + 1):
        if scipy_stats.norm.sf(z - claim / (sigma / np.sqrt(n_seeds))) >= power:
            return n_seeds
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=6, help="improvement claims against the baseline (m)")
    parser.add_argument("--claim", type=float, default=2.0, help="each claim's effect, points")
    parser.add_argument("--sigma", type=float, default=1.6, help="sd of one seed's paired difference, points")
    parser.add_argument("--first", type=int, default=2)
    parser.add_argument("--add", type=int, default=2)
    parser.add_argument("--max-seeds", type=int, default=12)
    parser.add_argument("--draws", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=25)
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    schedule = stage_seeds(args.first, args.add, args.max_seeds)
    m, claim = args.claims, args.claim
    half = np.array([claim] * (m // 2) + [0.0] * (m - m // 2))
    scenarios = {"all null": np.zeros(m), "all at the claim": np.full(m, claim), "half at the claim": half}
    results = {}
    for name, deltas in scenarios.items():
        out = simulate(deltas, claim, args.sigma, schedule, args.draws, rng)
        null, at_claim = deltas == 0, deltas == claim
        power = float(out["reproduced"][:, at_claim].mean()) if at_claim.any() else None
        fixed = fixed_seeds(claim, args.sigma, m, power) if power else None
        results[name] = {
            "family_error": float((out["reproduced"][:, null].any(axis=1)
                                   | out["contradicted"][:, at_claim].any(axis=1)).mean()),
            "power_at_claim": power, "expected_seeds_per_label": float(out["seeds_per_label"].mean()),
            "fixed_design_seeds_same_power": fixed}
    record = {"name": "sequential_design", "settings": vars(args) | {"alpha": ALPHA, "schedule": schedule},
              "nominal_levels": nominal_levels([s / schedule[-1] for s in schedule], ALPHA / 2 / m),
              "results": results, "seconds": time.time() - started, "environment": environment(args.cpu_free_flag)}
    write_result(args.results, "sequential_design", record)
    rows = [[name, f"{r['family_error']:.4f}", "" if r["power_at_claim"] is None else f"{r['power_at_claim']:.3f}",
             f"{r['expected_seeds_per_label']:.2f}", r["fixed_design_seeds_same_power"] or ""]
            for name, r in results.items()]
    body = (f"## Sequential seed design (`studies/sequential_design.py`, {args.draws} simulated sweeps per row)\n\n"
            f"{m} claims of +{claim:g} points against one baseline, per-seed sd of a paired difference "
            f"{args.sigma:g} points, stages {schedule} seeds, Lan-DeMets O'Brien-Fleming spending of "
            f"{ALPHA / 2:g} / {m} per test (nominal levels "
            + ", ".join(f"{x:.2e}" for x in record["nominal_levels"]) + "). Family error: any wrong 'reproduced' "
            "(a claim at 0) or 'contradicted' (a claim at its effect); the target is at most 0.025 each way.\n\n"
            + table(["scenario", "family error", "power at the claim", "expected seeds per label (baseline incl.)",
                     "fixed design, same power: seeds per label"], rows) + "\n")
    update_summary(args.results, "sequential_design", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
