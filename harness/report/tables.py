"""The leaderboard's tables as (header, body) of strings, one source for ``leaderboard.md`` and ``report.html``:
the overview per checkpoint, one table per benchmark, and the realised budget per run."""

from __future__ import annotations

import math

from harness.config.paths import WARMSTART_LABEL
from harness.report.evidence import WARMSTART_CKPT, Evidence
from harness.report.power import MAX_SEEDS, UPPER_LEVEL
from harness.report.reported import Reported
from harness.report.summary import BaselineLevel, StandInMean
from harness.report.verdicts import ALPHA_ONE_SIDED, Verdict

Table = tuple[list[str], list[list[str]]]  # (header, body rows)

FLOOR_MARK = "‡"  # after an interval that rests on the residual floor (``scores.CrossedVariance.rests_on_floor``)
FLOOR_LEGEND = (f"{FLOOR_MARK} interval at the residual floor: the seeds agreed more closely than their seed x problem "
                f"residual implies; with few seeds such an interval may still be too narrow when training randomness "
                f"is large (docs/statistics.md, 'Means'): more seeds settle it.")


# --- cells --------------------------------------------------------------------------------------------------------


def pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.{digits}f}"


def with_ci(row: dict, prefix: str = "", signed: bool = False) -> str:
    """A summary row's estimate (or ``prefix`` statistic) in percent with its interval: ``61.2 [55.0, 67.1]``, and
    ``FLOOR_MARK`` after it when the interval rests on the residual floor."""
    stem = f"{prefix}_" if prefix else ""
    estimate = row.get(prefix or "estimate")
    if estimate is None:
        return ""
    sign = "+" if signed and estimate > 0 else ""
    mark = FLOOR_MARK if row.get(f"{stem}ci_at_floor") else ""
    return f"{sign}{pct(estimate)} [{pct(row[f'{stem}ci_low'])}, {pct(row[f'{stem}ci_high'])}]{mark}"


def probability(row: dict) -> str:
    if row.get("p_improvement") is None:
        return ""
    return f"{row['p_improvement']:.2f} [{row['p_improvement_ci_low']:.2f}, {row['p_improvement_ci_high']:.2f}]"


def number(value) -> str:
    """A counter as text: integers without a decimal point, other floats to one decimal, None empty."""
    if value is None:
        return ""
    return f"{value:.1f}" if isinstance(value, float) and not float(value).is_integer() else f"{value:g}"


def select(summary: list[dict], **where) -> list[dict]:
    """The summary rows whose columns equal ``where``'s values, in summary order."""
    return [r for r in summary if all(r.get(k) == v for k, v in where.items())]


def _spent_cells(row: dict) -> list[str]:
    return [f"{row.get('spent/steps', 0):.0f}", f"{row.get('spent/tokens/generated', 0):.0f}"]


def _verdict_cell(evidence: Evidence, row: dict) -> str:
    return row.get("verdict") or ("baseline" if row["method"] == evidence.baseline else "")


def _ranked_rows(evidence: Evidence, summary: list[dict], ckpt: str, **where) -> list[dict]:
    """Rows at ``ckpt`` by rank then estimate; at the final checkpoint the warm start's reference row last."""
    rows = sorted(select(summary, ckpt=ckpt, **where), key=lambda r: (r["rank"], -r["estimate"]))
    if ckpt == evidence.final_ckpt:
        rows += select(summary, ckpt=WARMSTART_CKPT, **where)
    return rows


# --- tables -------------------------------------------------------------------------------------------------------


def overview_table(evidence: Evidence, summary: list[dict], ckpt: str) -> Table:
    """Per method at one checkpoint: the benchmark-averaged avg@k, its IQM, the paired difference, per-benchmark."""
    metric, baseline = evidence.avg_metric, evidence.baseline or "baseline"
    header = ["rank", "method", "n_seeds", f"{metric} mean over benchmarks [95% CI]", "IQM [95% CI]",
              f"Δ vs {baseline} [95% CI]", f"P(X > {baseline})", "verdict"] + [
        f"{b} {metric}" for b in evidence.benches] + ["steps", "tokens generated"]
    body = []
    for row in _ranked_rows(evidence, summary, ckpt, metric=metric, bench="all", statistic="mean"):
        reference = row["method"] == WARMSTART_LABEL
        same = {"ckpt": row["ckpt"], "method": row["method"], "metric": metric}
        iqm_row = select(summary, **same, bench="all", statistic="iqm")[0]
        per_bench = [with_ci(select(summary, **same, bench=b)[0]) for b in evidence.benches]
        body.append(["ref" if reference else str(row["rank"]),
                     "warmstart (reference, step 0)" if reference else row["method"], str(row["n_seeds"]),
                     with_ci(row), with_ci(iqm_row), with_ci(row, "diff", signed=True), probability(row),
                     _verdict_cell(evidence, row), *per_bench, *_spent_cells(row)])
    return header, body


def bench_table(evidence: Evidence, summary: list[dict], ckpt: str, bench: str, reported: Reported | None) -> Table:
    """Per method on one benchmark: avg@k and its Δ, greedy when evaluated, the paper's number when given."""
    metric, baseline = evidence.avg_metric, evidence.baseline or "baseline"
    has_greedy = "greedy" in evidence.metric_names
    header = ["rank", "method", f"{metric} [95% CI]", f"Δ vs {baseline} [95% CI]", f"P(X > {baseline})", "verdict"]
    header += ["greedy [95% CI]", "greedy Δ [95% CI]"] if has_greedy else []
    header += ["reported"] if reported else []
    header += ["n_seeds", "n_problems", "k", "steps", "tokens generated"]
    body = []
    for row in _ranked_rows(evidence, summary, ckpt, metric=metric, bench=bench):
        reference = row["method"] == WARMSTART_LABEL
        cells = ["ref" if reference else str(row["rank"]), "warmstart (reference)" if reference else row["method"],
                 with_ci(row), with_ci(row, "diff", signed=True), probability(row), _verdict_cell(evidence, row)]
        if has_greedy:
            greedy = select(summary, ckpt=row["ckpt"], method=row["method"], metric="greedy", bench=bench)
            cells += [with_ci(greedy[0]), with_ci(greedy[0], "diff", signed=True)] if greedy else ["", ""]
        if reported:
            cells.append("" if row["reported"] is None else pct(row["reported"]))
        cells += [str(row["n_seeds"]), str(row["n_problems"]), str(row["k"]), *_spent_cells(row)]
        body.append(cells)
    return header, body


def runs_table(evidence: Evidence) -> Table:
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
        cells += [number(budget.get(k)) for k in budget_keys] + [number(run["counters"].get(k)) for k in counter_keys]
        cells.append(number(run.get("train_seconds")))
        body.append(cells)
    return header, body


# --- claims and detectable effects ---------------------------------------------------------------------------------


def _points(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _count(value: float | None) -> str:
    """A training length for a table cell: 1,966,080 -> 1.97M; None -> 'not public'."""
    if value is None:
        return "not public"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def trained_cell(reached: dict[str, float] | None) -> str:
    """What a label's runs trained by the full budget (``summary.training_reached``), seed mean."""
    if reached is None:
        return "not trained here"
    return (f"{_count(reached['batches'])} batches ({_count(reached['updates'])} updates), "
            f"{_count(reached['rollouts'])} rollouts, {_count(reached['tokens'])} tokens")


def paper_training_cell(reported: Reported | None) -> str:
    """How long the paper's run trained (``training`` of the reported-numbers file)."""
    if reported is None:
        return "no paper (stand-in claims)"
    paper = reported.training
    if paper is None:
        return f"not stated in {reported.path.name}"
    return (f"{_count(paper.steps)} batches, {_count(paper.rollouts)} rollouts, {_count(paper.tokens)} tokens "
            f"({paper.where})")


def baseline_cell(level: BaselineLevel) -> str:
    """The paper's baseline beside ours (``summary.baseline_level``), flagged when it lies outside our interval."""
    ours = with_ci(level.ours) if level.ours else "not evaluated"
    if level.paper is None:
        paper = level.unlike or (f"none for {', '.join(level.missing)}" if level.missing else "no paper")
        return f"paper: {paper}; ours: {ours}"
    flag = ": outside our interval, protocol mismatch?" if level.mismatch else ""
    return f"paper: {level.paper:.1f}; ours: {ours}{flag}"


def claims_table(judged: list[Verdict], reached: dict[str, dict[str, float]] | None = None,
                 reported: Reported | None = None, levels: list[BaselineLevel] | None = None) -> Table:
    """One row per claim (``verdicts.Verdict``): the claim, where the paper says it, our paired difference, the
    detectable effect, the headline (the Holm verdict, or insufficient replication: ``Verdict.headline``), the
    per-claim verdict and why, Holm's adjusted p-values; the
    difference carries ``FLOOR_MARK`` when its interval rests on the residual floor. Beside the verdict, how long
    the compared runs trained (``reached``: label -> ``summary.training_reached``) against the paper's run
    (``reported.training``): a verdict at a fraction of the paper's training is not a verdict on the paper's run.
    ``levels`` (one per claim): the paper's baseline beside ours, and the baseline's gain over the warm start."""
    header = ["claim", "where", "Δ [95% CI]", "detectable at 80% power", "verdict (Holm)", "per-claim verdict", "why",
              "Holm p (reproduce, contradict)", "trained here (method; baseline)", "paper's run"]
    header += ["baseline (paper; ours [95% CI])", "baseline gain over the warm start"] if levels else []
    body = []
    reached = reached or {}
    for i, v in enumerate(judged):
        iv = v.interval
        difference = "" if iv is None else (f"{'+' if iv.estimate > 0 else ''}{pct(iv.estimate)} "
                                            f"[{pct(iv.low)}, {pct(iv.high)}]{FLOOR_MARK if iv.rests_on_floor else ''}")
        detectable = "" if v.detectable is None else pct(v.detectable)
        holm_p = "" if iv is None else f"{v.holm_p_reproduce:.3g}, {v.holm_p_contradict:.3g}"
        trained = "; ".join(f"{label}: {trained_cell(reached.get(label))}" for label in (v.claim.method,
                                                                                          v.claim.baseline))
        body.append([v.claim.describe(), v.claim.where, difference, detectable, v.headline, v.verdict, v.reason,
                     holm_p, trained, paper_training_cell(reported)])
        if levels:
            gain = "n/a" if v.baseline_gain is None else (f"{v.baseline_gain:+.1f} pts (threshold "
                                                          f"{v.claim.learned_threshold:+.1f})")
            body[-1] += [baseline_cell(levels[i]), gain]
    return header, body


def difference_cell(iv) -> str:
    """A paired difference's interval (fractions) in points: ``+2.1 [0.4, 3.8]``, ``FLOOR_MARK`` when at the floor."""
    if iv is None:
        return "not evaluated"
    return (f"{'+' if iv.estimate > 0 else ''}{pct(iv.estimate)} [{pct(iv.low)}, {pct(iv.high)}]"
            f"{FLOOR_MARK if iv.rests_on_floor else ''}")


def paper_means_cell(claim, means: tuple[float, float] | None, n_benches: int, missing: tuple[str, ...]) -> str:
    """The paper's mean of a claim's method and baseline over ``n_benches`` benchmarks (percent) and their
    difference: ``ktae 43.44 vs uniform 41.20: Δ +2.24 (5 benchmarks)``."""
    if means is None:
        return f"none for {', '.join(missing)}" if missing else "no paper numbers"
    return (f"{claim.method} {means[0]:.2f} vs {claim.baseline} {means[1]:.2f}: Δ {means[0] - means[1]:+.2f} "
            f"({n_benches} benchmark{'' if n_benches == 1 else 's'})")


STAND_IN_NOTE = ("Stand-in benchmarks (`stand_ins` in `{file}`): a benchmark of ours that stands in for another one "
                 "of the paper's is not what the paper measured, so the claim's mean over benchmarks, judged above "
                 "with it, may rest on a part of the paper's gain that this benchmark does not test. Beside it, the "
                 "same mean without the stand-ins: the paper's, from its reported numbers, and ours (Δ with its 95% "
                 "interval), over the same benchmarks.")


def stand_in_table(judged: list[Verdict], means: list[StandInMean | None]) -> Table:
    """One row per claim on the mean whose benchmarks hold a stand-in (``summary.without_stand_ins``): the paper's
    means and difference with and without the stand-ins, and ours."""
    header = ["claim", "stand-in benchmark", "paper: with it", "paper: without it", "ours: Δ with it [95% CI]",
              "ours: Δ without it [95% CI]"]
    body = []
    for v, m in zip(judged, means, strict=True):
        if m is None:
            continue
        n_all = len(m.dropped) + len(m.kept)
        body.append([v.claim.describe(), "; ".join(m.notes), paper_means_cell(v.claim, m.paper_with, n_all, m.missing),
                     paper_means_cell(v.claim, m.paper_without, len(m.kept), m.missing_without),
                     difference_cell(m.ours_with), difference_cell(m.ours_without)])
    return header, body


def stand_in_line(m: StandInMean) -> str:
    """The bottom line's addition for a claim with stand-ins: Δ without them, ours and the paper's."""
    paper = StandInMean.paper_difference(m.paper_without)
    return (f"; without {', '.join(m.dropped)} (stand-in): Δ {difference_cell(m.ours_without)}"
            + ("" if paper is None else f", paper {paper:+.2f}"))


def detectability_table(rows: list[dict]) -> Table:
    """Per label and benchmark (or the mean): the paired difference's variance components and detectable effect."""
    header = ["method", "vs", "benchmark", "seeds x problems", "seed sd", f"seed sd, {UPPER_LEVEL:.0%} bound",
              "problem sd", "residual sd", "detectable at 80% power (seed sd at its bound)", "seed variance"]
    body = [[r["method"], r["baseline"], r["bench"], f"{r['n_seeds']} x {r['n_problems']}", _points(r["seed_sd"]),
             _points(r.get("seed_sd_bound")), _points(r["problem_sd"]), _points(r["residual_sd"]),
             _points(r["detectable"]), r["variance"] or ""]
            for r in rows]
    return header, body


# --- the bottom line ----------------------------------------------------------------------------------------------

BOTTOM_LINE_CLAIMS = 8  # the section stays a screen: more claims are counted and left to the claims table
SETTLED = ("reproduced", "contradicted")


def bottom_line(judged: list[Verdict], levels: list[BaselineLevel], n_seeds: int,
                stand_ins: list[StandInMean | None] | None = None) -> list[str]:
    """One line per claim, at most ``BOTTOM_LINE_CLAIMS``: its headline verdict, Δ [95% CI], the effect this sweep
    detects, the seeds per label that would settle an unsettled one, a baseline far from the paper's, and the mean
    without stand-in benchmarks (``stand_ins``, one per claim: ``summary.without_stand_ins``)."""
    lines = []
    stand_ins = stand_ins or [None] * len(judged)
    for i, (v, level) in enumerate(list(zip(judged, levels, strict=True))[:BOTTOM_LINE_CLAIMS]):
        claim, iv = v.claim, v.interval
        scope = "mean over benchmarks" if claim.benchmark == "mean" else claim.benchmark
        claimed = (f"claim {claim.difference:+.1f} pts" if claim.kind == "improvement"
                   else f"claim parity within ±{claim.margin:g}")
        line = f"{claim.method} vs {claim.baseline}, {scope} ({claimed}): {v.headline}"
        if v.headline == "reproduced" and claim.kind == "improvement" and v.holm_p_contradict < ALPHA_ONE_SIDED:
            line += " (a smaller effect: the interval excludes the claim too)"
        if iv is not None:
            line += f"; Δ {'+' if iv.estimate > 0 else ''}{pct(iv.estimate)} [{pct(iv.low)}, {pct(iv.high)}]"
        if v.detectable is not None:
            line += "" if v.underpowered else f"; detects {pct(v.detectable)}"  # the headline says it otherwise
            if v.underpowered or not (v.headline.startswith(SETTLED) or v.undertrained):
                line += settle_note(v, n_seeds)
        if level.mismatch:
            line += f"; paper's baseline {level.paper:.1f} lies outside ours ({with_ci(level.ours)})"
        if stand_ins[i] is not None:
            line += stand_in_line(stand_ins[i])
        lines.append(line)
    if len(judged) > BOTTOM_LINE_CLAIMS:
        lines.append(f"{len(judged) - BOTTOM_LINE_CLAIMS} more claim(s) in the claims table")
    return lines


def settle_note(v: Verdict, n_seeds: int) -> str:
    """The seeds per label whose detectable effect reaches the claim's (``Verdict.seeds_to_settle``)."""
    if v.seeds_to_settle is None:
        return (f"; no seed count up to {MAX_SEEDS} detects {v.claim.effect:g} pts (the problems' part does not "
                f"shrink with seeds)")
    if v.seeds_to_settle > n_seeds:
        return f"; {v.seeds_to_settle} seeds per label would detect {v.claim.effect:g} pts"
    return ""
