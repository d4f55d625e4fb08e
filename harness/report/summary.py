"""The statistics of the leaderboard, assembled per checkpoint, method, benchmark (or 'all') and metric.

Every interval comes from ``harness.report.bootstrap`` over the per-problem scores read from each ``samples.jsonl``,
so each cell can be traced to the generations behind it. One row of the tidy summary is one line of
``leaderboard.csv``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from harness.config.paths import WARMSTART_LABEL
from harness.data.score_names import AVG_AT_K, GREEDY
from harness.report import bootstrap, intervals, verdicts
from harness.report.calibration import CalibrationCheck, sweep_noise, sweep_noise_checked
from harness.report.evidence import WARMSTART_CKPT, Evidence, spent_at
from harness.report.outliers import OutlyingRun, outlying_runs, scores_table
from harness.report.reported import Reported
from harness.report.scores import CONFIDENCE
from harness.report.training_noise import TrainingNoise, training_share

BOOTSTRAP_SEED = 0

# ci_at_floor / diff_ci_at_floor: the t interval rests on the residual floor (``Interval.rests_on_floor``); empty
# for the percentile intervals (IQM), which have none
# diff_variance: which seed variance the Δ interval used (``training_noise.VARIANCE_BASES``); diff_p: its two-sided p;
# diff_p_holm: Holm-adjusted over the table's comparisons with the baseline, which the verdict is called from
SUMMARY_COLUMNS = ["ckpt", "budget_fraction", "method", "method_name", "bench", "metric", "statistic", "estimate",
                   "ci_low", "ci_high", "ci_at_floor", "baseline", "diff", "diff_ci_low", "diff_ci_high",
                   "diff_ci_at_floor", "diff_variance", "diff_p", "diff_p_holm", "p_improvement",
                   "p_improvement_ci_low", "p_improvement_ci_high", "verdict",
                   "rank", "reported", "n_seeds", "n_problems", "k", "temperature"]


def summarize(evidence: Evidence, reported: Reported | None = None, n_resamples: int = bootstrap.N_RESAMPLES,
              seed: int = BOOTSTRAP_SEED) -> list[dict]:
    """The tidy leaderboard: one row per (ckpt, method, bench or 'all', metric, statistic) with intervals; the Δ
    intervals pool the labels' training noise (``noise_at``)."""
    plan = bootstrap.make_plan(len(evidence.seeds), {b: len(p) for b, p in evidence.problem_ids.items()},
                               n_resamples, seed)
    one_seed = bootstrap.single_seed_plan(plan)
    baseline = evidence.baseline
    rows = []
    for ckpt, fraction in [(WARMSTART_CKPT, 0.0), *evidence.ckpts.items()]:
        labels = [WARMSTART_LABEL] if ckpt == WARMSTART_CKPT else evidence.labels
        for metric in evidence.metric_names:
            if not all((lab, ckpt, b, metric) in evidence.scores for lab in labels for b in evidence.benches):
                continue
            mats = {lab: {b: evidence.scores[(lab, ckpt, b, metric)] for b in evidence.benches} for lab in labels}
            noise = noise_at(evidence, ckpt, metric) if ckpt != WARMSTART_CKPT else {}
            rows += _holm_marked(_summary_at(evidence, ckpt, fraction, metric, mats, labels,
                                             plan if ckpt != WARMSTART_CKPT else one_seed,
                                             baseline if ckpt != WARMSTART_CKPT else None, reported, noise))
    return rows


def _summary_at(evidence: Evidence, ckpt: str, fraction: float, metric: str, mats: dict[str, dict[str, np.ndarray]],
                labels: list[str], plan: bootstrap.BootstrapPlan, baseline: str | None, reported: Reported | None,
                noise: dict[tuple[str, ...], TrainingNoise]) -> list[dict]:
    """Rows for one checkpoint and metric: per benchmark and over benchmarks, each label against the baseline."""
    benches = evidence.benches
    ranks = _separation_ranks(mats, labels, benches, noise)
    rows = []
    for label in labels:
        common = {"ckpt": ckpt, "budget_fraction": fraction, "method": label,
                  "method_name": evidence.method_name(label), "metric": metric,
                  "n_seeds": mats[label][benches[0]].shape[0], "k": 1 if metric == GREEDY else evidence.k,
                  "temperature": 0.0 if metric == GREEDY else evidence.temperature,
                  "baseline": baseline if baseline and label != baseline else None}
        spend = {f"spent/{key}": value for key, value in _mean_over_seeds(evidence, label, ckpt).items()}
        compared = baseline is not None and label != baseline
        ranked = label != WARMSTART_LABEL  # the reference row is shown, not ranked
        for bench in benches:
            x = mats[label][bench]
            row = {**common, "bench": bench, "statistic": "mean", "n_problems": x.shape[1],
                   **_interval("", intervals.mean_interval(x))}
            if compared:
                row.update(_compare_on_bench(x, mats[baseline][bench], plan, bench, noise.get((bench,))))
            value = reported.get(label, bench) if reported and metric == evidence.avg_metric else None
            rows.append({**row, "rank": ranks[bench][label] if ranked else None,
                         "reported": None if value is None else value / 100, **spend})
        n_problems = sum(mats[label][b].shape[1] for b in benches)
        for statistic, interval in bootstrap.aggregate_intervals(mats[label], plan).items():
            row = {**common, "bench": "all", "statistic": statistic, "n_problems": n_problems,
                   **_interval("", interval)}
            if compared and statistic == "mean":
                row.update(_compare_over_benches(mats[label], mats[baseline], plan, noise.get(tuple(benches))))
            rows.append({**row, "rank": ranks["all"][label] if ranked and statistic == "mean" else None,
                         "reported": None, **spend})
    return rows


def _separation_ranks(mats: dict[str, dict[str, np.ndarray]], labels: list[str], benches: list[str],
                      noise: dict[tuple[str, ...], TrainingNoise]) -> dict[str, dict[str, int]]:
    """Bench (and 'all') -> label -> rank, from the paired differences between all labels (Holm per table)."""
    pairs = [(a, b) for a in labels for b in labels if a != b]
    ranks = {bench: intervals.separation_ranks(labels, {(a, b): intervals.paired_difference(
        mats[a][bench], mats[b][bench], noise=noise.get((bench,))) for a, b in pairs}) for bench in benches}
    ranks["all"] = intervals.separation_ranks(labels, {(a, b): intervals.aggregate_difference(
        mats[a], mats[b], noise=noise.get(tuple(benches))) for a, b in pairs})
    return ranks


def _compare_on_bench(x: np.ndarray, y: np.ndarray, plan: bootstrap.BootstrapPlan, bench: str,
                      noise: TrainingNoise | None) -> dict:
    """Method ``x`` against baseline ``y`` (both (S, P)) on one benchmark: Δ, P(X > Y)."""
    difference = intervals.paired_difference(x, y, noise=noise)
    return _comparison(difference, bootstrap.improvement_interval(x, y, plan, bench))


def _compare_over_benches(x: dict[str, np.ndarray], y: dict[str, np.ndarray], plan: bootstrap.BootstrapPlan,
                          noise: TrainingNoise | None) -> dict:
    """Method ``x`` against baseline ``y`` (bench -> (S, P)) averaged over benchmarks: Δ, P(X > Y)."""
    difference = intervals.aggregate_difference(x, y, noise=noise)
    return _comparison(difference, bootstrap.aggregate_improvement(x, y, plan))


def _comparison(difference: intervals.Interval, improvement: intervals.Interval) -> dict:
    return {**_interval("diff", difference), **_interval("p_improvement", improvement),
            "diff_variance": difference.variance.basis,
            "diff_p": intervals.two_sided_p(difference)}


def _holm_marked(rows: list[dict]) -> list[dict]:
    """The verdicts of one checkpoint and metric: each table's (benchmark's, or the mean's) comparisons with the
    baseline Holm-adjusted as one family ('better' / 'worse' at adjusted p < 0.05, else 'tied')."""
    for bench in {r["bench"] for r in rows}:
        family = [r for r in rows if r["bench"] == bench and r.get("diff_p") is not None]
        adjusted = intervals.holm_adjust([r["diff_p"] for r in family])
        for row, p in zip(family, adjusted, strict=True):
            called = p < 1 - CONFIDENCE
            row.update(diff_p_holm=p, verdict=("better" if row["diff"] > 0 else "worse") if called else "tied")
    return rows


def _interval(prefix: str, interval: intervals.Interval) -> dict[str, float | bool]:
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


def noise_at(evidence: Evidence, ckpt: str, metric: str) -> dict[tuple[str, ...], TrainingNoise]:
    """The training noise pooled over the sweep's labels at ``ckpt`` per scope (``calibration.sweep_noise``), with
    the preset's A/A calibration for the sampled metric it was measured on, where its guard lets it."""
    return sweep_noise(_label_mats(evidence, ckpt, metric), evidence.calibration if metric == evidence.avg_metric
                       else None)


def _label_mats(evidence: Evidence, ckpt: str, metric: str) -> dict[str, dict[str, np.ndarray]]:
    """{label: {bench: (S, P)}} at ``ckpt`` of the labels scored on every benchmark."""
    return {lab: {b: evidence.scores[(lab, ckpt, b, metric)] for b in evidence.benches} for lab in evidence.labels
            if all((lab, ckpt, b, metric) in evidence.scores for b in evidence.benches)}


def calibration_checks(evidence: Evidence, ckpt: str) -> dict[tuple[str, ...], CalibrationCheck]:
    """Per scope the preset's calibration covers, its guard at ``ckpt`` on the sampled metric
    (``calibration.check_calibration``); empty without a calibration."""
    if evidence.calibration is None:
        return {}
    return sweep_noise_checked(_label_mats(evidence, ckpt, evidence.avg_metric), evidence.calibration)[1]


def mean_training_share(evidence: Evidence) -> float | None:
    """The training share of a paired difference's per-seed variance on the mean over benchmarks at the full budget
    (``training_noise.training_share``); None with fewer than 2 labels or seeds, or no interaction at all."""
    mats = _label_mats(evidence, evidence.final_ckpt, evidence.avg_metric)
    if len(mats) < 2 or len(evidence.seeds) < 2:
        return None
    share = training_share(mats)
    return None if np.isnan(share) else share


def outlying(evidence: Evidence, ckpt: str) -> list[OutlyingRun]:
    """The runs the outlying-run rule flags at ``ckpt`` on the sampled metric's mean over benchmarks
    (``outliers.outlying_runs``)."""
    mats = _label_mats(evidence, ckpt, evidence.avg_metric)
    if not mats or len(evidence.seeds) < 2:
        return []
    labels, table, floor = scores_table(mats)
    return outlying_runs(table, labels, evidence.seeds, floor)


def without_outlying(evidence: Evidence, ckpt: str, runs: list[OutlyingRun]
                     ) -> list[tuple[str, intervals.Interval, intervals.Interval]]:
    """Per label the flagged runs touch (every label when the baseline's run is flagged), its Δ to the baseline on
    the mean over benchmarks with every seed and without the flagged runs' seeds (dropped from every label, so the
    pairs stay paired; the training noise pooled, and guarded, anew on the seeds left)."""
    baseline = evidence.baseline
    mats = _label_mats(evidence, ckpt, evidence.avg_metric)
    if baseline is None or baseline not in mats or not runs:
        return []
    keep = [i for i, seed in enumerate(evidence.seeds) if seed not in {run.seed for run in runs}]
    if not keep:  # every seed index holds a flagged run: nothing is left to compare
        return []
    reduced = {lab: {b: m[keep] for b, m in per.items()} for lab, per in mats.items()}
    calibration = evidence.calibration
    scope = tuple(evidence.benches)
    noise, fewer = sweep_noise(mats, calibration).get(scope), sweep_noise(reduced, calibration).get(scope)
    touched = {run.label for run in runs}
    labels = [lab for lab in mats if lab != baseline and (baseline in touched or lab in touched)]
    return [(lab, intervals.aggregate_difference(mats[lab], mats[baseline], noise=noise),
             intervals.aggregate_difference(reduced[lab], reduced[baseline], noise=fewer)) for lab in labels]


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
    noise = {metric: noise_at(evidence, evidence.final_ckpt, metric) for metric in evidence.metric_names}
    reference = {(bench, metric): matrix for (label, ckpt, bench, metric), matrix in evidence.scores.items()
                 if (label, ckpt) == (WARMSTART_LABEL, WARMSTART_CKPT)}
    return verdicts.judge_claims(claims, evidence.scores, evidence.benches, evidence.final_ckpt, evidence.avg_metric,
                                 noise, reference)


@dataclass(frozen=True)
class BaselineLevel:
    """A claim's baseline: the paper's number and ours on the claim's benchmarks and metric at the full budget. A
    paper's baseline outside our 95% interval flags a protocol mismatch: a gain measured from another baseline level
    may not transfer (paper-d3s: GRPO on Qwen2.5-Math-7B at 48.5 on MATH)."""

    paper: float | None  # percent; None when the paper gives no baseline number on some benchmark of the scope
    ours: dict | None  # our baseline's summary row (estimate, ci_low, ci_high: fractions); None: not evaluated
    missing: tuple[str, ...] = ()  # benchmarks of the scope without a paper number
    unlike: str = ""  # why the paper's numbers are not comparable (another metric), when they are not

    @property
    def mismatch(self) -> bool:
        return (self.paper is not None and self.ours is not None
                and not 100 * self.ours["ci_low"] <= self.paper <= 100 * self.ours["ci_high"])


def baseline_level(claim: verdicts.Claim, evidence: Evidence, summary: list[dict],
                   reported: Reported | None) -> BaselineLevel:
    """The paper's baseline (the unweighted mean of its numbers over the claim's benchmarks) beside ours."""
    scope = list(evidence.benches) if claim.benchmark == verdicts.MEAN else [claim.benchmark]
    metric = evidence.avg_metric if claim.metric == AVG_AT_K else GREEDY
    bench = "all" if claim.benchmark == verdicts.MEAN else claim.benchmark
    rows = [r for r in summary if (r["ckpt"], r["method"], r["bench"], r["metric"], r["statistic"])
            == (evidence.final_ckpt, claim.baseline, bench, metric, "mean")]
    if claim.metric == GREEDY and reported and "greedy" not in (reported.metric or "").lower():
        return BaselineLevel(None, rows[0] if rows else None, unlike=f"its numbers are {reported.metric or 'sampled'}")
    numbers = {b: reported.get(claim.baseline, b) for b in scope} if reported else {}
    missing = tuple(b for b in scope if numbers.get(b) is None)
    paper = None if missing or not numbers else float(np.mean(list(numbers.values())))
    return BaselineLevel(paper, rows[0] if rows else None, missing if reported else ())


@dataclass(frozen=True)
class StandInMean:
    """A claim on the mean over benchmarks some of which stand in for another of the paper's (``stand_ins`` of the
    reported file: AMC23's 40 problems for the 83-problem AMC of KTAE's and GMTS's evaluation): the claim's mean as
    judged, with them, beside the mean over the claim's other benchmarks, the paper's numbers and ours over the same
    benchmarks. A paper's gain on the mean may rest in part on the benchmark ours replaces (AMC23: one problem is 2.5
    points); the mean without it shows how much."""

    dropped: tuple[str, ...]  # the stand-in benchmarks of the claim's scope
    kept: tuple[str, ...]  # the scope without them
    notes: tuple[str, ...]  # what each dropped benchmark stands in for (``Reported.stand_ins``)
    paper_with: tuple[float, float] | None  # (method, baseline): the paper's mean in percent over the whole scope
    paper_without: tuple[float, float] | None  # the same over ``kept``; None: a number of the scope is missing
    ours_with: intervals.Interval | None  # our Δ (method - baseline), fractions: the claim's interval
    ours_without: intervals.Interval | None  # the same over ``kept``; None: not evaluated
    missing: tuple[str, ...] = ()  # labels, or label/benchmark pairs, of the scope without a paper number

    @property
    def missing_without(self) -> tuple[str, ...]:
        """``missing`` on the benchmarks of the mean without the stand-ins."""
        return tuple(m for m in self.missing if "/" not in m or m.split("/", 1)[1] in self.kept)

    @staticmethod
    def paper_difference(means: tuple[float, float] | None) -> float | None:
        return None if means is None else means[0] - means[1]


def without_stand_ins(verdict: verdicts.Verdict, evidence: Evidence, reported: Reported | None) -> StandInMean | None:
    """The claim's mean over benchmarks with and without its stand-in benchmarks (``StandInMean``), for a claim on the
    mean whose scope holds a stand-in and another benchmark; None otherwise. Ours without them: the paired
    difference over the benchmarks left, with the sweep's training noise pooled over that scope (and the
    calibration where it covers it), as the claim's own interval is."""
    claim = verdict.claim
    if reported is None or not reported.stand_ins or claim.benchmark != verdicts.MEAN:
        return None
    scope = list(evidence.benches)
    dropped = tuple(b for b in scope if b in reported.stand_ins)
    kept = tuple(b for b in scope if b not in reported.stand_ins)
    if not dropped or not kept:
        return None
    missing = []  # a label without any number of the scope once, else each label/benchmark without one
    for label in (claim.method, claim.baseline):
        absent = [b for b in scope if reported.get(label, b) is None]
        missing += [label] if len(absent) == len(scope) else [f"{label}/{b}" for b in absent]

    def paper(benches) -> tuple[float, float] | None:
        values = [[reported.get(label, b) for b in benches] for label in (claim.method, claim.baseline)]
        if any(v is None for row in values for v in row):
            return None
        method, baseline = (math.fsum(row) / len(row) for row in values)
        return method, baseline

    metric = evidence.avg_metric if claim.metric == AVG_AT_K else GREEDY
    differences = verdicts.claim_differences(claim, evidence.scores, kept, evidence.final_ckpt, evidence.avg_metric)
    ours_without = None
    if differences is not None:
        mats = _label_mats(evidence, evidence.final_ckpt, metric)
        noise = sweep_noise({label: {b: per[b] for b in kept} for label, per in mats.items()},
                            evidence.calibration if metric == evidence.avg_metric else None)
        ours_without = intervals.difference_interval(differences, noise.get(tuple(sorted(kept))))
    return StandInMean(dropped, kept, tuple(f"{b}: {reported.stand_ins[b]}" for b in dropped), paper(scope),
                       paper(kept), verdict.interval, ours_without, tuple(missing))


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
                                       evidence.final_ckpt, evidence.avg_metric,
                                       noise_at(evidence, evidence.final_ckpt, evidence.avg_metric))
