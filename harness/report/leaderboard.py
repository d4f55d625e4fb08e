"""``harness report``: read the sweep, compute the statistics, write the leaderboard files and report.html.

Outputs under ``results/<sweep>/``:
  * ``leaderboard.md``: renders on GitHub (``harness.report.markdown``);
  * ``leaderboard.csv``: tidy, one row per (checkpoint, method, benchmark or ``all``, metric, statistic);
  * ``leaderboard_runs.csv``: one row per run x checkpoint x benchmark, naming the ``results.json`` it came from;
  * ``leaderboard.json``: the resolved config, both tables, the statistics settings and the data job's training data
    overlap report (data/decontamination.json; null: not measured);
  * ``report.html``: self-contained (inline CSS, figures as data URIs, no script): the tables, figures, token
    highlights on fixed rollouts, reported numbers and provenance (``harness.report.html``);
  * ``figures/*.png``: the figures of the report (``harness.report.plots``).

The modules behind it, in their one-way import order, are listed in ``harness/report/__init__.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import tempfile
from pathlib import Path

from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import Resolved
from harness.data.decontamination import read_report
from harness.data.files import write_json_atomic, write_text_atomic
from harness.report import html, plots
from harness.report.bootstrap import N_RESAMPLES
from harness.report.calibration import calibration_file, load_calibration
from harness.report.evidence import Evidence, read_sweep
from harness.report.fidelity import load_fidelity
from harness.report.markdown import markdown
from harness.report.reported import load_reported
from harness.report.scores import CONFIDENCE
from harness.report.summary import (
    BOOTSTRAP_SEED,
    SUMMARY_COLUMNS,
    BaselineLevel,
    StandInMean,
    baseline_level,
    claim_verdicts,
    summarize,
    without_stand_ins,
)
from harness.report.training_noise import VARIANCE_BASES
from harness.report.verdicts import Verdict


def write_csv(rows: list[dict], path: Path, columns: list[str] | None = None) -> Path:
    """``rows`` as CSV: ``columns`` first, then every other key in order of first appearance."""
    fieldnames = list(columns or [])
    for row in rows:
        fieldnames += [k for k in row if k not in fieldnames]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, buffer.getvalue())


def inspect_sample_batch(evidence: Evidence, paths: SweepPaths) -> tuple[Path | None, dict[str, dict | str]]:
    """Run ``harness inspect`` for every label on the first run's sample batch; a label that fails shows its error."""
    from harness.ops.inspect_batch import inspect_batch  # imports torch and the method hooks: only when rendering

    batch_file = paths.sample_batch_file(evidence.labels[0], evidence.seeds[0])
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


def verdict_record(v: Verdict, level: BaselineLevel | None = None, stand_ins: StandInMean | None = None) -> dict:
    """One judged claim for leaderboard.json: the claim (points), the verdicts and the interval (fractions), the
    baseline's gain over the warm start and the seeds that would settle it; ``level``: the paper's baseline (points)
    beside ours (fractions); ``stand_ins``: the claim's mean without its stand-in benchmarks, the paper's (points)
    and ours (fractions), or null (``summary.without_stand_ins``)."""
    iv = v.interval
    numbers = {"diff": None if iv is None else iv.estimate, "diff_ci_low": None if iv is None else iv.low,
               "diff_ci_high": None if iv is None else iv.high,
               "diff_ci_at_floor": None if iv is None else iv.rests_on_floor, "detectable": v.detectable,
               "p_reproduce": v.p_reproduce, "p_contradict": v.p_contradict, "holm_p_reproduce": v.holm_p_reproduce,
               "holm_p_contradict": v.holm_p_contradict}
    return {**dataclasses.asdict(v.claim), "headline": v.headline, "verdict": v.verdict, "reason": v.reason,
            "holm": v.holm, "variance": None if iv is None or iv.variance is None else iv.variance.basis,
            **{k: None if x is None or math.isnan(x) else x for k, x in numbers.items()},  # no NaN in JSON
            "baseline_gain": v.baseline_gain, "learned_threshold": v.claim.learned_threshold,
            "undertrained": v.undertrained, "seeds_to_settle": v.seeds_to_settle,
            "paper_baseline": None if level is None else level.paper,
            "our_baseline": None if level is None or level.ours is None else {
                k: level.ours[k] for k in ("estimate", "ci_low", "ci_high")},
            "baseline_mismatch": None if level is None else level.mismatch,
            "without_stand_ins": None if stand_ins is None else stand_in_record(stand_ins)}


def stand_in_record(m: StandInMean) -> dict:
    """``summary.StandInMean`` for leaderboard.json: the paper's means and difference in points (null: a number is
    missing), ours as Δ with its interval in fractions (null: not evaluated)."""
    def paper(means):
        return None if means is None else {"method": means[0], "baseline": means[1], "diff": means[0] - means[1]}

    def ours(iv):
        return None if iv is None else {key: None if math.isnan(value) else value for key, value in
                                        (("diff", iv.estimate), ("diff_ci_low", iv.low), ("diff_ci_high", iv.high))}

    return {"stand_ins": list(m.dropped), "benchmarks_without": list(m.kept), "notes": list(m.notes),
            "paper_with": paper(m.paper_with), "paper_without": paper(m.paper_without),
            "ours_with": ours(m.ours_with), "ours_without": ours(m.ours_without)}


def with_calibration(evidence: Evidence, path: Path) -> Evidence:
    """The evidence with the preset's A/A calibration at ``path`` when it exists and fits the sweep's benchmarks."""
    calibration = load_calibration(path)
    if calibration is not None:
        unused = calibration.mismatch({b: len(p) for b, p in evidence.problem_ids.items()})
        evidence.calibration, evidence.calibration_unused = (None, unused) if unused else (calibration, "")
    return evidence


def write_leaderboard(resolved: Resolved, paths: SweepPaths, reported_file: Path | None = None,
                      n_resamples: int = N_RESAMPLES, fidelity_file: Path | None = None,
                      calibration_path: Path | None = None) -> list[Path]:
    """Read the sweep, compute the statistics, write the tables, figures and report.html; return what was written."""
    evidence = with_calibration(read_sweep(resolved, paths),
                                calibration_path or calibration_file(resolved.preset.name))
    reported = load_reported(reported_file or CONFIG_DIR / "reported" / f"{resolved.sweep.name}.yaml")
    summary = summarize(evidence, reported, n_resamples)
    fidelity_file = fidelity_file or CONFIG_DIR / "fidelity" / f"{resolved.sweep.name}.yaml"
    fidelity = load_fidelity(fidelity_file, resolved) if fidelity_file.is_file() else None
    decontamination = read_report(paths.data_dir)  # the data job's 8-gram overlap report; None: not measured
    root = paths.root
    judged = claim_verdicts(evidence, reported)
    figures = plots.write_figures(evidence, summary, root / "figures", [v.claim for v in judged])
    written = [
        write_text_atomic(root / "leaderboard.md",
                          markdown(evidence, resolved, summary, reported, figures, root, n_resamples, fidelity,
                                   decontamination)),
        write_csv(summary, root / "leaderboard.csv", SUMMARY_COLUMNS),
        write_csv(evidence.run_rows, root / "leaderboard_runs.csv"),
        write_json_atomic(root / "leaderboard.json", {
            "config": resolved.to_dict(), "statistics": {
                "confidence": CONFIDENCE, "interval": "crossed seed x problem t interval (means, differences)",
                "ci_at_floor": "the t interval is the residual floor: the seeds agreed more closely than their seed x "
                               "problem residual implies (docs/statistics.md)",
                "diff_variance": "the seed variance of the Δ interval: " + ", ".join(VARIANCE_BASES),
                "verdict": "Holm-adjusted per table (the comparisons with the baseline), two-sided 5%",
                "calibration": None if evidence.calibration is None else str(evidence.calibration.path.name),
                "n_resamples": n_resamples, "bootstrap_seed": BOOTSTRAP_SEED},
            "summary": summary,
            "claims": [verdict_record(v, baseline_level(v.claim, evidence, summary, reported),
                                      without_stand_ins(v, evidence, reported)) for v in judged],
            "runs": evidence.run_rows, "decontamination": decontamination}),
    ]
    batch_file, inspected = inspect_sample_batch(evidence, paths)
    page = html.render(evidence, resolved, summary, reported, figures, batch_file, inspected, n_resamples,
                       fidelity, decontamination)
    written.append(write_text_atomic(root / "report.html", page))
    return written + list(figures.values())
