"""harness.report on a synthetic sweep: the files exist, the CSV numbers are what the samples give, the A/A pair is
tied and the real improvement is not, reported numbers sit beside ours, and report.html is self-contained."""

import ast
import csv
import html as html_module
import json
import re
import statistics
from pathlib import Path

import pytest
from report_fixture import BENCHES, LABELS, build_sweep

from harness.config.schema import ConfigError
from harness.report import html as html_report
from harness.report.evidence import find_failures, read_sweep
from harness.report.intervals import difference_interval
from harness.report.leaderboard import verdict_record, write_leaderboard
from harness.report.markdown import (
    budget_warnings,
    code_warnings,
    coverage_where_assumption_fails,
    markdown,
    protocol_note,
)
from harness.report.reported import load_reported
from harness.report.scores import crossed_variance
from harness.report.summary import claim_verdicts, mean_training_share, noise_at, summarize
from harness.report.tables import (
    FLOOR_LEGEND,
    FLOOR_MARK,
    bench_table,
    claims_table,
    overview_table,
    pct,
    select,
    with_ci,
)
from harness.report.training_noise import CALIBRATED, MODERATED, POOLED, VARIANCE_BASES

REPO = Path(__file__).resolve().parent.parent
REPORTED = """
source: "A paper, Table 2"
metric: avg@16
protocol: "Qwen2.5-Math-7B, 16 samples at T = 0.6"
differences:
  - "we sample k = 4, not 16"
  - "tiny char-level model instead of Qwen2.5-Math-7B"
numbers:
  uniform: {arith: 40.5, arith_ood: 50.0}
  entropy: {arith: 70.0}
  gmts: {arith: 80.0}
claims:
  - {method: entropy, benchmark: mean, metric: avg@k, difference: 30.0, kind: improvement, where: "Table 2"}
  - {method: entropy, benchmark: arith, metric: avg@k, difference: 80.0, kind: improvement, where: "Table 3"}
  - {method: uniform-aa, benchmark: mean, metric: avg@k, difference: 0.0, kind: parity, margin: 12.0,
     where: "our A/A pair"}
  - {method: gmts, benchmark: mean, metric: greedy, difference: 1.0, kind: improvement, where: "Table 4"}
  - {method: uniform-aa, benchmark: mean, metric: avg@k, difference: 20.0, kind: improvement, where: "Table 5"}
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    resolved, paths = build_sweep(tmp)
    reported_file = tmp / "reported.yaml"
    reported_file.write_text(REPORTED)
    written = write_leaderboard(resolved, paths, reported_file=reported_file)
    return resolved, paths, written


def read_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def per_problem_means(folder: Path, mode: str) -> dict[str, float]:
    correct: dict[str, list[bool]] = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["mode"] == mode:
            correct.setdefault(row["id"], []).append(row["correct"])
    return {pid: statistics.fmean(v) for pid, v in correct.items()}


def test_writes_tables_figures_and_html(sweep):
    _, paths, written = sweep
    names = {p.relative_to(paths.root).as_posix() for p in written}
    assert {"leaderboard.md", "leaderboard.csv", "leaderboard_runs.csv", "leaderboard.json", "report.html"} <= names
    figures = {n for n in names if n.startswith("figures/")}
    assert {"figures/accuracy_vs_steps.png", "figures/accuracy_vs_generated.png", "figures/accuracy_vs_forwarded.png",
            "figures/per_benchmark.png", "figures/difference_to_baseline.png", "figures/training_curves.png"} == figures
    for name in names:
        assert (paths.root / name).stat().st_size > 0
    for name in figures:
        assert (paths.root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_numbers_equal_what_the_samples_give(sweep):
    resolved, paths, _ = sweep
    rows = read_csv(paths.root / "leaderboard.csv")
    seeds = resolved.sweep.seeds
    for row in rows:
        if row["statistic"] != "mean":
            continue
        mode = "greedy" if row["metric"] == "greedy" else "sampled"
        label = row["method"]
        run_seeds = [0] if label == "warmstart" else seeds
        benches = list(BENCHES) if row["bench"] == "all" else [row["bench"]]
        per_bench = []
        for bench in benches:
            per_seed = [statistics.fmean(per_problem_means(paths.eval_dir(label, s, row["ckpt"], bench), mode).values())
                        for s in run_seeds]
            per_bench.append(statistics.fmean(per_seed))
        assert float(row["estimate"]) == pytest.approx(statistics.fmean(per_bench)), row
        assert float(row["ci_low"]) <= float(row["estimate"]) <= float(row["ci_high"])
        assert row["ci_at_floor"] in {"True", "False"}  # a t interval; the IQM rows leave it empty
        assert int(row["n_seeds"]) == len(run_seeds)
        assert int(row["n_problems"]) == sum(BENCHES[b] for b in benches)
        assert int(row["k"]) == (1 if mode == "greedy" else 4)
    # the paired difference is the difference of the two estimates
    by_key = {(r["ckpt"], r["method"], r["bench"], r["metric"], r["statistic"]): r for r in rows}
    for (ckpt, _, bench, metric, statistic), row in by_key.items():
        if row["diff"]:
            base = by_key[(ckpt, "uniform", bench, metric, statistic)]
            assert float(row["diff"]) == pytest.approx(float(row["estimate"]) - float(base["estimate"]))


def test_realised_budget_columns(sweep):
    _, paths, _ = sweep
    rows = read_csv(paths.root / "leaderboard.csv")
    for row in rows:
        if row["method"] == "warmstart":
            assert float(row["spent/steps"]) == 0
            continue
        index = list(LABELS).index(row["method"])
        steps = {"ckpt-050": 2, "ckpt-100": 4}[row["ckpt"]]
        assert float(row["spent/steps"]) == steps
        assert float(row["spent/tokens/generated"]) == (1000 - 10 * index) * steps  # metrics.jsonl at that step
        assert float(row["spent/tokens/forwarded"]) == 1500 * steps
    runs = read_csv(paths.root / "leaderboard_runs.csv")
    assert len(runs) == (1 + len(LABELS) * 3 * 2) * len(BENCHES)
    for row in runs:
        results = json.loads((paths.root / row["results_file"]).read_text())
        assert float(row["avg@k"]) == pytest.approx(results["metrics"]["avg@4"])
        assert float(row["greedy_accuracy"]) == pytest.approx(results["metrics"]["greedy_accuracy"])


def test_aa_pair_is_tied_and_the_real_improvement_is_not(sweep):
    _, paths, _ = sweep
    rows = read_csv(paths.root / "leaderboard.csv")
    avg = [r for r in rows if r["metric"] == "avg@4" and r["statistic"] == "mean" and r["method"] != "warmstart"]
    assert {r["verdict"] for r in avg if r["method"] == "uniform-aa"} == {"tied"}
    assert {r["verdict"] for r in avg if r["method"] == "entropy"} == {"better"}
    assert {r["verdict"] for r in avg if r["method"] == "uniform"} == {""}  # the baseline itself
    ranks = {r["method"]: int(r["rank"]) for r in avg if r["bench"] == "all" and r["ckpt"] == "ckpt-100"}
    assert ranks == {"entropy": 1, "uniform": 2, "uniform-aa": 2}
    md = (paths.root / "leaderboard.md").read_text()
    assert "A/A `uniform-aa` vs `uniform` at ckpt-100: tied (" in md  # not "calibrated": no calibration backs it
    assert "calibrated" not in md
    assert "NOT tied" not in md and "Budget not matched" not in md


def test_markdown_has_the_budget_fractions_and_reference_row(sweep):
    _, paths, _ = sweep
    md = (paths.root / "leaderboard.md").read_text()
    assert "## Full budget (ckpt-100)" in md and "## 50% of the budget (ckpt-050)" in md
    assert "warmstart (reference, step 0)" in md
    assert "![accuracy_vs_steps](figures/accuracy_vs_steps.png)" in md
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    widths = {line.count(" | ") for line in table_lines if "n_seeds" in line}
    assert widths and all(w > 5 for w in widths)
    assert "spent_flops" in md  # an extra run.json budget key is shown, not an error


def test_reported_numbers_sit_beside_ours(sweep):
    _, paths, _ = sweep
    rows = read_csv(paths.root / "leaderboard.csv")
    final = {(r["method"], r["bench"]): r for r in rows if r["ckpt"] == "ckpt-100" and r["metric"] == "avg@4"
             and r["statistic"] == "mean"}
    assert float(final[("uniform", "arith")]["reported"]) == pytest.approx(0.405)
    assert float(final[("entropy", "arith")]["reported"]) == pytest.approx(0.70)
    assert final[("entropy", "arith_ood")]["reported"] == ""
    md = (paths.root / "leaderboard.md").read_text()
    assert "| reported |" in md
    assert "- we sample k = 4, not 16" in md and "Qwen2.5-Math-7B, 16 samples at T = 0.6" in md
    assert "Reported but not in this sweep: gmts/arith." in md
    page = (paths.root / "report.html").read_text()
    assert "we sample k = 4, not 16" in page


def test_claims_are_judged_in_both_pages(sweep):
    resolved, paths, _ = sweep
    md = (paths.root / "leaderboard.md").read_text()
    claims = md.split("## Claims (ckpt-100)")[1].split("## Per benchmark")[0]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in claims.splitlines()
            if line.startswith("| ") and ("beats" in line or "matches" in line)}
    # columns: claim, where, Δ, detectable, the headline (Holm), the per-claim verdict, why
    assert rows["entropy beats uniform on mean over benchmarks by +30.00 pts (avg@k)"][4:6] == ["reproduced"] * 2
    smaller = rows["entropy beats uniform on arith by +80.00 pts (avg@k)"]
    assert smaller[4:6] == ["reproduced"] * 2 and "also the paper's +80.00: a smaller effect" in smaller[6]
    contradicted = rows["uniform-aa beats uniform on mean over benchmarks by +20.00 pts (avg@k)"]
    assert contradicted[4:6] == ["contradicted"] * 2 and "excludes the paper's +20.00" in contradicted[6]
    parity = rows["uniform-aa matches uniform on mean over benchmarks (avg@k; paper +0.00 pts, margin ±12)"]
    assert parity[5] == "reproduced" and "equivalent" in parity[6] and "establishes is ±" in parity[6]
    # equivalent within ±12, but the baseline moved less than 12 points from the warm start: not a verdict
    assert parity[4] == "under-trained (uniform +11.7 pts over the warm start, threshold +12.0)"
    assert parity[-1] == "+11.7 pts (threshold +12.0) |" and contradicted[-1] == "+11.7 pts (threshold +1.0) |"
    # the paper's uniform (40.5, 50.0: mean 45.2) beside ours, inside our interval; the paper gives no gmts baseline
    assert parity[-2] == "paper: 45.2; ours: 42.8 [35.8, 49.8]"
    greedy = rows["gmts beats uniform on mean over benchmarks by +1.00 pts (greedy)"]
    assert greedy[-2].startswith("paper: its numbers are avg@16; ours: ")  # no sampled number against greedy
    bottom = md.split("## Bottom line")[1].split("\n## ")[0]
    assert md.index("## Bottom line") < md.index("## Full budget") < md.index("## How to read these numbers")
    assert "- uniform-aa vs uniform, mean over benchmarks (claim parity within ±12): under-trained (uniform +11.7" \
        in bottom
    assert "- gmts vs uniform, mean over benchmarks (claim +1.0 pts): not evaluated" in bottom
    assert "lies outside ours" not in bottom and len(bottom.strip().splitlines()) <= 8 + 2
    assert rows["gmts beats uniform on mean over benchmarks by +1.00 pts (greedy)"][4] == "not evaluated"
    assert "The verdict is Holm's, the family-wise error over the 4 evaluated claim(s)" in claims
    assert "### Detectable effects (paired, 80% power)" in claims and "| entropy | uniform | mean | 3 x 70 |" in claims
    claims_json = json.loads((paths.root / "leaderboard.json").read_text())["claims"]
    assert [c["verdict"] for c in claims_json] == ["reproduced", "reproduced", "reproduced", "not evaluated",
                                                   "contradicted"]
    assert claims_json[3]["p_reproduce"] is None and claims_json[0]["diff_ci_low"] > 0
    assert claims_json[3]["diff_ci_at_floor"] is None and isinstance(claims_json[0]["diff_ci_at_floor"], bool)
    page = (paths.root / "report.html").read_text()
    assert "<h2 id='claims'>" in page and "<td class='contradicted'>contradicted</td>" in page


def test_without_a_paper_the_default_claims_are_judged(sweep):
    resolved, paths, _ = sweep
    evidence = read_sweep(resolved, paths)
    judged = claim_verdicts(evidence, None)
    assert [(v.claim.method, v.claim.kind, v.claim.difference) for v in judged] == [
        ("uniform-aa", "parity", 0.0), ("entropy", "improvement", 2.0)]
    assert judged[1].verdict == "reproduced" and judged[1].holm == "reproduced"
    assert judged[0].verdict in {"inconclusive", "reproduced"}  # an A/A pair is never contradicted here
    assert all(v.detectable > 0 for v in judged)


def test_floor_mark_sits_exactly_on_the_intervals_at_the_floor(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    reported_file = tmp_path / "reported.yaml"
    reported_file.write_text(REPORTED)
    reported = load_reported(reported_file)
    evidence = read_sweep(resolved, paths)
    final, avg, scores = evidence.final_ckpt, evidence.avg_metric, evidence.scores
    for metric in evidence.metric_names:  # entropy on arith: seed 1's scores are seed 0's reversed, so the two
        x = scores[("entropy", final, "arith", metric)]  # seeds' means agree exactly: that mean is at the floor
        x[1] = x[0][::-1]

    def at_floor(label: str, bench: str, metric: str, paired: bool) -> bool:
        benches = evidence.benches if bench == "all" else [bench]
        if paired:  # a Δ pools the training noise over the labels (and falls back to its own when it departs)
            noise = noise_at(evidence, final, metric).get(tuple(benches))
            differences = {b: scores[(label, final, b, metric)] - scores[("uniform", final, b, metric)]
                           for b in benches}
            return difference_interval(differences, noise).rests_on_floor
        return crossed_variance({b: scores[(label, final, b, metric)] for b in benches}).rests_on_floor

    summary = summarize(evidence, n_resamples=200)
    cells = []  # (cell, is the interval at the floor) for every interval the tables show

    def column(header: list[str], row: list[str], name: str) -> str:
        return row[header.index(name)]

    header, body = overview_table(evidence, summary, final)
    for row in body:
        label = row[1]
        if row[0] == "ref":  # the warm start: one seed, no residual part, never at the floor
            cells += [(cell, False) for cell in row]
            continue
        cells += [(column(header, row, f"{avg} mean over benchmarks [95% CI]"), at_floor(label, "all", avg, False)),
                  (column(header, row, "IQM [95% CI]"), False)]  # a percentile interval has no floor
        cells += [(column(header, row, f"{b} {avg}"), at_floor(label, b, avg, False)) for b in evidence.benches]
        if label != "uniform":
            cells.append((column(header, row, "Δ vs uniform [95% CI]"), at_floor(label, "all", avg, True)))
    for bench in evidence.benches:
        header, body = bench_table(evidence, summary, final, bench, reported)
        for row in body:
            label = row[1]
            if row[0] == "ref":
                cells += [(cell, False) for cell in row]
                continue
            cells += [(column(header, row, f"{avg} [95% CI]"), at_floor(label, bench, avg, False)),
                      (column(header, row, "greedy [95% CI]"), at_floor(label, bench, "greedy", False))]
            if label != "uniform":
                cells += [(column(header, row, "Δ vs uniform [95% CI]"), at_floor(label, bench, avg, True)),
                          (column(header, row, "greedy Δ [95% CI]"), at_floor(label, bench, "greedy", True))]
    judged = claim_verdicts(evidence, reported)
    for verdict, row in zip(judged, claims_table(judged)[1], strict=True):
        if verdict.interval is not None:
            claim = verdict.claim
            expected = at_floor(claim.method, "all" if claim.benchmark == "mean" else claim.benchmark,
                                avg if claim.metric == "avg@k" else "greedy", True)
            cells.append((row[2], expected))
            assert verdict_record(verdict)["diff_ci_at_floor"] is expected
    assert all((FLOOR_MARK in cell) == expected and cell.count(FLOOR_MARK) <= 1 for cell, expected in cells), [
        (cell, expected) for cell, expected in cells if (FLOOR_MARK in cell) != expected]
    marked = sum(expected for _, expected in cells)
    assert 0 < marked < len(cells)  # the constructed mean (per benchmark) at the floor, others not
    claims = {v.claim.describe(): row for v, row in zip(judged, claims_table(judged)[1], strict=True)}
    assert FLOOR_MARK not in claims["entropy beats uniform on arith by +80.00 pts (avg@k)"][2]  # its Δ is pooled
    # the summary rows (leaderboard.csv, .json) carry the same flags; the IQM rows have no floor
    for row in select(summary, ckpt=final, method="entropy", metric=avg, statistic="mean"):
        assert row["ci_at_floor"] is at_floor("entropy", row["bench"], avg, False)
        assert row["diff_ci_at_floor"] is at_floor("entropy", row["bench"], avg, True)
    assert all("ci_at_floor" not in row for row in select(summary, statistic="iqm"))
    # every ‡ of the page is one of those cells, plus the legend once
    md = markdown(evidence, resolved, summary, reported, {}, paths.root, 200)
    assert md.count(FLOOR_LEGEND) == 1 and md.count(FLOOR_MARK) == marked + 1
    assert md.index(FLOOR_LEGEND) < md.index("## Full budget")
    page = html_report.render(evidence, resolved, summary, reported, {}, None, {}, 200)
    beside_paper = [with_ci(select(summary, ckpt=final, method=label, bench=bench, metric=avg)[0])
                    for label, per_bench in reported.numbers.items() for bench in per_bench if label != "gmts"]
    assert html_module.unescape(page).count(FLOOR_LEGEND) == 1
    assert page.count(FLOOR_MARK) == marked + 1 + sum(FLOOR_MARK in cell for cell in beside_paper)


def calibration_record(benches: dict[str, int], variance: float = 4e-4) -> dict:
    noise = {"variance": variance, "df": 7}
    return {"preset": "tiny", "commit": "0123456789abcdef", "label": "uniform", "seeds": list(range(8)),
            "ckpt": "ckpt-100", "metric": "avg@4", "benches": benches,
            "training_noise": {**{b: noise for b in benches}, "mean": noise}}


def test_a_fitting_calibration_is_pooled_in_and_backs_the_aa_line(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    calibration = tmp_path / "tiny.json"
    calibration.write_text(json.dumps(calibration_record({"arith": 40, "arith_ood": 30})))
    write_leaderboard(resolved, paths, n_resamples=200, calibration_path=calibration)
    rows = [r for r in read_csv(paths.root / "leaderboard.csv") if r["diff"] and r["ckpt"] == "ckpt-100"]
    # the sampled metric pools with the calibration; greedy (not what it measured) with the sweep's labels only
    calibrated = {CALIBRATED, MODERATED[CALIBRATED]}
    assert {r["diff_variance"] for r in rows if r["metric"] == "avg@4"} <= calibrated
    pooled = {POOLED, MODERATED[POOLED]}
    assert {r["diff_variance"] for r in rows if r["metric"] == "greedy"} <= pooled
    assert any(r["diff_variance"] in calibrated for r in rows)
    md = (paths.root / "leaderboard.md").read_text()
    assert "tied (calibrated)" in md and "A/A calibration `tiny.json` (uniform alone, 8 seeds, commit 0123456789)" in md
    assert "With 2 seeds the assumption is untested for any one method" in md
    # the coverage bench's numbers, read from its output at this sweep's training share, with the calibrated cells
    share = mean_training_share(read_sweep(resolved, paths))
    assert coverage_where_assumption_fails(share=share, n_seeds=2, calibrated=True) in md
    # a calibration of other benchmarks is not used, and the report says why
    calibration.write_text(json.dumps(calibration_record({"arith": 200, "arith_ood": 100})))
    write_leaderboard(resolved, paths, n_resamples=200, calibration_path=calibration)
    md = (paths.root / "leaderboard.md").read_text()
    assert "calibrated" not in md and "tiny.json was measured on {'arith': 200, 'arith_ood': 100}" in md
    rows = read_csv(paths.root / "leaderboard.csv")
    assert not calibrated & {r["diff_variance"] for r in rows}
    calibration.write_text(json.dumps({"preset": "tiny"}))
    with pytest.raises(ValueError, match="tiny.json: malformed calibration"):
        write_leaderboard(resolved, paths, n_resamples=200, calibration_path=calibration)


def coverage_record() -> dict:
    """A coverage study's output in its format: two simulated training shares (the example's spread, 0.8), each with
    the cell where the assumption holds and the two that break it, and the calibrated cells."""
    cells = {"aa": (0.64, 0.70, 0.96, 0.95), "noisy pair": (0.75, 0.80, 0.86, 0.85),
             "collapse": (0.69, 0.78, 0.92, 0.88), "share 0.8": (0.78, 0.83, 0.97, 0.95),
             "noisy pair, share 0.8": (0.85, 0.9, 0.84, 0.83), "collapse, share 0.8": (0.81, 0.86, 0.93, 0.91),
             "calibrated": (0.63, 0.7, 0.95, 0.94), "stale calibration": (0.94, 0.95, 0.93, 0.92)}
    coverage = {}
    for cell, (share2, share5, rate2, rate5) in cells.items():
        for n, share, rate in ((2, share2, rate2), (5, share5, rate5)):
            mean = {"coverage": {"moderated": rate, "pooled": 0.5}, "training_share": share}
            if "calibrat" in cell:
                mean["coverage"] |= {"calibrated": rate - 0.01, "calibrated, no guard": rate - 0.1}
                mean["calibration_refused"] = 0.84 if cell.startswith("stale") else 0.15
            coverage[f"{cell}/S={n}"] = {"mean": mean}
    coverage |= {f"collapse to zero/S={n}": {"mean": {"coverage": {"moderated": rate}, "training_share": 0.7}}
                 for n, rate in ((2, 0.91), (5, 0.84))}
    regimes = {"the example's spread": {"holds": "aa", "noisy pair": "noisy pair", "collapse": "collapse",
                                        "collapse to zero": "collapse to zero"},
               "share 0.8": {"holds": "share 0.8", "noisy pair": "noisy pair, share 0.8",
                             "collapse": "collapse, share 0.8"}}
    return {"settings": {"report_rule": "moderated", "calibrated_rule": "calibrated", "seeds": [2, 5],
                         "regimes": regimes, "calibration_cells": {"matches": "calibrated",
                                                                   "stale": "stale calibration"}},
            "coverage": coverage}


def test_the_coverage_sentence_depends_on_the_sweeps_share_and_seeds(tmp_path):
    path = tmp_path / "interval_coverage.json"
    path.write_text(json.dumps(coverage_record()))
    near_example = coverage_where_assumption_fails(path, share=0.6, n_seeds=2)
    assert "at 2 seeds and the training share nearest this sweep's (training noise 0.60" in near_example
    assert "simulated 0.64, the example's spread): 0.96 where every method's training noise is the same" in near_example
    assert ("3x the others' training noise 0.86; a baseline whose runs collapse 1 time in 10 0.92; one whose runs drop "
            "to near-zero accuracy 1 time in 10 0.91") in near_example
    # the worst case over both shares and both seed counts stands beside it
    assert "(the worst of each over the simulated shares 0.64-0.78 and 2-5 seeds: 0.83, 0.88, 0.84)" in near_example
    near_share = coverage_where_assumption_fails(path, share=0.9, n_seeds=2)
    assert "simulated 0.78, share 0.8): 0.97" in near_share and "noise 0.84; " in near_share
    assert "near-zero accuracy 1 time in 10 0." not in near_share  # not simulated at that share: the worst case only
    assert near_share != near_example
    # more seeds: the nearest simulated seed count (4 -> 5), whose shares are the ones compared
    at_five = coverage_where_assumption_fails(path, share=0.72, n_seeds=4)
    assert "at 5 seeds" in at_five and "simulated 0.70, the example's spread): 0.95" in at_five
    # unknown share (e.g. one seed): the worst case alone
    worst = coverage_where_assumption_fails(path, share=None, n_seeds=1)
    assert "worst over 2-5 seeds: a method with 3x the others' training noise 0.83" in worst
    assert "; one whose runs drop to near-zero accuracy 1 time in 10 0.84" in worst
    assert "0.50" not in worst
    # with a calibration: which figures hold with it
    calibrated = coverage_where_assumption_fails(path, share=0.6, n_seeds=2, calibrated=True)
    assert calibrated.startswith(near_example.removesuffix(" (results/bench/interval_coverage.json)."))
    assert ("With an A/A calibration pooled where its guard lets it: 0.94 when it matches the sweep's training noise, "
            "0.92 when the sweep's training sd is 3x the calibration's (refused in 84% of those sweeps; pooled "
            "regardless: 0.83); the figures before are without a calibration") in calibrated
    # without the bench's output: the situations, no numbers
    absent = coverage_where_assumption_fails(tmp_path / "absent.json")
    assert "3x the others' training noise" in absent and not re.search(r"\d\.\d", absent)


def test_the_report_quotes_the_coverage_at_its_own_share(sweep):
    resolved, paths, _ = sweep
    evidence = read_sweep(resolved, paths)
    share = mean_training_share(evidence)
    assert share is not None and 0 <= share <= 1
    note = protocol_note(evidence, resolved, 2000)
    assert coverage_where_assumption_fails(share=share, n_seeds=3) in note
    assert "Outlying runs: a run more than 4 robust scales below" in note and "none at ckpt-100" in note


def test_holm_marks_the_table_and_the_csv_has_the_adjusted_p(sweep):
    _, paths, _ = sweep
    rows = [r for r in read_csv(paths.root / "leaderboard.csv") if r["diff"]]
    for row in rows:
        p, adjusted = float(row["diff_p"]), float(row["diff_p_holm"])
        assert p <= adjusted <= 1
        assert row["verdict"] == ("tied" if adjusted >= 0.05 else "better" if float(row["diff"]) > 0 else "worse")
    assert {r["diff_variance"] for r in rows} <= set(VARIANCE_BASES)


def test_without_an_interval_at_the_floor_there_is_no_mark_and_no_legend(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))  # one seed: no residual part, no floor
    write_leaderboard(resolved, paths, n_resamples=200)
    rows = read_csv(paths.root / "leaderboard.csv")
    assert {r["ci_at_floor"] for r in rows if r["statistic"] == "mean"} == {"False"}
    for name in ("leaderboard.md", "report.html"):
        text = (paths.root / name).read_text()
        assert FLOOR_MARK not in text and "residual floor: the seeds agreed" not in text, name


def test_reported_file_errors_name_the_key(tmp_path):
    assert load_reported(tmp_path / "absent.yaml") is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("numbers: {uniform: {arith: 140}}\n")
    with pytest.raises(ConfigError, match=r"numbers\.uniform\.arith"):
        load_reported(bad)
    bad.write_text("numbrs: {}\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_reported(bad)
    bad.write_text("claims:\n  - {method: ktae, benchmark: mean, metric: avg, difference: 1, kind: improvement, "
                   "where: x}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: key 'claims\[0\].metric'"):
        load_reported(bad)
    good = tmp_path / "good.json"  # JSON is accepted too
    good.write_text(json.dumps({"source": "x", "numbers": {"uniform": {"arith": 12.5}}}))
    assert load_reported(good).get("uniform", "arith") == 12.5


def test_html_is_self_contained_with_highlights_and_provenance(sweep):
    _, paths, _ = sweep
    page = (paths.root / "report.html").read_text()
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page)
    assert page.count("src='data:image/png;base64,") == 6
    assert "class='tok' style='background" in page and "title='entropy" in page
    assert "Q: &lt;b&gt;3-1&lt;/b&gt;" in page  # prompts are escaped
    for text in ("ranking scope is the update batch", "0" * 40, "1.5e+12", "config of uniform/seed0",
                 "seaborn (report)", "abababab"):
        assert text in page


def test_dropped_rollouts_are_greyed_and_zero_weights_uncoloured():
    batch = {"completion_mask": [[1, 1, 0]], "completion_tokens": [["a", "Ċb", "<pad>"]], "entropy": [[1.0, 2.0, 0]],
             "completion_ids": [[5, 6, 0]]}
    kept = html_report.highlight_rollout(batch, 0, "m", {"weights": [[0.0, 2.0, 0.0]], "advantages": [[1, 1, 0]],
                                                         "keep": [1]})
    assert "<span class='tok' title='entropy 1.000 | weight 0 | advantage +1.000'>a</span>" in kept
    assert "background: rgba(230,120,20" in kept and "↵\nb" in kept and "&lt;pad&gt;" not in kept
    dropped = html_report.highlight_rollout(batch, 0, "m", {"weights": [[1.0, 1.0, 0.0]],
                                                            "advantages": [[0, 0, 0]], "keep": [0]})
    assert "tokrow dropped" in dropped and "background" not in dropped and "(dropped)" in dropped


def test_rollouts_for_highlights_are_fixed_and_informative():
    batch = {"rewards": [0, 0, 1, 0, 0, 0, 1, 1, 0], "group_ids": [0, 0, 0, 1, 1, 1, 2, 2, 2]}
    assert html_report.choose_rollouts(batch, 4) == [2, 0, 6, 8]  # best and worst of the mixed groups
    assert html_report.choose_rollouts(batch, 6) == [2, 0, 6, 8, 3]  # then the first of the others


def test_report_is_deterministic(sweep, tmp_path):
    resolved, paths, _ = sweep
    again = summarize(read_sweep(resolved, paths))
    assert again == summarize(read_sweep(resolved, paths))


def test_a_failed_run_is_listed_and_left_out(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))
    (paths.eval_dir("entropy", 0, "ckpt-100", "arith") / "results.json").unlink()
    log = paths.root / "logs" / "eval" / "entropy_seed0_ckpt-100.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Traceback (most recent call last):\n  File x\nMemoryError: out of memory in generate\n")
    write_leaderboard(resolved, paths)
    leaderboard = (paths.root / "leaderboard.md").read_text()
    assert "Failed run, left out:** `entropy` seed 0 (eval ckpt-100): MemoryError: out of memory" in leaderboard
    assert "| entropy |" not in leaderboard


def test_failed_training_points_to_the_train_log(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    (paths.run_dir("uniform-aa", 1) / "run.json").unlink()
    log = paths.root / "logs" / "train" / "uniform-aa_seed1.log"  # the Snakefile's train log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 3\nharness train: error: CUDA out of memory\n")
    failures = find_failures(resolved, paths, ["ckpt-100"], list(BENCHES))
    assert failures == [{"label": "uniform-aa", "seed": 1, "stage": "train",
                         "error": "harness train: error: CUDA out of memory", "log": "logs/train/uniform-aa_seed1.log"}]
    assert read_sweep(resolved, paths).labels == ["uniform", "entropy"]


def test_missing_warmstart_results_name_the_file(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))
    (paths.eval_dir("warmstart", 0, "ckpt-000", "arith") / "results.json").unlink()
    with pytest.raises(FileNotFoundError, match="warmstart/seed0/ckpt-000/arith/results.json"):
        write_leaderboard(resolved, paths)


def test_results_from_different_code_are_marked(tmp_path):
    # harness/config/code_digests.py records each run's and evaluation's code: the report names what differs
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    assert code_warnings(read_sweep(resolved, paths)) == []  # nothing recorded (results older than code digests)

    def record(file, where, code):
        content = json.loads(file.read_text())
        (content.setdefault("provenance", {}) if where == "run" else content)["code"] = code
        file.write_text(json.dumps(content))

    same = {"training_code": "a" * 64, "evaluation_code": "e" * 64, "packages": "p" * 64, "method_source": "m" * 16}
    for label in LABELS:
        for seed in (0, 1):
            record(paths.run_file(label, seed), "run", same)
    assert code_warnings(read_sweep(resolved, paths)) == []
    record(paths.run_file("entropy", 1), "run", {**same, "training_code": "b" * 64, "method_source": "n" * 16})
    lines = code_warnings(read_sweep(resolved, paths))
    assert lines[0].startswith("runs from different shared training code: aaaaaaaaaaaa: ") and lines[0].endswith(
        "bbbbbbbbbbbb: entropy/seed1 (1)")
    assert lines[1] == "seeds of entropy from different entropy's method source: mmmmmmmmmmmm: entropy/seed0 (1); " \
        "nnnnnnnnnnnn: entropy/seed1 (1)"
    record(paths.results_file("uniform", 0, "ckpt-100", "arith"), "eval", {**same, "evaluation_code": "f" * 64})
    lines = code_warnings(read_sweep(resolved, paths))
    assert any(line.startswith("evaluations from different evaluation code: ") and "not recorded" in line
               and "ffffffffffff: uniform/seed0/ckpt-100/arith (1)" in line for line in lines)
    write_leaderboard(resolved, paths)
    assert "- **Different code:** runs from different shared training code" in (paths.root / "leaderboard.md"
                                                                                  ).read_text()


def test_unmatched_budgets_are_flagged(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))
    run_file = paths.run_dir("entropy", 0) / "run.json"
    run = json.loads(run_file.read_text())
    run["budget"]["spent_steps"] = 3
    run_file.write_text(json.dumps(run))
    assert budget_warnings(read_sweep(resolved, paths)) == ["entropy/seed0 spent 3 steps of its 4"]
    run["budget"]["amount"] = 8.0
    run_file.write_text(json.dumps(run))
    assert "different budgets" in budget_warnings(read_sweep(resolved, paths))[0]


def test_one_seed_sweep_says_so(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))
    summary = summarize(read_sweep(resolved, paths), n_resamples=200)
    assert {r["n_seeds"] for r in summary} == {1}
    note = protocol_note(read_sweep(resolved, paths), resolved, 200)
    assert "One seed only" in note


REPORT_DIR = REPO / "harness" / "report"
STATISTICS_MODULES = ["scores", "training_noise", "intervals", "bootstrap", "outliers"]  # numpy/scipy, each other
# Each module of harness/report imports only the ones before it (no cycle); a new module takes its place here.
REPORT_MODULE_ORDER = [*STATISTICS_MODULES, "calibration", "power", "verdicts", "sequential", "evidence", "fidelity",
                       "reported", "plan_power", "summary", "tables", "markdown", "html", "plots", "leaderboard",
                       "stages", "across_sweeps"]


def imported_modules(path: Path) -> set[str]:
    """Dotted names a module imports; ``from a import b`` counts as both ``a`` and ``a.b`` (b may be a module)."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return imported


def test_report_modules_never_import_the_trainer_or_trl():
    modules = sorted(REPORT_DIR.glob("*.py"))
    assert {p.stem for p in modules} == {"__init__", *REPORT_MODULE_ORDER}
    for path in modules:
        imported = imported_modules(path)
        assert not any(m.split(".")[0] in {"trl", "transformers"} or m == "harness.train"
                       or m.startswith("harness.train.") for m in imported), (path.name, imported)
    statistics = tuple(f"harness.report.{name}" for name in STATISTICS_MODULES)
    for name in STATISTICS_MODULES:
        outside = [m for m in imported_modules(REPORT_DIR / f"{name}.py")
                   if m.startswith("harness") and not m.startswith(statistics)]
        assert not outside, (name, outside)


def test_report_modules_import_one_way():
    for index, name in enumerate(REPORT_MODULE_ORDER):
        own = {m.removeprefix("harness.report.").split(".")[0] for m in imported_modules(REPORT_DIR / f"{name}.py")
               if m.startswith("harness.report.")}
        assert own <= set(REPORT_MODULE_ORDER[:index]), (name, sorted(own - set(REPORT_MODULE_ORDER[:index])))


def test_sweep_without_a_uniform_label_says_there_is_no_baseline(tmp_path):
    # e.g. published-checkpoints: released models only; the note must not speak of differences to "None"
    resolved, paths = build_sweep(tmp_path, seeds=(0,), fractions=(1.0,))
    evidence = read_sweep(resolved, paths)
    evidence.labels = [label for label in evidence.labels if evidence.method_name(label) != "uniform"]
    assert evidence.baseline is None
    note = protocol_note(evidence, resolved, 200)
    assert "no baseline" in note and "None" not in note


def test_claims_show_the_training_each_run_reached_beside_the_papers(tmp_path):
    """The claims table sets what the compared runs trained (seed means of their run.json at the full budget)
    beside the paper's training length from the reported file."""
    from harness.report.reported import PaperTraining, Reported
    from harness.report.summary import training_reached

    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    for label in LABELS:  # what a trained run records: its preset and the ledger at each budget checkpoint
        for seed in (0, 1):
            path = paths.run_dir(label, seed) / "run.json"
            run = json.loads(path.read_text())
            run["config"]["preset"] = {"train": {"mini_batches": 2, "ppo_epochs": 1}}
            run["budget"]["checkpoint_spend"] = {"ckpt-100": {
                "budget/steps": 8 + seed, "budget/samples_total": 1000.0 * (seed + 1), "tokens/generated_total": 5e6}}
            path.write_text(json.dumps(run))
    evidence = read_sweep(resolved, paths)
    reached = training_reached(evidence)
    assert reached["entropy"] == {"batches": 4.25, "updates": 8.5, "rollouts": 1500.0, "tokens": 5e6}
    judged = claim_verdicts(evidence, None)
    header, body = claims_table(judged, reached, None)
    row = dict(zip(header, body[0], strict=True))
    claim = judged[0].claim
    assert row["trained here (method; baseline)"] == (
        f"{claim.method}: 4.25 batches (8.5 updates), 1.5k rollouts, 5M tokens; "
        f"{claim.baseline}: 4.25 batches (8.5 updates), 1.5k rollouts, 5M tokens")
    assert row["paper's run"] == "no paper (stand-in claims)"
    paper = Reported(tmp_path / "paper-x.yaml", "", "", "", [], {}, [], PaperTraining(60, 1966080, None, "20 epochs"))
    assert claims_table(judged, reached, paper)[1][0][-1] == "60 batches, 1.97M rollouts, not public tokens (20 epochs)"


def test_figures_one_per_compute_axis_and_no_stale_ones(sweep, tmp_path):
    """The budget's FLOPs and device-seconds get a figure each, the per-phase splits none (they share file names:
    flops/generation and seconds/generation), and a figure an earlier report wrote but this one does not is removed,
    so figures/ never shows a stale picture."""
    from harness.report import plots

    resolved, paths, _ = sweep
    evidence = read_sweep(resolved, paths)
    summary = summarize(evidence, None, 200)
    phase_keys = ("spent/flops/generation", "spent/seconds/generation", "spent/flops/reference")
    for row in summary:
        if row["method"] != "warmstart":
            steps = row["spent/steps"]
            row.update({"spent/budget/flops": 1e10 * steps, "spent/budget/accel_seconds": steps,
                        **{key: 1.0 for key in phase_keys}})
    stale = tmp_path / "accuracy_vs_generation.png"
    stale.write_bytes(b"an earlier report's figure")
    written = plots.write_figures(evidence, summary, tmp_path)
    assert {"accuracy_vs_flops", "accuracy_vs_accel_seconds"} <= set(written)
    assert not any(name.endswith(("generation", "reference", "old_logp", "train")) for name in written
                   if name.startswith("accuracy_vs_") and name != "accuracy_vs_generated")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(p.name for p in written.values())


def test_a_papers_baseline_outside_our_interval_flags_a_protocol_mismatch():
    from harness.report.summary import BaselineLevel
    from harness.report.tables import baseline_cell

    ours = {"estimate": 0.77, "ci_low": 0.75, "ci_high": 0.79, "ci_at_floor": False}
    far = BaselineLevel(48.5, ours)  # paper-d3s's GRPO baseline on MATH against a protocol near 77
    assert far.mismatch and baseline_cell(far) == ("paper: 48.5; ours: 77.0 [75.0, 79.0]: outside our interval, "
                                                   "protocol mismatch?")
    assert not BaselineLevel(76.0, ours).mismatch
    assert baseline_cell(BaselineLevel(None, ours, ("aime24",))) == "paper: none for aime24; ours: 77.0 [75.0, 79.0]"
    assert baseline_cell(BaselineLevel(None, None)) == "paper: no paper; ours: not evaluated"


STAND_INS = """
source: "A paper, Table 2"
metric: avg@16
protocol: "16 samples"
numbers:
  uniform: {arith: 40.5, arith_ood: 50.0}
  entropy: {arith: 70.0, arith_ood: 55.0}
stand_ins:
  arith_ood: "paper: OOD-83, 83 problems; ours: arith_ood, 30 problems"
claims:
  - {method: entropy, benchmark: mean, metric: avg@k, difference: 17.25, kind: improvement, where: "Table 2"}
  - {method: entropy, benchmark: arith, metric: avg@k, difference: 29.5, kind: improvement, where: "Table 3"}
  - {method: gmts, benchmark: mean, metric: avg@k, difference: 1.0, kind: improvement, where: "Table 4"}
"""


def test_a_claims_mean_is_also_shown_without_its_stand_in_benchmarks(tmp_path):
    """#35 item 10: a benchmark declared a stand-in (AMC23 for the paper's 83-problem AMC) is left out of a second
    mean beside the claim's: the paper's from its numbers, ours over the same benchmarks, in every page."""
    from harness.report.summary import without_stand_ins

    resolved, paths = build_sweep(tmp_path)
    reported_file = tmp_path / "reported.yaml"
    reported_file.write_text(STAND_INS)
    write_leaderboard(resolved, paths, reported_file=reported_file, n_resamples=200)
    evidence, reported = read_sweep(resolved, paths), load_reported(reported_file)
    judged = claim_verdicts(evidence, reported)
    means = [without_stand_ins(v, evidence, reported) for v in judged]
    assert means[1] is None  # a claim on one benchmark: no mean to take apart
    mean = means[0]
    assert (mean.dropped, mean.kept) == (("arith_ood",), ("arith",))
    # by hand: with arith_ood (70.0 + 55.0) / 2 = 62.5 vs (40.5 + 50.0) / 2 = 45.25; without it 70.0 vs 40.5
    assert mean.paper_with == pytest.approx((62.5, 45.25)) and mean.paper_without == pytest.approx((70.0, 40.5))
    assert mean.ours_with is judged[0].interval
    final, avg = evidence.final_ckpt, evidence.avg_metric
    differences = (evidence.scores[("entropy", final, "arith", avg)]
                   - evidence.scores[("uniform", final, "arith", avg)])
    assert mean.ours_without.estimate == pytest.approx(differences.mean())  # every problem and seed of arith alike
    # over one benchmark it is the leaderboard's Δ on that benchmark: the same pooled training noise
    [row] = select(summarize(evidence, reported, n_resamples=200), ckpt=final, method="entropy", bench="arith",
                   metric=avg, statistic="mean")
    assert (mean.ours_without.low, mean.ours_without.high) == pytest.approx((row["diff_ci_low"], row["diff_ci_high"]))
    assert means[2].ours_without is None and means[2].missing == ("gmts",)  # not in the sweep, nor in the paper
    md = (paths.root / "leaderboard.md").read_text()
    section = md.split("### The claims' means without stand-in benchmarks")[1].split("\n## ")[0]
    assert "`stand_ins` in `reported.yaml`" in section
    [cells] = [line.strip("| ").split(" | ") for line in section.splitlines() if line.startswith("| entropy beats")]
    ours = f"+{pct(mean.ours_without.estimate)} [{pct(mean.ours_without.low)}, {pct(mean.ours_without.high)}]"
    claimed = judged[0].interval
    assert cells[1:] == ["arith_ood: paper: OOD-83, 83 problems; ours: arith_ood, 30 problems",
                         "entropy 62.50 vs uniform 45.25: Δ +17.25 (2 benchmarks)",
                         "entropy 70.00 vs uniform 40.50: Δ +29.50 (1 benchmark)",
                         f"+{pct(claimed.estimate)} [{pct(claimed.low)}, {pct(claimed.high)}]", ours]
    gmts = [line for line in section.splitlines() if line.startswith("| gmts beats")][0]
    assert "| none for gmts | none for gmts | not evaluated | not evaluated |" in gmts
    bottom = md.split("## Bottom line")[1].split("\n## ")[0]
    assert f"; without arith_ood (stand-in): Δ {ours}, paper +29.50" in bottom
    assert "- arith_ood: paper: OOD-83, 83 problems; ours: arith_ood, 30 problems" in md  # the reported section
    claims = json.loads((paths.root / "leaderboard.json").read_text())["claims"]
    record = claims[0]["without_stand_ins"]
    assert record["paper_without"] == {"method": 70.0, "baseline": 40.5, "diff": 29.5}
    assert record["paper_with"]["diff"] == pytest.approx(17.25) and record["benchmarks_without"] == ["arith"]
    assert record["ours_without"]["diff"] == pytest.approx(mean.ours_without.estimate)
    assert claims[1]["without_stand_ins"] is None
    page = html_module.unescape((paths.root / "report.html").read_text())
    assert "The claims' means without stand-in benchmarks" in page and "entropy 62.50 vs uniform 45.25" in page


@pytest.mark.parametrize(("sweep", "with_amc", "without_amc"), [
    # by hand from the files' numbers (aime24, amc23, math500, minerva_math, olympiadbench):
    # ktae (20.0 + 50.6 + 77.6 + 29.0 + 40.0) / 5 = 43.44, uniform (16.7 + 47.0 + 77.6 + 25.7 + 39.0) / 5 = 41.20;
    # without amc23: 166.6 / 4 = 41.65 and 159.0 / 4 = 39.75
    ("paper-ktae", (43.44, 41.20), (41.65, 39.75)),
    # GRPO: 208.5 / 5 = 41.70 vs 202.9 / 5 = 40.58; without amc23 (KTAE 41.0 against 51.8): 167.5 / 4 vs 151.1 / 4
    ("paper-ktae-grpo", (41.70, 40.58), (41.875, 37.775)),
])
def test_the_ktae_claims_mean_without_amc23(sweep, with_amc, without_amc):
    """The shipped KTAE files declare AMC23 a stand-in for the 83-problem AMC; their claims' means without it."""
    from types import SimpleNamespace

    from harness.report.summary import without_stand_ins
    from harness.report.tables import stand_in_table
    from harness.report.verdicts import Verdict

    reported = load_reported(REPO / "configs" / "reported" / f"{sweep}.yaml")
    assert "83 problems" in reported.stand_ins["amc23"] and "40 problems" in reported.stand_ins["amc23"]
    benches = ["aime24", "amc23", "math500", "minerva_math", "olympiadbench"]
    evidence = SimpleNamespace(benches=benches, scores={}, final_ckpt="ckpt-100", avg_metric="avg@16",
                               calibration=None, labels=[])  # no sweep run yet: the paper's side only
    verdict = Verdict(reported.claims[0], "not evaluated", "")
    mean = without_stand_ins(verdict, evidence, reported)
    assert mean.paper_with == pytest.approx(with_amc) and mean.paper_without == pytest.approx(without_amc)
    _, [row] = stand_in_table([verdict], [mean])
    assert row[2] == f"ktae {with_amc[0]:.2f} vs uniform {with_amc[1]:.2f}: Δ {with_amc[0] - with_amc[1]:+.2f} " \
                     "(5 benchmarks)"
    assert row[3].endswith(f"Δ {without_amc[0] - without_amc[1]:+.2f} (4 benchmarks)")
    assert row[4:] == ["not evaluated", "not evaluated"]


def test_gmts_declares_the_stand_in_without_paper_numbers():
    from types import SimpleNamespace

    from harness.report.summary import without_stand_ins
    from harness.report.verdicts import Verdict

    reported = load_reported(REPO / "configs" / "reported" / "paper-gmts.yaml")
    evidence = SimpleNamespace(benches=["aime24", "amc23", "math500"], scores={}, final_ckpt="ckpt-100",
                               avg_metric="avg@16", calibration=None, labels=[])
    mean = without_stand_ins(Verdict(reported.claims[0], "not evaluated", ""), evidence, reported)
    assert mean.paper_with is None and mean.paper_without is None and mean.missing == ("gmts", "ets")


def test_stand_ins_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stand_ins: [amc23]\n")
    with pytest.raises(ConfigError, match="key 'stand_ins' must map a benchmark"):
        load_reported(bad)
    bad.write_text("stand_ins: {amc23: ''}\n")
    with pytest.raises(ConfigError, match="key 'stand_ins.amc23'"):
        load_reported(bad)
