"""Outlying runs (issue #37 item 3): the robust rule of harness.report.outliers, and a sweep with one collapsed seed
flagged in leaderboard.md, report.html and `harness power`, with each Δ with and without it."""

import json

import numpy as np
import pytest
from report_fixture import _results, build_sweep

from harness.report import power
from harness.report.evidence import read_sweep
from harness.report.leaderboard import write_leaderboard
from harness.report.outliers import (
    ABSOLUTE_FLOOR,
    COLLAPSE_ADVICE,
    MAD_SCALE,
    OUTLIER_K,
    outlying_runs,
    scores_table,
    seed_gaps,
)
from harness.report.summary import outlying, without_outlying


def test_gaps_are_to_the_median_of_the_labels_other_seeds():
    table = np.array([[0.10, 0.20, 0.40], [0.30, 0.30, 0.00]])
    gaps = seed_gaps(table)
    assert gaps == pytest.approx(np.array([[0.10 - 0.30, 0.20 - 0.25, 0.40 - 0.15], [0.15, 0.15, -0.30]]))


def test_one_collapsed_seed_is_flagged_and_nothing_else():
    rng = np.random.default_rng(3)
    table = 0.30 + rng.normal(0, 0.01, (8, 3))
    labels, seeds = [f"l{i}" for i in range(8)], [0, 1, 2]
    assert outlying_runs(table, labels, seeds) == []
    table[5, 2] = 0.02  # a run that collapsed to near-zero accuracy
    [run] = outlying_runs(table, labels, seeds)
    assert (run.label, run.seed) == ("l5", 2) and run.score == pytest.approx(0.02)
    assert run.others == pytest.approx(np.median(table[5, :2]))
    assert run.threshold == pytest.approx(OUTLIER_K * run.scale) and -run.gap > run.threshold
    gaps = seed_gaps(table)
    assert run.scale == pytest.approx(max(MAD_SCALE * np.median(np.abs(gaps)), ABSOLUTE_FLOOR))
    assert "`l5` seed 2: 2.0 on the mean over benchmarks" in run.describe()


def test_with_two_seeds_the_lower_one_is_flagged_and_one_seed_never():
    table = np.array([[0.30, 0.31], [0.29, 0.30], [0.33, 0.32], [0.31, 0.05], [0.30, 0.30]])
    [run] = outlying_runs(table, list("abcde"), [0, 1])
    assert (run.label, run.seed) == ("d", 1)
    assert outlying_runs(table[:, :1], list("abcde"), [0]) == []


def test_the_floor_keeps_agreeing_seeds_from_flagging_small_gaps():
    table = np.array([[0.300, 0.300], [0.300, 0.300], [0.300, 0.300], [0.300, 0.285]])  # MAD 0: only the floor
    assert outlying_runs(table, list("abcd"), [0, 1]) == []  # 1.5 pts < 4 x the absolute floor (0.5 pts)
    assert [r.seed for r in outlying_runs(table, list("abcd"), [0, 1], floor=0.0, k=2.0)] == [1]
    assert outlying_runs(table, list("abcd"), [0, 1], floor=0.01, k=2.0) == []  # 2 x 1 pt > 1.5 pts


def collapse(paths, label: str, seed: int, ckpt: str, k: int = 4) -> None:
    """Rewrite one run's evaluation at ``ckpt`` as a collapse: every sampled completion wrong."""
    for bench_dir in paths.eval_dir(label, seed, ckpt, "arith").parent.iterdir():
        samples = bench_dir / "samples.jsonl"
        rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
        for row in rows:
            if row["mode"] == "sampled":
                row.update(correct=False, extracted="2")
        samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (bench_dir / "results.json").write_text(json.dumps(_results(bench_dir.name, rows, k), indent=1))


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory):
    resolved, paths = build_sweep(tmp_path_factory.mktemp("collapse"), seeds=(0, 1, 2), fractions=(1.0,))
    collapse(paths, "uniform", 1, "ckpt-100")
    write_leaderboard(resolved, paths, n_resamples=200)
    return resolved, paths


def test_a_collapsed_seed_is_flagged_in_the_report_with_the_difference_without_it(collapsed):
    resolved, paths = collapsed
    evidence = read_sweep(resolved, paths)
    [run] = outlying(evidence, "ckpt-100")
    assert (run.label, run.seed, run.score) == ("uniform", 1, 0.0)
    # the baseline's run: every label's Δ with and without seed 1 (dropped from every label)
    compared = without_outlying(evidence, "ckpt-100", [run])
    assert [label for label, _, _ in compared] == ["uniform-aa", "entropy"]
    for _, with_, without in compared:
        assert with_.estimate > without.estimate  # the collapsed baseline inflated every Δ
    md = (paths.root / "leaderboard.md").read_text()
    assert "- **Outlying run** at ckpt-100: `uniform` seed 1: 0.0 on the mean over benchmarks" in md
    assert "**Δ vs `uniform` on the mean over benchmarks, with / without seed 1** (dropped from every label" in md
    assert "2 seed(s) left" in md and COLLAPSE_ADVICE[1:] in md
    assert f"1 at ckpt-100, listed under its table with each Δ with and without it: {COLLAPSE_ADVICE}" in md
    overview = md.split("## Full budget (ckpt-100)")[1].split("## Claims")[0]
    assert "**Outlying run**" in overview  # under the full budget's table
    page = (paths.root / "report.html").read_text()
    assert "<p class='warn'>Outlying run at ckpt-100: `uniform` seed 1" in page


def test_a_sweep_without_a_collapse_flags_nothing(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1, 2), fractions=(1.0,))
    evidence = read_sweep(resolved, paths)
    assert outlying(evidence, "ckpt-100") == []
    labels, table, floor = scores_table({lab: {b: evidence.scores[(lab, "ckpt-100", b, "avg@4")]
                                              for b in evidence.benches} for lab in evidence.labels})
    assert floor > ABSOLUTE_FLOOR and table.shape == (3, 3)


def test_harness_power_names_the_collapsed_run_and_asks_for_seeds(collapsed):
    resolved, paths = collapsed
    (paths.root / "sweep.yaml").write_text(json.dumps({"methods": resolved.sweep.methods,
                                                       "seeds": resolved.sweep.seeds}))
    pilot = power.read_pilot(paths.root)
    text = power.power_report(pilot, [None], [2.0])
    line = next(line for line in text.splitlines() if line.startswith("outlying runs"))
    assert "uniform seed 1: 0.0 on the mean over benchmarks" in line
    assert "collapse-prone training needs more seeds" in text and "not a narrower interval" in text
