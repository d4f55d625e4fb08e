"""The statistics of the leaderboard, assembled per checkpoint, method, benchmark (or 'all') and metric.

Every interval comes from ``harness.report.bootstrap`` over the per-problem scores read from each ``samples.jsonl``,
so each cell can be traced to the generations behind it. One row of the tidy summary is one line of
``leaderboard.csv``.
"""

from __future__ import annotations

import json

import numpy as np

from harness.config.paths import WARMSTART_LABEL
from harness.report import bootstrap as stats
from harness.report import verdicts
from harness.report.evidence import WARMSTART_CKPT, Evidence, spent_at
from harness.report.reported import Reported

BOOTSTRAP_SEED = 0

# ci_at_floor / diff_ci_at_floor: the t interval rests on the residual floor (``Interval.rests_on_floor``); empty
# for the percentile intervals (IQM), which have none
SUMMARY_COLUMNS = ["ckpt", "budget_fraction", "method", "method_name", "bench", "metric", "statistic", "estimate",
                   "ci_low", "ci_high", "ci_at_floor", "baseline", "diff", "diff_ci_low", "diff_ci_high",
                   "diff_ci_at_floor", "p_improvement", "p_improvement_ci_low", "p_improvement_ci_high", "verdict",
                   "rank", "reported", "n_seeds", "n_problems", "k", "temperature"]


def summarize(evidence: Evidence, reported: Reported | None = None, n_resamples: int = stats.N_RESAMPLES,
              seed: int = BOOTSTRAP_SEED) -> list[dict]:
    """The tidy leaderboard: one row per (ckpt, method, bench or 'all', metric, statistic) with intervals."""
    plan = stats.make_plan(len(evidence.seeds), {b: len(p) for b, p in evidence.problem_ids.items()},
                           n_resamples, seed)
    one_seed = stats.single_seed_plan(plan)
    baseline = evidence.baseline
    rows = []
    for ckpt, fraction in [(WARMSTART_CKPT, 0.0), *evidence.ckpts.items()]:
        labels = [WARMSTART_LABEL] if ckpt == WARMSTART_CKPT else evidence.labels
        for metric in evidence.metric_names:
            if not all((lab, ckpt, b, metric) in evidence.scores for lab in labels for b in evidence.benches):
                continue
            mats = {lab: {b: evidence.scores[(lab, ckpt, b, metric)] for b in evidence.benches} for lab in labels}
            rows += _summary_at(evidence, ckpt, fraction, metric, mats, labels,
                                plan if ckpt != WARMSTART_CKPT else one_seed,
                                baseline if ckpt != WARMSTART_CKPT else None, reported)
    return rows


def _summary_at(evidence: Evidence, ckpt: str, fraction: float, metric: str, mats: dict[str, dict[str, np.ndarray]],
                labels: list[str], plan: stats.BootstrapPlan, baseline: str | None,
                reported: Reported | None) -> list[dict]:
    """Rows for one checkpoint and metric: per benchmark and over benchmarks, each label against the baseline."""
    benches = evidence.benches
    ranks = _separation_ranks(mats, labels, benches)
    rows = []
    for label in labels:
        common = {"ckpt": ckpt, "budget_fraction": fraction, "method": label,
                  "method_name": evidence.method_name(label), "metric": metric,
                  "n_seeds": mats[label][benches[0]].shape[0], "k": 1 if metric == "greedy" else evidence.k,
                  "temperature": 0.0 if metric == "greedy" else evidence.temperature,
                  "baseline": baseline if baseline and label != baseline else None}
        spend = {f"spent/{key}": value for key, value in _mean_over_seeds(evidence, label, ckpt).items()}
        compared = baseline is not None and label != baseline
        ranked = label != WARMSTART_LABEL  # the reference row is shown, not ranked
        for bench in benches:
            x = mats[label][bench]
            row = {**common, "bench": bench, "statistic": "mean", "n_problems": x.shape[1],
                   **_interval("", stats.mean_interval(x))}
            if compared:
                row.update(_compare_on_bench(x, mats[baseline][bench], plan, bench))
            value = reported.get(label, bench) if reported and metric == evidence.avg_metric else None
            rows.append({**row, "rank": ranks[bench][label] if ranked else None,
                         "reported": None if value is None else value / 100, **spend})
        n_problems = sum(mats[label][b].shape[1] for b in benches)
        for statistic, interval in stats.aggregate_intervals(mats[label], plan).items():
            row = {**common, "bench": "all", "statistic": statistic, "n_problems": n_problems,
                   **_interval("", interval)}
            if compared and statistic == "mean":
                row.update(_compare_over_benches(mats[label], mats[baseline], plan))
            rows.append({**row, "rank": ranks["all"][label] if ranked and statistic == "mean" else None,
                         "reported": None, **spend})
    return rows


def _separation_ranks(mats: dict[str, dict[str, np.ndarray]], labels: list[str],
                      benches: list[str]) -> dict[str, dict[str, int]]:
    """Bench (and 'all') -> label -> rank, from the paired differences between all labels."""
    pairs = [(a, b) for a in labels for b in labels if a != b]
    ranks = {bench: stats.separation_ranks(labels, {(a, b): stats.paired_difference(
        mats[a][bench], mats[b][bench]) for a, b in pairs}) for bench in benches}
    ranks["all"] = stats.separation_ranks(labels, {(a, b): stats.aggregate_difference(mats[a], mats[b])
                                                   for a, b in pairs})
    return ranks


def _compare_on_bench(x: np.ndarray, y: np.ndarray, plan: stats.BootstrapPlan, bench: str) -> dict:
    """Method ``x`` against baseline ``y`` (both (S, P)) on one benchmark: Δ, P(X > Y), verdict."""
    difference = stats.paired_difference(x, y)
    improvement = stats.improvement_interval(x, y, plan, bench)
    return {**_interval("diff", difference), **_interval("p_improvement", improvement),
            "verdict": stats.verdict(difference)}


def _compare_over_benches(x: dict[str, np.ndarray], y: dict[str, np.ndarray], plan: stats.BootstrapPlan) -> dict:
    """Method ``x`` against baseline ``y`` (bench -> (S, P)) averaged over benchmarks: Δ, P(X > Y), verdict."""
    difference = stats.aggregate_difference(x, y)
    improvement = stats.aggregate_improvement(x, y, plan)
    return {**_interval("diff", difference), **_interval("p_improvement", improvement),
            "verdict": stats.verdict(difference)}


def _interval(prefix: str, interval: stats.Interval) -> dict[str, float | bool]:
    name = prefix or "estimate"
    stem = f"{prefix}_" if prefix else ""
    row = {name: interval.estimate, f"{stem}ci_low": interval.low, f"{stem}ci_high": interval.high}
    if interval.variance is not None:  # a t interval; the percentile ones have no floor
        row[f"{stem}ci_at_floor"] = interval.rests_on_floor
    return row


def _mean_over_seeds(evidence: Evidence, label: str, ckpt: str) -> dict[str, float]:
    """The realised budget at ``ckpt`` averaged over the label's seeds (keys every seed has)."""
    seeds = [0] if label == WARMSTART_LABEL else evidence.seeds
    spends = [spent_at(evidence, label, seed, ckpt) for seed in seeds]
    keys = sorted(set.intersection(*(set(s) for s in spends)))
    return {key: float(np.mean([s[key] for s in spends])) for key in keys if spends[0][key] is not None}


def calibration_pairs(evidence: Evidence) -> list[tuple[str, str]]:
    """A/A pairs: two labels running the same method with the same parameters (other seeds via seed_offset)."""
    def key(label):
        run = evidence.runs[(label, evidence.seeds[0])]["method"]
        return run["name"], json.dumps(run.get("params", {}), sort_keys=True)

    return [(a, b) for i, a in enumerate(evidence.labels) for b in evidence.labels[i + 1:] if key(a) == key(b)]


# --- claims and detectable effects (full budget) ------------------------------------------------------------------


def claim_verdicts(evidence: Evidence, reported: Reported | None) -> list[verdicts.Verdict]:
    """The paper's claims (or, without any, ``verdicts.default_claims`` against the baseline) judged at the full
    budget, with Holm's correction over them."""
    claims = reported.claims if reported and reported.claims else verdicts.default_claims(
        evidence.labels, {label: evidence.method_name(label) for label in evidence.labels}, evidence.baseline)
    return verdicts.judge_claims(claims, evidence.scores, evidence.benches, evidence.final_ckpt, evidence.avg_metric)


def training_reached(evidence: Evidence) -> dict[str, dict[str, float]]:
    """Per label, what its runs trained by the full-budget checkpoint, averaged over seeds: generation batches
    (verl's training steps), optimizer updates, rollouts generated and response tokens generated; read from each
    run.json's checkpoint spend. Labels without a trained run (released checkpoints) are absent."""
    out: dict[str, dict[str, float]] = {}
    for label in evidence.labels:
        rows = []
        for (lab, _), run in evidence.runs.items():
            spend = (run.get("budget") or {}).get("checkpoint_spend", {}).get(evidence.final_ckpt)
            if lab != label or not spend:
                continue
            train = run["config"]["preset"]["train"]
            updates = spend["budget/steps"]
            rows.append({"batches": updates / (train["mini_batches"] * train["ppo_epochs"]), "updates": updates,
                         "rollouts": spend["budget/samples_total"], "tokens": spend["tokens/generated_total"]})
        if rows:
            out[label] = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
    return out


def detectability(evidence: Evidence) -> list[dict]:
    """Per label against the baseline, per benchmark and the mean: variance components of the paired difference
    and the effect this sweep's seeds x problems detect at 80% power (``verdicts.detectability_rows``)."""
    return verdicts.detectability_rows(evidence.scores, evidence.labels, evidence.baseline, evidence.benches,
                                       evidence.final_ckpt, evidence.avg_metric)
