"""Leaderboard: the sweep's evaluations as tables with confidence intervals, figures, token highlights and provenance.

Outputs under ``results/<sweep>/``:
  * ``leaderboard.md``: renders on GitHub; per checkpoint (budget fraction) a ranked table over benchmarks, then one
    table per benchmark, the figures, the realised budget per run and the definitions;
  * ``leaderboard.csv``: tidy, one row per (checkpoint, method, benchmark or ``all``, metric, statistic);
  * ``leaderboard_runs.csv``: one row per run x checkpoint x benchmark, naming the ``results.json`` it came from;
  * ``leaderboard.json``: the resolved config, both tables and the statistics settings;
  * ``report.html``: self-contained (inline CSS, figures as data URIs, no script): the tables, figures, token
    highlights on fixed rollouts, reported numbers and provenance;
  * ``figures/*.png``: the figures of the report.

Every interval comes from ``harness.report.bootstrap`` over the per-problem scores read from each ``samples.jsonl``,
so each
cell can be traced to the generations behind it. The numbers in ``results.json`` are kept in the runs table.

Reported numbers: an optional ``configs/reported/<sweep name>.yaml`` (JSON is YAML too) holds what a paper reports,
in percent, beside a protocol note (format in ``configs/reported/README.md``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.config.paths import CONFIG_DIR, WARMSTART_LABEL, SweepPaths, checkpoint_name
from harness.config.schema import ConfigError, Resolved
from harness.data.files import write_json_atomic
from harness.report import bootstrap as stats

WARMSTART_CKPT = "ckpt-000"
BASELINE_METHOD = "uniform"  # the registered name every difference is taken against
BOOTSTRAP_SEED = 0
N_HIGHLIGHT_ROLLOUTS = 6


# --- reading the sweep --------------------------------------------------------------------------------------------


@dataclass
class Evidence:
    """Everything the report shows, read once from the sweep's files."""

    labels: list[str]  # method labels, sweep order
    seeds: list[int]
    ckpts: dict[str, float]  # checkpoint name -> budget fraction, in budget order
    benches: list[str]
    k: int
    temperature: float
    problem_ids: dict[str, list[str]]  # bench -> the problems every run was scored on
    scores: dict[tuple[str, str, str, str], np.ndarray]  # (label, ckpt, bench, metric) -> (S, P)
    runs: dict[tuple[str, int], dict]  # (label, seed) -> run.json
    metrics: dict[tuple[str, int], list[dict]]  # (label, seed) -> metrics.jsonl records
    results: dict[tuple[str, int, str, str], dict]  # (label, seed, ckpt, bench) -> results.json
    run_rows: list[dict] = field(default_factory=list)  # one per (label, seed, ckpt, bench)
    failures: list[dict] = field(default_factory=list)  # runs left out: label, seed, stage, error head, log

    @property
    def metric_names(self) -> list[str]:
        return sorted({key[3] for key in self.scores}, key=lambda m: (m != self.avg_metric, m))

    @property
    def avg_metric(self) -> str:
        return f"avg@{self.k}"

    @property
    def final_ckpt(self) -> str:
        return list(self.ckpts)[-1]

    def method_name(self, label: str) -> str:
        runs = [run for (lab, _), run in self.runs.items() if lab == label]
        return runs[0]["method"]["name"] if runs else label

    @property
    def baseline(self) -> str | None:
        """The label differences are taken against: ``uniform`` itself, else the first label running uniform."""
        if BASELINE_METHOD in self.labels:
            return BASELINE_METHOD
        return next((lab for lab in self.labels if self.method_name(lab) == BASELINE_METHOD), None)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"report: missing {path}; run the sweep (snakemake) first")
    return json.loads(path.read_text(encoding="utf-8"))


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"report: missing {path}; run the sweep (snakemake) first")
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _samples(path: Path) -> list[dict]:
    rows = _read_jsonl(path)
    for row in rows:  # tolerate either spelling of the problem key
        if "id" not in row:
            row["id"] = row["problem_id"]
    return rows


def error_head(log: Path, max_lines: int = 3) -> str:
    """The last error a job's log shows (the exception line of its last traceback, or the harness's own
    ``error:`` line), for the report's list of failed runs."""
    if not log.is_file():
        return "no log: the job did not run (an upstream job failed or the sweep was interrupted)"
    lines = [line.rstrip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    marks = [i for i, line in enumerate(lines)
             if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line) or ": error:" in line or "Killed" in line]
    if not marks:
        return (lines[-1] if lines else "empty log")[:500]
    return " | ".join(lines[marks[-1]:marks[-1] + max_lines])[:500]


def find_failures(resolved: Resolved, paths: SweepPaths, ckpts: list[str], benches: list[str]) -> list[dict]:
    """Runs whose training or evaluation outputs are missing, with the head of the error in their log."""
    failures = []
    for label in resolved.sweep.methods:
        for seed in resolved.sweep.seeds:
            if not (paths.run_dir(label, seed) / "run.json").is_file():
                log = paths.root / "logs" / "train" / f"{label}_seed{seed}.log"
                failures.append({"label": label, "seed": seed, "stage": "train", "error": error_head(log),
                                 "log": str(log.relative_to(paths.root))})
                continue
            for ckpt in ckpts:
                if not all((paths.eval_dir(label, seed, ckpt, b) / "results.json").is_file() for b in benches):
                    log = paths.root / "logs" / "eval" / f"{label}_seed{seed}_{ckpt}.log"
                    failures.append({"label": label, "seed": seed, "stage": f"eval {ckpt}", "error": error_head(log),
                                     "log": str(log.relative_to(paths.root))})
    return failures


def read_sweep(resolved: Resolved, paths: SweepPaths) -> Evidence:
    """The sweep's evidence. A label with any failed run (missing run.json or eval results) is left out of the
    statistics, which pair seeds across labels, and listed with the head of its error (``snakemake -k`` finishes
    the other jobs; ``harness report`` then renders what completed)."""
    sweep, preset = resolved.sweep, resolved.preset
    ckpts = {checkpoint_name(f): f for f in sorted(preset.train.budget.checkpoint_fractions)}
    benches = sorted(preset.eval.benchmarks)
    failures = find_failures(resolved, paths, list(ckpts), benches)
    failed_labels = {f["label"] for f in failures}
    sweep = dataclasses.replace(sweep, methods=[m for m in sweep.methods if m not in failed_labels])
    if not sweep.methods:
        raise ValueError("report: every method label has a failed run: " + "; ".join(
            f"{f['label']}/seed{f['seed']} {f['stage']}: {f['error']}" for f in failures))
    runs, metrics = {}, {}
    for label in sweep.methods:
        for seed in sweep.seeds:
            runs[(label, seed)] = _read_json(paths.run_dir(label, seed) / "run.json")
            metrics_file = paths.run_dir(label, seed) / "metrics.jsonl"
            metrics[(label, seed)] = _read_jsonl(metrics_file) if metrics_file.is_file() else []
    evaluated = [(WARMSTART_LABEL, 0, WARMSTART_CKPT)]
    evaluated += [(label, seed, ckpt) for label in sweep.methods for seed in sweep.seeds for ckpt in ckpts]
    results, per_problem = {}, {}
    for label, seed, ckpt in evaluated:
        for bench in benches:
            folder = paths.eval_dir(label, seed, ckpt, bench)
            results[(label, seed, ckpt, bench)] = _read_json(folder / "results.json")
            rows = _samples(folder / "samples.jsonl")
            per_problem[(label, seed, ckpt, bench)] = {"sampled": stats.per_problem_scores(rows, "sampled"),
                                                       "greedy": stats.per_problem_scores(rows, "greedy")}
    ks = {r["k"] for r in results.values()}
    temperatures = {r["temperature"] for r in results.values()}
    if len(ks) != 1 or len(temperatures) != 1:
        raise ValueError(f"report: evaluations disagree on the protocol (k {sorted(ks)}, temperature "
                         f"{sorted(temperatures)}); rerun the stale ones")
    k, temperature = ks.pop(), temperatures.pop()
    # The problems of a benchmark: those gradable in every run, so every matrix is paired column by column.
    problem_ids = {}
    for bench in benches:
        sets = [set(v["sampled"]) for key, v in per_problem.items() if key[3] == bench]
        problem_ids[bench] = sorted(set.intersection(*sets))
        if not problem_ids[bench]:
            raise ValueError(f"report: benchmark {bench!r} has no problem scored in every run")
    scores = {}
    groups = [(WARMSTART_LABEL, [0], [WARMSTART_CKPT])] + [(lab, list(sweep.seeds), list(ckpts))
                                                          for lab in sweep.methods]
    for label, seeds, ckpt_names in groups:
        for ckpt in ckpt_names:
            for bench in benches:
                cells = [per_problem[(label, seed, ckpt, bench)] for seed in seeds]
                scores[(label, ckpt, bench, f"avg@{k}")] = stats.score_matrix([c["sampled"] for c in cells],
                                                                              problem_ids[bench])
                if all(set(problem_ids[bench]) <= set(c["greedy"]) for c in cells):
                    scores[(label, ckpt, bench, "greedy")] = stats.score_matrix([c["greedy"] for c in cells],
                                                                                problem_ids[bench])
    evidence = Evidence(list(sweep.methods), list(sweep.seeds), ckpts, benches, k, temperature, problem_ids, scores,
                        runs, metrics, results, failures=failures)
    evidence.run_rows = [_run_row(evidence, label, seed, ckpt, bench, per_problem[(label, seed, ckpt, bench)],
                                  paths) for label, seed, ckpt in evaluated for bench in benches]
    return evidence


def spent_at(evidence: Evidence, label: str, seed: int, ckpt: str) -> dict[str, float]:
    """Realised budget of one run at one checkpoint: optimizer steps, and every ``*_total`` counter of
    ``metrics.jsonl`` (tokens generated/forwarded/weighted; FLOPs and seconds when the trainer logs them) at that
    step. The warm start spent nothing."""
    if label == WARMSTART_LABEL:
        return {"steps": 0}
    run = evidence.runs[(label, seed)]
    step = run["budget"]["checkpoints"].get(ckpt)
    spent: dict[str, float] = {"steps": step}
    record = next((m for m in evidence.metrics[(label, seed)] if m.get("step") == step), None)
    if record is not None:
        spent.update({key.removesuffix("_total"): value for key, value in record.items()
                      if key.endswith("_total") and isinstance(value, int | float)})
    elif ckpt == checkpoint_name(1.0):  # no per-step log: the run's totals are the full-budget spend
        spent.update({f"tokens/{key.removesuffix('_tokens')}": value for key, value in run["counters"].items()
                      if key.endswith("_tokens") and isinstance(value, int | float)})
    return spent


def _run_row(evidence: Evidence, label, seed, ckpt, bench, per_problem: dict, paths: SweepPaths) -> dict:
    results = evidence.results[(label, seed, ckpt, bench)]
    k, metrics = results["k"], results["metrics"]
    sampled, greedy = per_problem["sampled"], per_problem["greedy"]
    row = {"method": label, "seed": seed, "ckpt": ckpt, "bench": bench, "n_problems": len(sampled), "k": k,
           "temperature": results["temperature"],
           "avg@k": float(np.mean(list(sampled.values()))) if sampled else None,
           "greedy_accuracy": float(np.mean(list(greedy.values()))) if greedy else None,
           "pass@k": metrics.get(f"pass@{k}"), "maj@k": metrics.get(f"maj@{k}"),
           "mean_response_tokens": metrics.get("mean_response_tokens"),
           "format_ok_rate": metrics.get("format_ok_rate"), "ungradable": metrics.get("ungradable")}
    row.update({f"spent/{key}": value for key, value in spent_at(evidence, label, seed, ckpt).items()})
    folder = paths.eval_dir(label, seed, ckpt, bench)
    row["results_file"] = str((folder / "results.json").relative_to(paths.root))
    return row


# --- reported numbers ---------------------------------------------------------------------------------------------


REPORTED_KEYS = {"source", "metric", "protocol", "differences", "numbers"}


@dataclass
class Reported:
    """A paper's numbers (in percent) per method label and benchmark, with the protocol they were measured under."""

    path: Path
    source: str
    metric: str
    protocol: str
    differences: list[str]
    numbers: dict[str, dict[str, float]]

    def get(self, label: str, bench: str) -> float | None:
        return self.numbers.get(label, {}).get(bench)


def load_reported(path: Path) -> Reported | None:
    """Read ``configs/reported/<sweep>.yaml`` if it exists; a malformed file raises naming the key."""
    import yaml

    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with keys {sorted(REPORTED_KEYS)}")
    unknown = set(raw) - REPORTED_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(REPORTED_KEYS)}")
    numbers = raw.get("numbers") or {}
    if not isinstance(numbers, dict):
        raise ConfigError(f"{path}: key 'numbers' must map method label -> {{benchmark: percent}}")
    clean: dict[str, dict[str, float]] = {}
    for label, per_bench in numbers.items():
        if not isinstance(per_bench, dict):
            raise ConfigError(f"{path}: key 'numbers.{label}' must map benchmark -> percent")
        for bench, value in per_bench.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
                raise ConfigError(f"{path}: key 'numbers.{label}.{bench}': {value!r} is not a percentage in "
                                  "[0, 100]")
        clean[str(label)] = {str(b): float(v) for b, v in per_bench.items()}
    differences = raw.get("differences") or []
    if isinstance(differences, str) or not all(isinstance(d, str) for d in differences):
        raise ConfigError(f"{path}: key 'differences' must be a list of strings")
    return Reported(path, str(raw.get("source", "")), str(raw.get("metric", "")), str(raw.get("protocol", "")),
                    list(differences), clean)


# --- the statistics ----------------------------------------------------------------------------------------------


def _mean_over_seeds(evidence: Evidence, label: str, ckpt: str) -> dict[str, float]:
    seeds = [0] if label == WARMSTART_LABEL else evidence.seeds
    spends = [spent_at(evidence, label, seed, ckpt) for seed in seeds]
    keys = sorted(set.intersection(*(set(s) for s in spends)))
    return {key: float(np.mean([s[key] for s in spends])) for key in keys if spends[0][key] is not None}


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
    # pairwise differences between all labels (paired by the shared plan) rank each benchmark and the aggregate
    pairs = [(a, b) for a in labels for b in labels if a != b]
    ranks = {bench: stats.separation_ranks(labels, {(a, b): stats.paired_difference(
        mats[a][bench], mats[b][bench], plan, bench) for a, b in pairs}) for bench in benches}
    ranks["all"] = stats.separation_ranks(labels, {(a, b): stats.aggregate_difference(mats[a], mats[b], plan)
                                                   for a, b in pairs})
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
                   **_interval("", stats.mean_interval(x, plan, bench))}
            if compared:
                y = mats[baseline][bench]
                difference = stats.paired_difference(x, y, plan, bench)
                row.update(**_interval("diff", difference), **_interval("p_improvement",
                           stats.improvement_interval(x, y, plan, bench)), verdict=stats.verdict(difference))
            value = reported.get(label, bench) if reported and metric == evidence.avg_metric else None
            rows.append({**row, "rank": ranks[bench][label] if ranked else None,
                         "reported": None if value is None else value / 100, **spend})
        aggregate = stats.aggregate_intervals(mats[label], plan)
        n_problems = sum(mats[label][b].shape[1] for b in benches)
        for statistic, interval in aggregate.items():
            row = {**common, "bench": "all", "statistic": statistic, "n_problems": n_problems,
                   **_interval("", interval)}
            if compared and statistic == "mean":
                difference = stats.aggregate_difference(mats[label], mats[baseline], plan)
                row.update(**_interval("diff", difference), **_interval(
                    "p_improvement", stats.aggregate_improvement(mats[label], mats[baseline], plan)),
                    verdict=stats.verdict(difference))
            rows.append({**row, "rank": ranks["all"][label] if ranked and statistic == "mean" else None,
                         "reported": None, **spend})
    return rows


def _interval(prefix: str, interval: stats.Interval) -> dict[str, float]:
    name = prefix or "estimate"
    stem = f"{prefix}_" if prefix else ""
    return {name: interval.estimate, f"{stem}ci_low": interval.low, f"{stem}ci_high": interval.high}


SUMMARY_COLUMNS = ["ckpt", "budget_fraction", "method", "method_name", "bench", "metric", "statistic", "estimate",
                   "ci_low", "ci_high", "baseline", "diff", "diff_ci_low", "diff_ci_high", "p_improvement",
                   "p_improvement_ci_low", "p_improvement_ci_high", "verdict", "rank", "reported", "n_seeds",
                   "n_problems", "k", "temperature"]


def calibration_pairs(evidence: Evidence) -> list[tuple[str, str]]:
    """A/A pairs: two labels running the same method with the same parameters (other seeds via seed_offset)."""
    def key(label):
        run = evidence.runs[(label, evidence.seeds[0])]["method"]
        return run["name"], json.dumps(run.get("params", {}), sort_keys=True)

    return [(a, b) for i, a in enumerate(evidence.labels) for b in evidence.labels[i + 1:] if key(a) == key(b)]


# --- tables (one source for markdown and HTML) --------------------------------------------------------------------


def pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.{digits}f}"


def with_ci(row: dict, prefix: str = "", signed: bool = False) -> str:
    stem = f"{prefix}_" if prefix else ""
    estimate = row.get(prefix or "estimate")
    if estimate is None:
        return ""
    sign = "+" if signed and estimate > 0 else ""
    return f"{sign}{pct(estimate)} [{pct(row[f'{stem}ci_low'])}, {pct(row[f'{stem}ci_high'])}]"


def probability(row: dict) -> str:
    if row.get("p_improvement") is None:
        return ""
    return f"{row['p_improvement']:.2f} [{row['p_improvement_ci_low']:.2f}, {row['p_improvement_ci_high']:.2f}]"


def _select(summary, **where) -> list[dict]:
    return [r for r in summary if all(r.get(k) == v for k, v in where.items())]


def _spent_cells(row: dict) -> list[str]:
    return [f"{row.get('spent/steps', 0):.0f}", f"{row.get('spent/tokens/generated', 0):.0f}"]


def overview_table(evidence: Evidence, summary: list[dict], ckpt: str) -> tuple[list[str], list[list[str]]]:
    """Per method at one checkpoint: the benchmark-averaged avg@k, its IQM, the paired difference, per-benchmark."""
    metric, baseline = evidence.avg_metric, evidence.baseline or "baseline"
    header = ["rank", "method", "n_seeds", f"{metric} mean over benchmarks [95% CI]", "IQM [95% CI]",
              f"Δ vs {baseline} [95% CI]", f"P(X > {baseline})", "verdict"] + [
        f"{b} {metric}" for b in evidence.benches] + ["steps", "tokens generated"]
    body = []
    rows = sorted(_select(summary, ckpt=ckpt, metric=metric, bench="all", statistic="mean"),
                  key=lambda r: (r["rank"], -r["estimate"]))
    if ckpt == evidence.final_ckpt:
        rows += _select(summary, ckpt=WARMSTART_CKPT, metric=metric, bench="all", statistic="mean")
    for row in rows:
        reference = row["method"] == WARMSTART_LABEL
        iqm_row = _select(summary, ckpt=row["ckpt"], method=row["method"], metric=metric, bench="all",
                          statistic="iqm")[0]
        per_bench = [with_ci(_select(summary, ckpt=row["ckpt"], method=row["method"], metric=metric, bench=b)[0])
                     for b in evidence.benches]
        verdict = row.get("verdict") or ("baseline" if row["method"] == evidence.baseline else "")
        body.append(["ref" if reference else str(row["rank"]),
                     "warmstart (reference, step 0)" if reference else row["method"], str(row["n_seeds"]),
                     with_ci(row), with_ci(iqm_row), with_ci(row, "diff", signed=True), probability(row), verdict,
                     *per_bench, *_spent_cells(row)])
    return header, body


def bench_table(evidence: Evidence, summary: list[dict], ckpt: str, bench: str,
                reported: Reported | None) -> tuple[list[str], list[list[str]]]:
    metric, baseline = evidence.avg_metric, evidence.baseline or "baseline"
    has_greedy = "greedy" in evidence.metric_names
    header = ["rank", "method", f"{metric} [95% CI]", f"Δ vs {baseline} [95% CI]", f"P(X > {baseline})", "verdict"]
    header += ["greedy [95% CI]", "greedy Δ [95% CI]"] if has_greedy else []
    header += ["reported"] if reported else []
    header += ["n_seeds", "n_problems", "k", "steps", "tokens generated"]
    rows = sorted(_select(summary, ckpt=ckpt, metric=metric, bench=bench), key=lambda r: (r["rank"], -r["estimate"]))
    if ckpt == evidence.final_ckpt:
        rows += _select(summary, ckpt=WARMSTART_CKPT, metric=metric, bench=bench)
    body = []
    for row in rows:
        reference = row["method"] == WARMSTART_LABEL
        cells = ["ref" if reference else str(row["rank"]), "warmstart (reference)" if reference else row["method"],
                 with_ci(row), with_ci(row, "diff", signed=True), probability(row),
                 row.get("verdict") or ("baseline" if row["method"] == evidence.baseline else "")]
        if has_greedy:
            greedy = _select(summary, ckpt=row["ckpt"], method=row["method"], metric="greedy", bench=bench)
            cells += [with_ci(greedy[0]), with_ci(greedy[0], "diff", signed=True)] if greedy else ["", ""]
        if reported:
            cells.append("" if row["reported"] is None else pct(row["reported"]))
        cells += [str(row["n_seeds"]), str(row["n_problems"]), str(row["k"]), *_spent_cells(row)]
        body.append(cells)
    return header, body


def runs_table(evidence: Evidence) -> tuple[list[str], list[list[str]]]:
    """Realised budget per run: run.json's budget and counters (every numeric key, so new counters appear)."""
    counter_keys = sorted({k for run in evidence.runs.values() for k, v in run.get("counters", {}).items()
                           if isinstance(v, int | float)})
    budget_keys = sorted({k for run in evidence.runs.values() for k, v in run.get("budget", {}).items()
                          if isinstance(v, int | float) and k != "amount"})
    header = ["method", "seed", "run_seed", "budget"] + budget_keys + counter_keys + ["train seconds"]
    body = []
    for (label, seed), run in evidence.runs.items():
        budget = run.get("budget", {})
        cells = [label, str(seed), str(run.get("run_seed", "")), f"{budget.get('kind', '?')} = {budget.get('amount')}"]
        cells += [_number(budget.get(k)) for k in budget_keys] + [_number(run["counters"].get(k)) for k in counter_keys]
        cells.append(_number(run.get("train_seconds")))
        body.append(cells)
    return header, body


def _number(value) -> str:
    if value is None:
        return ""
    return f"{value:.1f}" if isinstance(value, float) and not float(value).is_integer() else f"{value:g}"


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    def escape(cell: str) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


# --- writing ------------------------------------------------------------------------------------------------------


def protocol_note(evidence: Evidence, resolved: Resolved, n_resamples: int) -> str:
    budget = resolved.preset.train.budget
    problems = ", ".join(f"{b} {len(p)}" for b, p in evidence.problem_ids.items())
    note = (f"Accuracy in %. {evidence.avg_metric}: mean correctness of k = {evidence.k} samples per problem at "
            f"T = {evidence.temperature:g}; greedy: one completion at T = 0. Budget: {budget.kind} = "
            f"{budget.amount:g}, compared at each checkpoint fraction. Seeds: {len(evidence.seeds)} "
            f"({', '.join(map(str, evidence.seeds))}); problems: {problems}. "
            f"Intervals: 95% percentile bootstrap ({n_resamples} resamples), seeds and problems resampled (problems "
            f"within each benchmark). ")
    if evidence.baseline is None:
        note += ("This sweep has no `uniform` label, so there is no baseline: the Δ, P and verdict columns are "
                 "empty and methods are not ranked against each other.")
    else:
        note += (f"Δ: paired difference to `{evidence.baseline}` (same seed indices, same problems). P(X > Y): "
                 f"probability that a seed of the method beats a seed of the baseline (averaged over benchmarks for "
                 f"the overview). Verdict 'tied' when the Δ interval covers 0; rank = 1 + the number of methods "
                 f"whose paired difference to this one is significantly positive (equal ranks: not separated). "
                 f"Each interval is 95% on its own, with no correction for comparing several methods: among many "
                 f"methods one spurious 'better' or 'worse' is to be expected.")
    if len(evidence.seeds) == 1:
        note += (" **One seed only: the intervals cover problem sampling, not training randomness; read 'better' "
                 "and 'worse' with care.**")
    return note


def calibration_lines(evidence: Evidence, summary: list[dict]) -> list[str]:
    """A/A verdicts: the statistics' calibration check (an A/A pair must come out tied)."""
    lines = []
    for a, b in calibration_pairs(evidence):
        pair = (a, b) if b == evidence.baseline else (b, a)
        for ckpt in evidence.ckpts:
            rows = _select(summary, ckpt=ckpt, method=pair[0], metric=evidence.avg_metric, statistic="mean")
            verdicts = {r["bench"]: r.get("verdict") for r in rows if r.get("verdict")}
            if not verdicts:
                continue
            ok = all(v == "tied" for v in verdicts.values())
            detail = ", ".join(f"{bench}: {v}" for bench, v in verdicts.items())
            lines.append(f"A/A `{pair[0]}` vs `{pair[1]}` at {ckpt}: {'tied (calibrated)' if ok else 'NOT tied'} "
                         f"({detail})" + ("" if ok else " — the intervals are too narrow for this sweep (more seeds?)"))
    return lines


BUDGET_TOLERANCE = 0.05  # a run whose realised budget is more than 5% off its amount is flagged


def budget_warnings(evidence: Evidence) -> list[str]:
    """Matched compute is the premise of the comparison: flag runs whose budget (kind, amount) differs from the
    others', or whose realised spend (``budget.spent_<kind>`` in run.json) is off its amount."""
    warnings = []
    budgets = {(run["budget"].get("kind"), run["budget"].get("amount")) for run in evidence.runs.values()}
    if len(budgets) > 1:
        warnings.append(f"runs were trained under different budgets: {sorted(budgets, key=str)}")
    for (label, seed), run in evidence.runs.items():
        budget = run["budget"]
        spent, amount = budget.get(f"spent_{budget.get('kind')}"), budget.get("amount")
        if isinstance(spent, int | float) and amount and abs(spent - amount) > BUDGET_TOLERANCE * amount:
            warnings.append(f"{label}/seed{seed} spent {spent:g} {budget['kind']} of its {amount:g}")
    return warnings


def write_text_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_csv(rows: list[dict], path: Path, columns: list[str] | None = None) -> Path:
    fieldnames = list(columns or [])
    for row in rows:
        fieldnames += [k for k in row if k not in fieldnames]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, buffer.getvalue())


def markdown(evidence: Evidence, resolved: Resolved, summary: list[dict], reported: Reported | None,
             figures: dict[str, Path], root: Path, n_resamples: int) -> str:
    final = evidence.final_ckpt
    parts = [f"# Leaderboard: sweep `{resolved.sweep.name}` (preset `{resolved.preset.name}`)", "",
             protocol_note(evidence, resolved, n_resamples), ""]
    for ckpt in sorted(evidence.ckpts, reverse=True):
        fraction = evidence.ckpts[ckpt]
        title = "Full budget" if ckpt == final else f"{fraction:.0%} of the budget"
        parts += [f"## {title} ({ckpt})", "", markdown_table(*overview_table(evidence, summary, ckpt)), ""]
        if ckpt == final:
            parts += [f"- {line}" for line in calibration_lines(evidence, summary)]
            parts += [f"- **Budget not matched:** {line}" for line in budget_warnings(evidence)] + [""]
        parts += [f"- **Failed run, left out:** `{f['label']}` seed {f['seed']} ({f['stage']}): {f['error']} "
                  f"(log: `{f['log']}`)" for f in evidence.failures]
    parts += [f"## Per benchmark ({final})", ""]
    for bench in evidence.benches:
        parts += [f"### {bench}", "", markdown_table(*bench_table(evidence, summary, final, bench, reported)), ""]
    if reported:
        parts += ["## Reported numbers", "", *reported_lines(reported, evidence), ""]
    if figures:
        parts += ["## Figures", ""]
        parts += [f"![{name}]({path.relative_to(root).as_posix()})" for name, path in figures.items()] + [""]
    parts += ["## Realised budget per run", "", markdown_table(*runs_table(evidence)), "",
              "Tidy numbers: `leaderboard.csv`; per run, checkpoint and benchmark (naming the `results.json` whose "
              "`samples.jsonl` holds the generations): `leaderboard_runs.csv`. Token highlights and provenance: "
              "`report.html`.", ""]
    return "\n".join(parts)


def reported_lines(reported: Reported, evidence: Evidence) -> list[str]:
    lines = [f"Source: {reported.source or 'not given'}; metric: {reported.metric or 'not given'}; protocol: "
             f"{reported.protocol or 'not given'} (`{reported.path.name}`)."]
    if reported.differences:
        lines += ["", "Protocol differences to ours:"] + [f"- {d}" for d in reported.differences]
    unknown = [f"{lab}/{b}" for lab, per in reported.numbers.items() for b in per
               if lab not in evidence.labels or b not in evidence.benches]
    if unknown:
        lines += ["", f"Reported but not in this sweep: {', '.join(unknown)}."]
    return lines


def inspect_sample_batch(evidence: Evidence, paths: SweepPaths) -> tuple[Path | None, dict[str, dict | str]]:
    """Run ``harness inspect`` for every label on the first run's sample batch; a label that fails shows its error."""
    from harness.ops.inspect_batch import inspect_batch

    batch_file = paths.run_dir(evidence.labels[0], evidence.seeds[0]) / "sample_batch.json"
    if not batch_file.is_file():
        return None, {}
    outputs: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in evidence.labels:
            try:
                outputs[label] = inspect_batch(label, batch_file, Path(tmp) / f"{label}.json", [])
            except (ValueError, KeyError, RuntimeError) as exc:  # ConfigError is a ValueError
                outputs[label] = f"{type(exc).__name__}: {exc}"
    return batch_file, outputs


def write_leaderboard(resolved: Resolved, paths: SweepPaths, reported_file: Path | None = None,
                      n_resamples: int = stats.N_RESAMPLES) -> list[Path]:
    """Read the sweep, compute the statistics, write the tables, figures and report.html; return what was written."""
    from harness.report import html as html_report
    from harness.report import plots

    evidence = read_sweep(resolved, paths)
    reported = load_reported(reported_file or CONFIG_DIR / "reported" / f"{resolved.sweep.name}.yaml")
    summary = summarize(evidence, reported, n_resamples)
    root = paths.root
    figures = plots.write_figures(evidence, summary, root / "figures")
    written = [
        write_text_atomic(root / "leaderboard.md",
                          markdown(evidence, resolved, summary, reported, figures, root, n_resamples)),
        write_csv(summary, root / "leaderboard.csv", SUMMARY_COLUMNS),
        write_csv(evidence.run_rows, root / "leaderboard_runs.csv"),
        write_json_atomic(root / "leaderboard.json", {
            "config": resolved.to_dict(), "statistics": {"confidence": stats.CONFIDENCE, "n_resamples": n_resamples,
                                                         "bootstrap_seed": BOOTSTRAP_SEED},
            "summary": summary, "runs": evidence.run_rows}),
    ]
    batch_file, inspected = inspect_sample_batch(evidence, paths)
    page = html_report.render(evidence, resolved, summary, reported, figures, batch_file, inspected, n_resamples)
    written.append(write_text_atomic(root / "report.html", page))
    return written + list(figures.values())
