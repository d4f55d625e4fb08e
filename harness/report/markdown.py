"""``leaderboard.md`` (renders on GitHub): per checkpoint (budget fraction) a ranked table over benchmarks, then one
table per benchmark, the figures, the realised budget per run and the definitions.

The notes (protocol, A/A calibration, unmatched budgets, reported numbers) are markdown-flavoured text that
``report.html`` shows too.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.config.paths import REPO_ROOT
from harness.config.schema import Resolved
from harness.data.decontamination import LIMIT_KEY, REASON_KEY, REPORT_FILE
from harness.report.calibration import GUARD_LEVEL
from harness.report.evidence import Evidence
from harness.report.fidelity import Fidelity
from harness.report.outliers import COLLAPSE_ADVICE, OUTLIER_K
from harness.report.power import UPPER_LEVEL
from harness.report.reported import Reported
from harness.report.summary import (
    baseline_level,
    calibration_checks,
    calibration_pairs,
    claim_verdicts,
    detectability,
    mean_training_share,
    outlying,
    training_reached,
    without_outlying,
    without_stand_ins,
)
from harness.report.tables import (
    FLOOR_LEGEND,
    FLOOR_MARK,
    STAND_IN_NOTE,
    bench_table,
    bottom_line,
    claims_table,
    detectability_table,
    overview_table,
    pct,
    runs_table,
    select,
    stand_in_table,
)
from harness.report.training_noise import CALIBRATED, MODERATED, POOLED
from harness.report.verdicts import DEFAULT_CLAIM_POINTS, PARITY_MARGIN_POINTS, Verdict

BUDGET_TOLERANCE = 0.05  # a run whose realised budget is more than 5% off its amount is flagged


# --- notes --------------------------------------------------------------------------------------------------------


def protocol_note(evidence: Evidence, resolved: Resolved, n_resamples: int) -> str:
    """What the numbers are: metric, budget, seeds, problems, intervals, and how Δ, P, verdict and rank read."""
    budget = resolved.preset.train.budget
    problems = ", ".join(f"{b} {len(p)}" for b, p in evidence.problem_ids.items())
    note = (f"Accuracy in %. {evidence.avg_metric}: mean correctness of k = {evidence.k} samples per problem at "
            f"T = {evidence.temperature:g}; greedy: one completion at T = 0. Budget: {budget.kind} = "
            f"{budget.amount:g}, compared at each checkpoint fraction. Seeds: {len(evidence.seeds)} "
            f"({', '.join(map(str, evidence.seeds))}); problems: {problems}. "
            f"Intervals of means: 95% t intervals over seeds and problems (the seed part with S - 1 degrees of "
            f"freedom, never narrower than the seed x problem residual with (S - 1)(P - 1), the problem part with "
            f"P - 1); of Δ: the same with the seed part pooled over the sweep's labels (below; docs/statistics.md); "
            f"IQM and P(X > Y): 95% percentile "
            f"bootstrap ({n_resamples} resamples), seeds and problems resampled (problems within each benchmark). ")
    if evidence.baseline is None:
        note += ("This sweep has no `uniform` label, so there is no baseline: the Δ, P and verdict columns are "
                 "empty and methods are not ranked against each other.")
    else:
        note += (f"Δ: paired difference to `{evidence.baseline}` (same seed indices, same problems). P(X > Y): "
                 f"probability that a seed of the method beats a seed of the baseline (averaged over benchmarks for "
                 f"the overview). Verdict 'better' / 'worse' when the Δ's two-sided p, Holm-adjusted over the "
                 f"table's comparisons with the baseline, is below 5%, else 'tied'; rank = 1 + the number of methods "
                 f"that beat this one, Holm-adjusted over all pairs of the table (equal ranks: not separated). Each "
                 f"interval is 95% on its own: one that excludes 0 beside a 'tied' did not survive the correction.")
    if evidence.baseline is not None and len(evidence.seeds) > 1:
        note += " " + pooling_note(evidence)
    if len(evidence.seeds) == 1:
        note += (" **One seed only: the intervals cover problem sampling, not training randomness; read 'better' "
                 "and 'worse' with care.**")
    return note


def pooling_note(evidence: Evidence) -> str:
    """What the pooled Δ intervals assume, whether the sweep tests it, and the A/A calibration they use."""
    n_labels, n_seeds = len(evidence.labels), len(evidence.seeds)
    note = (f"**Pooled training noise:** the seed part of each Δ comes from all {n_labels} labels (a randomised-block "
            f"analysis of the labels x seeds table, ({n_labels} - 1)({n_seeds} - 1) = "
            f"{(n_labels - 1) * (n_seeds - 1)} degrees of freedom), each pair keeping its own seed x problem "
            f"residual. This assumes every method's training noise is the same size. ")
    note += (f"Where the labels' own seed variances spread more than sampling explains, each pair's noise is "
             f"moderated toward its own (empirical Bayes, as limma; `{MODERATED[POOLED]}` in "
             f"`diff_variance`). ")
    if n_seeds == 2:
        note += ("With 2 seeds the assumption is untested for any one method: its own seed variance has 1 degree of "
                 "freedom. ")
    coverage = coverage_where_assumption_fails(share=mean_training_share(evidence), n_seeds=n_seeds,
                                               calibrated=evidence.calibration is not None)
    note += (f"Where the assumption fails the intervals are too narrow, and no mark from a pair's own seeds can tell "
             f"which ones (with normal noise their spread is independent of the estimate's error). {coverage} "
             f"A method suspected of unstable training needs more seeds. {outlier_note(evidence)} ")
    if evidence.calibration is not None:
        note += (f"The noise is pooled with the preset's {evidence.calibration.describe()} for {evidence.avg_metric} "
                 f"(`{CALIBRATED}` in `diff_variance`) on each scope where the sweep's own pooled noise is not "
                 f"significantly larger (a one-sided F test at {GUARD_LEVEL:g} on their degrees of freedom)")
        refused = [f"{scope_name(scope)} at {ckpt} (F = {check.f:.1f} on ({check.sweep.df:g}, "
                   f"{check.calibration.df:g}) df, p = {check.p:.2g})"
                   for ckpt in evidence.ckpts for scope, check in calibration_checks(evidence, ckpt).items()
                   if not check.pooled]
        note += f"; refused on {'; '.join(refused)}. " if refused else ". "
    elif evidence.calibration_unused:
        note += f"A/A calibration: {evidence.calibration_unused}. "
    else:
        note += "No A/A calibration of this preset (`snakemake calibrate`). "
    return note + "Which variance each Δ used: `diff_variance` in leaderboard.csv."


COVERAGE_FILE = REPO_ROOT / "results" / "bench" / "interval_coverage.json"  # studies/interval_coverage.py's output
BROKEN_CELLS = {"noisy pair": "a method with 3x the others' training noise",
                "collapse": "a baseline whose runs collapse 1 time in 10",
                "collapse to zero": "one whose runs drop to near-zero accuracy 1 time in 10"}


def coverage_where_assumption_fails(path: Path = COVERAGE_FILE, share: float | None = None,
                                    n_seeds: int | None = None, calibrated: bool = False) -> str:
    """The report's rule's simulated coverage on the mean over benchmarks, from the coverage study's output: at the
    simulated seed count nearest ``n_seeds`` and the simulated training share (``training_noise.training_share``)
    nearest the sweep's ``share``, where the assumption holds and in the cells that break it, beside the worst case
    over every simulated share and seed count (the worst case alone when the share or the seeds are unknown); with
    ``calibrated``, also the calibrated cells (a calibration that matches the sweep, a stale one). The situations
    alone when the output is absent."""
    if not path.is_file():
        return ("Where it fails: " + "; ".join(BROKEN_CELLS.values())
                + " (studies/interval_coverage.py measures how narrow).")
    record = json.loads(path.read_text())
    settings, coverage = record["settings"], record["coverage"]
    rule, seeds = settings["report_rule"], settings["seeds"]
    regimes = settings.get("regimes") or {"simulated": {cell: cell for cell in BROKEN_CELLS}}

    def rate(cell: str, n: int, which: str = rule) -> float:
        return coverage[f"{cell}/S={n}"]["mean"]["coverage"][which]

    situations = {cell: text for cell, text in BROKEN_CELLS.items() if any(cell in r for r in regimes.values())}
    worst = {cell: min(rate(regime[cell], n) for regime in regimes.values() if cell in regime for n in seeds)
             for cell in situations}
    span = f"{seeds[0]}-{seeds[-1]} seeds"
    shares = {}
    if n_seeds is not None:
        nearest_seeds = min(seeds, key=lambda n: (abs(n - n_seeds), n))
        shares = {name: coverage[f"{regime['holds']}/S={nearest_seeds}"]["mean"].get("training_share")
                  for name, regime in regimes.items() if "holds" in regime}
        shares = {name: value for name, value in shares.items() if value is not None}
    if share is None or not shares:
        text = ("Simulated coverage of the 95% Δ intervals on the mean over benchmarks where it fails, worst over "
                f"{span}: " + "; ".join(f"{situation} {worst[cell]:.2f}" for cell, situation in situations.items()))
    else:
        name = min(shares, key=lambda n: abs(shares[n] - share))
        regime = regimes[name]
        text = (f"Simulated coverage of the 95% Δ intervals on the mean over benchmarks at {nearest_seeds} seeds and "
                f"the training share nearest this sweep's (training noise {share:.2f} of a paired difference's "
                f"per-seed variance, the rest sampling; simulated {shares[name]:.2f}, {name}): "
                f"{rate(regime['holds'], nearest_seeds):.2f} where every method's training noise is the same size; "
                + "; ".join(f"{situation} {rate(regime[cell], nearest_seeds):.2f}"
                            for cell, situation in situations.items() if cell in regime)
                + f" (the worst of each over the simulated shares {min(shares.values()):.2f}-"
                f"{max(shares.values()):.2f} and {span}: " + ", ".join(f"{w:.2f}" for w in worst.values()) + ")")
    cells = settings.get("calibration_cells")
    if calibrated and cells and n_seeds is not None:
        matches, stale = cells["matches"], cells["stale"]
        guarded = settings["calibrated_rule"]
        refused = coverage[f"{stale}/S={nearest_seeds}"]["mean"]["calibration_refused"]
        text += (f". With an A/A calibration pooled where its guard lets it: "
                 f"{rate(matches, nearest_seeds, guarded):.2f} when it matches the sweep's training noise, "
                 f"{rate(stale, nearest_seeds, guarded):.2f} when the sweep's training sd is 3x the calibration's "
                 f"(refused in {refused:.0%} of those sweeps; pooled regardless: "
                 f"{rate(stale, nearest_seeds, 'calibrated, no guard'):.2f}); the figures before are without a "
                 f"calibration")
    return text + " (results/bench/interval_coverage.json)."


def scope_name(scope: tuple[str, ...]) -> str:
    return scope[0] if len(scope) == 1 else "the mean over benchmarks"


def outlier_note(evidence: Evidence) -> str:
    """The outlying-run rule in one sentence, and what it found at the full budget."""
    found = outlying(evidence, evidence.final_ckpt)
    rule = (f"Outlying runs: a run more than {OUTLIER_K:g} robust scales below its label's other seed(s) on the mean "
            f"over benchmarks is flagged (docs/statistics.md, 'Outlying runs')")
    if not found:
        return f"{rule}; none at {evidence.final_ckpt}."
    return (f"{rule}; {len(found)} at {evidence.final_ckpt}, listed under its table with each Δ with and without "
            f"it: {COLLAPSE_ADVICE}.")


def outlier_lines(evidence: Evidence) -> list[str]:
    """The flagged runs at the full budget (``summary.outlying``) and the Δ on the mean with and without them."""
    ckpt = evidence.final_ckpt
    found = outlying(evidence, ckpt)
    if not found:
        return []
    lines = [f"**Outlying run** at {ckpt}: {run.describe()} (docs/statistics.md, 'Outlying runs'); read its logs"
             for run in found]
    compared = without_outlying(evidence, ckpt, found)
    if compared:
        seeds = sorted({run.seed for run in found})
        left = len(evidence.seeds) - len(seeds)

        def cell(iv) -> str:
            return f"{'+' if iv.estimate > 0 else ''}{pct(iv.estimate)} [{pct(iv.low)}, {pct(iv.high)}]"

        note = (" (1 seed left: those intervals hold the problems' sampling only, not training randomness)"
                if left == 1 else "")
        lines.append(f"**Δ vs `{evidence.baseline}` on the mean over benchmarks, with / without seed "
                     f"{', '.join(map(str, seeds))}** (dropped from every label, so the pairs stay paired; "
                     f"{left} seed(s) left{note}): "
                     + "; ".join(f"{label} {cell(with_)} / {cell(without)}" for label, with_, without in compared)
                     + f". {COLLAPSE_ADVICE[0].upper()}{COLLAPSE_ADVICE[1:]}.")
    return lines


def calibration_lines(evidence: Evidence, summary: list[dict]) -> list[str]:
    """A/A verdicts: the statistics' check (an A/A pair must come out tied); 'calibrated' only where the preset's
    A/A calibration backs the training noise the intervals use (its guard, ``calibration.check_calibration``, lets it
    in); then each scope where the guard refused it, with the test, and a calibration whose mean scope is implausibly
    small (``Calibration.mean_warning``)."""
    checks = {ckpt: calibration_checks(evidence, ckpt) for ckpt in evidence.ckpts}
    lines = []
    for a, b in calibration_pairs(evidence):
        pair = (a, b) if b == evidence.baseline else (b, a)
        for ckpt in evidence.ckpts:
            rows = select(summary, ckpt=ckpt, method=pair[0], metric=evidence.avg_metric, statistic="mean")
            verdicts = {r["bench"]: r.get("verdict") for r in rows if r.get("verdict")}
            if not verdicts:
                continue
            ok = all(v == "tied" for v in verdicts.values())
            detail = ", ".join(f"{bench}: {v}" for bench, v in verdicts.items())
            refused = [scope for scope, check in checks[ckpt].items() if not check.pooled]
            pooled = [scope for scope, check in checks[ckpt].items() if check.pooled]
            tied = "tied"
            if pooled and not refused:
                tied = "tied (calibrated)"
            elif pooled:
                tied = (f"tied (calibrated on {', '.join(scope_name(s) for s in pooled)}; the calibration refused on "
                        f"{', '.join(scope_name(s) for s in refused)})")
            lines.append(f"A/A `{pair[0]}` vs `{pair[1]}` at {ckpt}: {tied if ok else 'NOT tied'} "
                         f"({detail})" + ("" if ok else " — the intervals are too narrow for this sweep (more seeds?)"))
    for ckpt, per_scope in checks.items():
        lines += [f"**A/A calibration not pooled** at {ckpt} on {scope_name(scope)}: {check.describe()}; those Δ "
                  f"intervals and detectable effects use the sweep's own pooled noise"
                  for scope, check in per_scope.items() if not check.pooled]
    warning = evidence.calibration.mean_warning() if evidence.calibration is not None else ""
    if warning:
        lines.append(f"**A/A calibration suspect:** {warning}")
    return lines


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


CODE_PARTS = {"training_code": "shared training code", "packages": "installed packages"}
EVAL_CODE_PARTS = {"evaluation_code": "evaluation code", "packages": "installed packages"}


def code_warnings(evidence: Evidence) -> list[str]:
    """Results the comparison mixes from different code (``harness.config.code_digests``): runs whose recorded
    shared training code or packages differ, seeds of one label trained by different method source, evaluations
    whose scoring code or packages differ; one line per difference, naming the results of each version. Results
    recorded before code digests existed are named as such when others have them; none at all says nothing."""
    runs = {f"{label}/seed{seed}": run.get("provenance", {}).get("code") for (label, seed), run in
            evidence.runs.items()}
    evals = {f"{label}/seed{seed}/{ckpt}/{bench}": result.get("code") for (label, seed, ckpt, bench), result in
             evidence.results.items()}
    lines = _differing("runs", runs, CODE_PARTS) + _differing("evaluations", evals, EVAL_CODE_PARTS)
    for label in evidence.labels:
        own = {name: code for name, code in runs.items() if name.split("/seed")[0] == label}
        lines += _differing(f"seeds of {label}", own, {"method_source": f"{label}'s method source"})
    return lines


def _differing(what: str, records: dict[str, dict | None], parts: dict[str, str]) -> list[str]:
    """A line per code part whose recorded digest is not one value over ``records`` (name -> code record)."""
    if not any(records.values()):
        return []
    lines = []
    for key, name in parts.items():
        groups: dict[str, list[str]] = {}
        for result, code in records.items():
            groups.setdefault((code or {}).get(key, "not recorded")[:12], []).append(result)
        if len(groups) > 1:
            shown = "; ".join(f"{digest}: {', '.join(sorted(names)[:4])}{' ...' if len(names) > 4 else ''} "
                              f"({len(names)})" for digest, names in sorted(groups.items()))
            lines.append(f"{what} from different {name}: {shown}")
    return lines


def reported_lines(reported: Reported, evidence: Evidence) -> list[str]:
    """Where the paper's numbers come from, how its protocol differs, and which of them this sweep lacks."""
    lines = [f"Source: {reported.source or 'not given'}; metric: {reported.metric or 'not given'}; protocol: "
             f"{reported.protocol or 'not given'} (`{reported.path.name}`)."]
    if reported.differences:
        lines += ["", "Protocol differences to ours:"] + [f"- {d}" for d in reported.differences]
    if reported.stand_ins:
        lines += ["", "Stand-in benchmarks (a claim's mean is also shown without them):"] + [
            f"- {bench}: {text}" for bench, text in reported.stand_ins.items()]
    unknown = [f"{lab}/{b}" for lab, per in reported.numbers.items() for b in per
               if lab not in evidence.labels or b not in evidence.benches]
    if unknown:
        lines += ["", f"Reported but not in this sweep: {', '.join(unknown)}."]
    return lines


def claims_note(judged: list[Verdict], reported: Reported | None) -> str:
    """How the claims table reads: which claims, the verdict rules, the parity margin, Holm's family."""
    if reported and reported.claims:
        source = f"The paper's claims (`claims` in `{reported.path.name}`)"
    else:
        source = (f"No paper claims for this sweep: stand-in claims show the machinery, each label against the "
                  f"baseline on the mean over benchmarks: a {DEFAULT_CLAIM_POINTS:g}-point improvement, or parity for "
                  f"a label of the baseline's own method (the A/A pair)")
    evaluated = sum(v.interval is not None for v in judged)
    return (f"{source}, judged at the full budget by the paired difference and its 95% interval. Improvement: "
            f"reproduced when the interval excludes 0 on the claimed side, contradicted when it excludes the "
            f"paper's difference (or shows the opposite), inconclusive when it covers both. Parity: reproduced "
            f"(equivalent) when the interval lies inside ±margin (default {PARITY_MARGIN_POINTS:g} point), "
            f"contradicted when it lies beyond it. Detectable: the paired effect this sweep's seeds x problems "
            f"call 'reproduced' with 80% power (parity: the margin it establishes with 80% power when the truth is "
            f"0), its pooled training noise taken at the {UPPER_LEVEL:.0%} upper confidence bound as `harness power` "
            f"plans seeds (so are the seeds that would settle a claim). The verdict is Holm's, the family-wise error "
            f"over the {evaluated} evaluated claim(s) of this sweep held at 2.5% per side, unless the detectable "
            f"effect exceeds the claim's effect: then 'insufficient replication', whatever the interval shows (the "
            f"per-claim verdict stands beside it).")


STATISTICS_DOC = "docs/statistics.md"


def bottom_line_lines(evidence: Evidence, summary: list[dict], reported: Reported | None) -> list[str]:
    """The section leaderboard.md opens with (``tables.bottom_line``), and where its definitions are."""
    judged = claim_verdicts(evidence, reported)
    if not judged:
        return []
    levels = [baseline_level(v.claim, evidence, summary, reported) for v in judged]
    return ["## Bottom line", "", bottom_line_intro(evidence, reported), "",
            *[f"- {line}" for line in bottom_line(judged, levels, len(evidence.seeds),
                                                  [without_stand_ins(v, evidence, reported) for v in judged])], ""]


def bottom_line_intro(evidence: Evidence, reported: Reported | None) -> str:
    source = "the paper's claims" if reported and reported.claims else "stand-in claims (no paper)"
    return (f"At the full budget ({evidence.final_ckpt}), {source}, {len(evidence.seeds)} seed(s) per label; Δ in "
            f"points with its 95% interval, the effect this sweep detects with 80% power (its training noise at the "
            f"{UPPER_LEVEL:.0%} upper bound); details under Claims, "
            f"definitions under How to read these numbers.")


def claims_lines(evidence: Evidence, summary: list[dict], reported: Reported | None) -> list[str]:
    """The claims section and the detectable effects per benchmark (markdown)."""
    judged = claim_verdicts(evidence, reported)
    parts = [f"## Claims ({evidence.final_ckpt})", "", claims_note(judged, reported), ""]
    if judged:
        levels = [baseline_level(v.claim, evidence, summary, reported) for v in judged]
        parts += [markdown_table(*claims_table(judged, training_reached(evidence), reported, levels)), ""]
        header, body = stand_in_table(judged, [without_stand_ins(v, evidence, reported) for v in judged])
        if body:
            parts += ["### The claims' means without stand-in benchmarks", "",
                      STAND_IN_NOTE.format(file=reported.path.name), "", markdown_table(header, body), ""]
    rows = detectability(evidence)
    if rows:
        parts += ["### Detectable effects (paired, 80% power)", "",
                  "Per label against the baseline: standard deviations (points) of the paired difference's seed, "
                  "problem and residual components (the largest over benchmarks for the mean) and the effect "
                  f"these seeds x problems detect with the seed sd at its {UPPER_LEVEL:.0%} upper confidence bound "
                  "(a few seeds' estimate is below the truth about half the time); `harness power` gives the seeds "
                  "a smaller effect needs.", "",
                  markdown_table(*detectability_table(rows)), ""]
    return parts


# --- the page -----------------------------------------------------------------------------------------------------


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    def escape(cell: str) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _checkpoint_sections(evidence: Evidence, summary: list[dict]) -> list[str]:
    """Per checkpoint, latest first: the overview table; the notes under the full budget; the failed runs."""
    final, parts = evidence.final_ckpt, []
    for ckpt in sorted(evidence.ckpts, reverse=True):
        title = "Full budget" if ckpt == final else f"{evidence.ckpts[ckpt]:.0%} of the budget"
        parts += [f"## {title} ({ckpt})", "", markdown_table(*overview_table(evidence, summary, ckpt)), ""]
        if ckpt == final:
            parts += [f"- {line}" for line in calibration_lines(evidence, summary)]
            parts += [f"- {line}" for line in outlier_lines(evidence)]
            parts += [f"- **Budget not matched:** {line}" for line in budget_warnings(evidence)]
            parts += [f"- **Different code:** {line}" for line in code_warnings(evidence)] + [""]
        parts += [f"- **Failed run, left out:** `{f['label']}` seed {f['seed']} ({f['stage']}): {f['error']} "
                  f"(log: `{f['log']}`)" for f in evidence.failures]
    return parts


FIDELITY_HEADER = ["element", "paper", "ours", "status", "note"]
OVERLAP_HEADER = ["benchmark", "problems (under 8 words)", "training rows flagged", "share of training rows",
                  "problems hit", "near-duplicates", "most shared 8-gram (rows)", "example rows"]


def overlap_note(report: dict | None) -> str:
    """What the training data overlap table measured, and the limit the data job held it to."""
    if report is None:
        return (f"Not measured: this sweep has no `data/{REPORT_FILE}` (its data job predates the decontamination "
                "report), so no overlap of its training rows with the benchmarks is known.")
    limit = report["limit"]
    reason = limit[REASON_KEY].strip()
    return (f"`data/{REPORT_FILE}`: the {report['train_rows']} training rows, from {report['train']['source']}, "
            f"against the problems of each benchmark, by {report['method']}. A row is flagged when it shares an "
            f"{report['ngram']}-gram with a problem or holds a shorter problem whole; a problem is hit when some row "
            f"flags it, and has a near-duplicate when one row holds at least {report['near_duplicate_share']:.0%} of "
            f"its {report['ngram']}-grams (a shorter problem: the whole of it). Limit (`{LIMIT_KEY}`): "
            f"{limit[LIMIT_KEY]:.2%} of the training rows per benchmark"
            + (f"; the preset's reason: {reason}" if reason else "") + ".")


def overlap_table(report: dict, quote: str = "`") -> tuple[list[str], list[list[str]]]:
    """One row per benchmark of the data job's decontamination report; ``quote`` marks an 8-gram as code."""
    body = []
    for name, bench in report["benchmarks"].items():
        gram = bench["shared_ngrams"][0] if bench["shared_ngrams"] else None
        body.append([name, f"{bench['problems']} ({bench['short_problems']})",
                     f"{bench['rows_flagged']} of {report['train_rows']}", f"{bench['fraction']:.2%}",
                     str(bench["problems_hit"]), str(bench["near_duplicates"]),
                     f"{quote}{gram[0]}{quote} ({gram[1]})" if gram else "-",
                     ", ".join(bench["example_rows"][:3]) or "-"])
    body += [[name, f"not measured: {bench['file']}: {bench['reason']}", *["-"] * (len(OVERLAP_HEADER) - 2)]
             for name, bench in report.get("unmeasured", {}).items()]
    return OVERLAP_HEADER, body


def overlap_lines(report: dict | None) -> list[str]:
    """The training data overlap section of leaderboard.md."""
    parts = ["## Training data overlap with the benchmarks", "", overlap_note(report), ""]
    return parts + ([markdown_table(*overlap_table(report)), ""] if report is not None else [])


def fidelity_lines(fidelity: Fidelity) -> list[str]:
    """The protocol fidelity table: is this sweep a reproduction of its paper, element by element?"""
    body = [[r.element, r.paper, r.ours, r.status, r.note] for r in fidelity.rows]
    return ["## Protocol fidelity", "", f"**{fidelity.verdict()}.** Source: {fidelity.source}.", "",
            markdown_table(FIDELITY_HEADER, body), ""]


def markdown(evidence: Evidence, resolved: Resolved, summary: list[dict], reported: Reported | None,
             figures: dict[str, Path], root: Path, n_resamples: int, fidelity: Fidelity | None = None,
             decontamination: dict | None = None) -> str:
    """The text of leaderboard.md; figure links are relative to ``root``, the folder it is written to;
    ``decontamination``: the data job's overlap report (None: not measured)."""
    final = evidence.final_ckpt
    parts = [f"# Leaderboard: sweep `{resolved.sweep.name}` (preset `{resolved.preset.name}`)", ""]
    parts += bottom_line_lines(evidence, summary, reported)
    parts += fidelity_lines(fidelity) if fidelity else []
    tables = _checkpoint_sections(evidence, summary) + claims_lines(evidence, summary, reported)
    tables += [f"## Per benchmark ({final})", ""]
    for bench in evidence.benches:
        tables += [f"### {bench}", "", markdown_table(*bench_table(evidence, summary, final, bench, reported)), ""]
    if any(FLOOR_MARK in part for part in tables):  # the legend only where a table marks an interval
        parts += [FLOOR_LEGEND, ""]
    parts += tables + overlap_lines(decontamination)
    parts += ["## How to read these numbers", "", protocol_note(evidence, resolved, n_resamples), "",
              f"Definitions and the statistics behind them: {STATISTICS_DOC}.", ""]
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
