"""Reading a finished sweep: run.json, metrics.jsonl, and each evaluation's results.json and samples.jsonl.

A label with any failed run (missing run.json or eval results) is left out of the statistics, which pair seeds
across labels, and listed with the head of its error (``snakemake -k`` finishes the other jobs; ``harness report``
then renders what completed).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.config.paths import WARMSTART_LABEL, SweepPaths, checkpoint_name
from harness.config.schema import Resolved
from harness.data.files import read_json, read_jsonl
from harness.data.score_names import AVG_AT_K, GREEDY, GREEDY_ACCURACY, MAJ_AT_K, PASS_AT_K, avg_at, maj_at, pass_at
from harness.report.calibration import Calibration
from harness.report.scores import per_problem_scores, score_matrix

WARMSTART_CKPT = "ckpt-000"
BASELINE_METHOD = "uniform"  # the registered name every difference is taken against


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
    calibration: Calibration | None = None  # the preset's A/A calibration, when its benchmarks are the sweep's
    calibration_unused: str = ""  # why a calibration file of the preset is not used

    @property
    def metric_names(self) -> list[str]:
        return sorted({key[3] for key in self.scores}, key=lambda m: (m != self.avg_metric, m))

    @property
    def avg_metric(self) -> str:
        return avg_at(self.k)

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


# --- failed runs --------------------------------------------------------------------------------------------------


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


def _failure(paths: SweepPaths, label: str, seed: int, stage: str, log: Path) -> dict:
    return {"label": label, "seed": seed, "stage": stage, "error": error_head(log),
            "log": str(log.relative_to(paths.root))}


def find_failures(resolved: Resolved, paths: SweepPaths, ckpts: list[str], benches: list[str]) -> list[dict]:
    """Runs whose training or evaluation outputs are missing, with the head of the error in their log."""
    failures = []
    for label in resolved.sweep.methods:
        for seed in resolved.sweep.seeds:
            if not paths.run_file(label, seed).is_file():
                failures.append(_failure(paths, label, seed, "train", paths.train_log(label, seed)))
                continue
            for ckpt in ckpts:
                if not all(paths.results_file(label, seed, ckpt, b).is_file() for b in benches):
                    log = paths.log_file("eval", label, seed,  # one eval log per run with eval.job_scope=run
                                         ckpt if resolved.preset.eval.job_scope == "checkpoint" else None)
                    failures.append(_failure(paths, label, seed, f"eval {ckpt}", log))
    return failures


# --- reading ------------------------------------------------------------------------------------------------------


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"report: missing {path}; run the sweep (snakemake) first")
    return path


def _samples(path: Path) -> list[dict]:
    rows = read_jsonl(_require(path), required=())
    for row in rows:  # tolerate either spelling of the problem key
        if "id" not in row:
            row["id"] = row["problem_id"]
    return rows


def _read_runs(paths: SweepPaths, labels: list[str], seeds: list[int]) -> tuple[dict, dict]:
    """run.json and metrics.jsonl (empty when the run logged none) per (label, seed)."""
    runs, metrics = {}, {}
    for label in labels:
        for seed in seeds:
            runs[(label, seed)] = read_json(_require(paths.run_file(label, seed)))
            metrics_file = paths.metrics_file(label, seed)
            metrics[(label, seed)] = read_jsonl(metrics_file, required=()) if metrics_file.is_file() else []
    return runs, metrics


def _read_evaluations(paths: SweepPaths, evaluated: list[tuple[str, int, str]], benches: list[str]
                      ) -> tuple[dict, dict]:
    """results.json and the per-problem scores of samples.jsonl (sampled and greedy) per (label, seed, ckpt, bench)."""
    results, per_problem = {}, {}
    for label, seed, ckpt in evaluated:
        for bench in benches:
            key = (label, seed, ckpt, bench)
            results[key] = read_json(_require(paths.results_file(*key)))
            rows = _samples(paths.samples_file(*key))
            per_problem[key] = {"sampled": per_problem_scores(rows, "sampled"),
                                "greedy": per_problem_scores(rows, "greedy")}
    return results, per_problem


def _one_protocol(results: dict) -> tuple[int, float]:
    """The (k, temperature) every evaluation shares; evaluations that disagree raise."""
    ks = {r["k"] for r in results.values()}
    temperatures = {r["temperature"] for r in results.values()}
    if len(ks) != 1 or len(temperatures) != 1:
        raise ValueError(f"report: evaluations disagree on the protocol (k {sorted(ks)}, temperature "
                         f"{sorted(temperatures)}); rerun the stale ones")
    return ks.pop(), temperatures.pop()


def _common_problems(per_problem: dict, benches: list[str]) -> dict[str, list[str]]:
    """The problems of a benchmark: those gradable in every run, so every matrix is paired column by column."""
    problem_ids = {}
    for bench in benches:
        sets = [set(v["sampled"]) for key, v in per_problem.items() if key[3] == bench]
        problem_ids[bench] = sorted(set.intersection(*sets))
        if not problem_ids[bench]:
            raise ValueError(f"report: benchmark {bench!r} has no problem scored in every run")
    return problem_ids


def _score_matrices(per_problem: dict, groups: list[tuple[str, list[int], list[str]]], benches: list[str],
                    problem_ids: dict[str, list[str]], k: int) -> dict[tuple[str, str, str, str], np.ndarray]:
    """(label, ckpt, bench, metric) -> (S, P) correctness; greedy only where every seed scored every problem."""
    scores = {}
    for label, seeds, ckpt_names in groups:
        for ckpt in ckpt_names:
            for bench in benches:
                cells = [per_problem[(label, seed, ckpt, bench)] for seed in seeds]
                scores[(label, ckpt, bench, avg_at(k))] = score_matrix([c["sampled"] for c in cells],
                                                                        problem_ids[bench])
                if all(set(problem_ids[bench]) <= set(c["greedy"]) for c in cells):
                    scores[(label, ckpt, bench, GREEDY)] = score_matrix([c["greedy"] for c in cells],
                                                                          problem_ids[bench])
    return scores


def read_sweep(resolved: Resolved, paths: SweepPaths) -> Evidence:
    """The sweep's evidence; labels with a failed run are left out and listed in ``Evidence.failures``."""
    sweep, preset = resolved.sweep, resolved.preset
    ckpts = {checkpoint_name(f): f for f in sorted(preset.train.budget.checkpoint_fractions)}
    benches = sorted(preset.eval.benchmarks)
    failures = find_failures(resolved, paths, list(ckpts), benches)
    failed_labels = {f["label"] for f in failures}
    sweep = dataclasses.replace(sweep, methods=[m for m in sweep.methods if m not in failed_labels])
    if not sweep.methods:
        raise ValueError("report: every method label has a failed run: " + "; ".join(
            f"{f['label']}/seed{f['seed']} {f['stage']}: {f['error']}" for f in failures))
    runs, metrics = _read_runs(paths, sweep.methods, sweep.seeds)
    evaluated = [(WARMSTART_LABEL, 0, WARMSTART_CKPT)]
    evaluated += [(label, seed, ckpt) for label in sweep.methods for seed in sweep.seeds for ckpt in ckpts]
    results, per_problem = _read_evaluations(paths, evaluated, benches)
    k, temperature = _one_protocol(results)
    problem_ids = _common_problems(per_problem, benches)
    groups = [(WARMSTART_LABEL, [0], [WARMSTART_CKPT])] + [(lab, list(sweep.seeds), list(ckpts))
                                                          for lab in sweep.methods]
    scores = _score_matrices(per_problem, groups, benches, problem_ids, k)
    evidence = Evidence(list(sweep.methods), list(sweep.seeds), ckpts, benches, k, temperature, problem_ids, scores,
                        runs, metrics, results, failures=failures)
    evidence.run_rows = [_run_row(evidence, label, seed, ckpt, bench, per_problem[(label, seed, ckpt, bench)],
                                  paths) for label, seed, ckpt in evaluated for bench in benches]
    return evidence


# --- realised budget ----------------------------------------------------------------------------------------------


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


def _run_row(evidence: Evidence, label: str, seed: int, ckpt: str, bench: str, per_problem: dict,
             paths: SweepPaths) -> dict:
    """One row of leaderboard_runs.csv: results.json's numbers, the realised budget and the file they came from."""
    results = evidence.results[(label, seed, ckpt, bench)]
    k, metrics = results["k"], results["metrics"]
    sampled, greedy = per_problem["sampled"], per_problem["greedy"]
    row = {"method": label, "seed": seed, "ckpt": ckpt, "bench": bench, "n_problems": len(sampled), "k": k,
           "temperature": results["temperature"],
           AVG_AT_K: float(np.mean(list(sampled.values()))) if sampled else None,
           GREEDY_ACCURACY: float(np.mean(list(greedy.values()))) if greedy else None,
           PASS_AT_K: metrics.get(pass_at(k)), MAJ_AT_K: metrics.get(maj_at(k)),
           "mean_response_tokens": metrics.get("mean_response_tokens"),
           "format_ok_rate": metrics.get("format_ok_rate"), "ungradable": metrics.get("ungradable")}
    row.update({f"spent/{key}": value for key, value in spent_at(evidence, label, seed, ckpt).items()})
    row["results_file"] = str(paths.results_file(label, seed, ckpt, bench).relative_to(paths.root))
    return row


def baseline_scores(resolved: Resolved, paths: SweepPaths, seeds: list[int], ckpt: str) -> dict[str, np.ndarray]:
    """The baseline's per-problem sampled scores of ``seeds`` at ``ckpt``, one (seeds, problems) matrix per
    benchmark over the problems every seed scored: what ``harness calibrate`` sizes the preset's A/A noise from."""
    scores = {}
    for bench in sorted(resolved.preset.eval.benchmarks):
        per_seed = [per_problem_scores(read_jsonl(paths.samples_file(BASELINE_METHOD, s, ckpt, bench), required=()))
                    for s in seeds]
        common = sorted(set.intersection(*(set(p) for p in per_seed)))
        scores[bench] = score_matrix(per_seed, common)
    return scores
