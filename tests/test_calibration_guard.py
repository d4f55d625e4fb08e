"""The A/A calibration's guard (issue #37 item 1): a calibration is pooled into a scope only where the sweep's own
pooled training noise is not significantly larger (one-sided F test at 5%), the report says where it refused it and
why, and a calibration whose mean scope is far below its benchmarks' is flagged. On the committed example the guard
refuses configs/calibration/tiny.json on the mean over benchmarks (F ~ 43 on (7, 7) df, p ~ 3e-5)."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from report_fixture import build_sweep
from scipy import stats

from harness.config.loading import resolve
from harness.config.paths import SweepPaths
from harness.report.calibration import (
    GUARD_LEVEL,
    MEAN_WARNING_RATIO,
    check_calibration,
    load_calibration,
    sweep_noise,
    sweep_noise_checked,
)
from harness.report.evidence import read_sweep
from harness.report.leaderboard import write_leaderboard
from harness.report.summary import _label_mats, calibration_checks
from harness.report.training_noise import CALIBRATED, MODERATED, POOLED, TrainingNoise

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "results" / "example"
TINY = REPO / "configs" / "calibration" / "tiny.json"
MEAN = ("arith", "arith_ood")


def test_the_guard_is_a_one_sided_f_test_on_both_degrees_of_freedom():
    sweep, calibration = TrainingNoise(4e-4, 7), TrainingNoise(1e-4, 7, CALIBRATED)
    check = check_calibration(MEAN, sweep, calibration)
    assert check.f == pytest.approx(4.0) and check.p == pytest.approx(stats.f.sf(4.0, 7, 7))
    assert check.pooled == (check.p >= GUARD_LEVEL)
    assert not check_calibration(MEAN, TrainingNoise(8e-4, 7), calibration).pooled  # F 8: p 0.007
    # a sweep quieter than its calibration never refuses it (one-sided)
    assert check_calibration(MEAN, TrainingNoise(1e-6, 7), calibration).pooled
    # a calibration variance of zero counts as smaller: refused against any sweep variance, kept against none
    zero = TrainingNoise(0.0, 7, CALIBRATED)
    refused = check_calibration(MEAN, TrainingNoise(1e-9, 7), zero)
    assert (refused.pooled, refused.p) == (False, 0.0) and "F = inf" in refused.describe()
    assert check_calibration(MEAN, TrainingNoise(0.0, 7), zero).pooled


def test_sweep_noise_leaves_a_refused_calibration_out(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    evidence = read_sweep(resolved, paths)
    mats = _label_mats(evidence, "ckpt-100", "avg@4")
    record = {"preset": "tiny", "commit": "0" * 40, "label": "uniform", "seeds": list(range(8)), "ckpt": "ckpt-100",
              "metric": "avg@4", "benches": {"arith": 40, "arith_ood": 30},
              "training_noise": {"arith": {"variance": 1.0, "df": 7}, "arith_ood": {"variance": 1.0, "df": 7},
                                 "mean": {"variance": 0.0, "df": 7}}}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(record))
    noise, checks = sweep_noise_checked(mats, load_calibration(path))
    assert checks[("arith",)].pooled and checks[("arith_ood",)].pooled and not checks[MEAN].pooled
    assert noise[("arith",)].basis == CALIBRATED and noise[MEAN].basis == POOLED and noise[MEAN].df == 2
    assert noise == sweep_noise(mats, load_calibration(path))


def test_the_report_names_the_refused_scope_with_its_test(tmp_path):
    resolved, paths = build_sweep(tmp_path, seeds=(0, 1), fractions=(1.0,))
    calibration = tmp_path / "tiny.json"
    noise = {"variance": 4e-4, "df": 7}
    calibration.write_text(json.dumps({
        "preset": "tiny", "commit": "0123456789abcdef", "label": "uniform", "seeds": list(range(8)),
        "ckpt": "ckpt-100", "metric": "avg@4", "benches": {"arith": 40, "arith_ood": 30},
        "training_noise": {"arith": noise, "arith_ood": noise, "mean": {"variance": 0.0, "df": 7}}}))
    write_leaderboard(resolved, paths, n_resamples=200, calibration_path=calibration)
    md = (paths.root / "leaderboard.md").read_text()
    evidence = read_sweep(resolved, paths)
    evidence.calibration = load_calibration(calibration)
    check = calibration_checks(evidence, "ckpt-100")[MEAN]
    assert not check.pooled
    assert (f"- **A/A calibration not pooled** at ckpt-100 on the mean over benchmarks: {check.describe()}; those Δ "
            f"intervals and detectable effects use the sweep's own pooled noise") in md
    assert "F = inf on (2, 7) df, one-sided p = 0 < 0.05: refused" in md
    assert "A/A `uniform-aa` vs `uniform` at ckpt-100: tied (calibrated on arith, arith_ood; the calibration refused " \
           "on the mean over benchmarks)" in md
    assert "refused on the mean over benchmarks at ckpt-100 (F = inf on (2, 7) df, p = 0)" in md  # protocol note
    # its mean over benchmarks is far below its benchmarks': flagged
    assert "**A/A calibration suspect:** `tiny.json`'s training noise on the mean over benchmarks" in md
    rows = [r for r in _csv(paths.root / "leaderboard.csv") if r["diff"] and r["metric"] == "avg@4"]
    assert {r["diff_variance"] for r in rows if r["bench"] == "all"} <= {POOLED, MODERATED[POOLED]}
    assert {r["diff_variance"] for r in rows if r["bench"] != "all"} <= {CALIBRATED, MODERATED[CALIBRATED]}


def _csv(path: Path) -> list[dict]:
    import csv

    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_tiny_calibrations_mean_scope_is_flagged():
    calibration = load_calibration(TINY)
    warning = calibration.mean_warning()
    per_bench = (calibration.noise["arith"].variance + calibration.noise["arith_ood"].variance) / 2
    ratio = calibration.noise["mean"].variance / (per_bench / 2)
    assert ratio < MEAN_WARNING_RATIO and f"is {ratio:.2f} of what independent benchmarks give" in warning
    assert "(sd 0.23 pts)" in warning and "correlation -0.96" in warning and "over 8 seeds" in warning


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The committed example with its samples.jsonl.gz gunzipped, as `harness report` reads a sweep."""
    root = tmp_path_factory.mktemp("example") / "results" / "default"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("figures", "report.html"))
    for packed in root.rglob("samples.jsonl.gz"):
        with gzip.open(packed, "rb") as source:
            packed.with_suffix("").write_bytes(source.read())
    resolved = resolve(REPO / "configs" / "sweeps" / "default.yaml", [f"results_dir={root.parent}"])
    evidence = read_sweep(resolved, SweepPaths(root))
    evidence.calibration = load_calibration(TINY)
    return evidence


def test_the_guard_refuses_tiny_json_on_the_examples_mean_and_keeps_it_per_benchmark(example):
    checks = calibration_checks(example, "ckpt-100")
    mean = checks[MEAN]
    assert mean.f == pytest.approx(43.3, abs=0.05) and mean.p == pytest.approx(3.1e-5, rel=0.05)
    assert (mean.sweep.df, mean.calibration.df) == (7, 7) and not mean.pooled
    assert "F = 43.3 on (7, 7) df, one-sided p = 3.1e-05 < 0.05: refused" in mean.describe()
    assert checks[("arith",)].pooled and checks[("arith_ood",)].pooled  # per benchmark the two agree
    assert all(check.pooled for check in calibration_checks(example, "ckpt-050").values())
    noise = sweep_noise(_label_mats(example, "ckpt-100", "avg@4"), example.calibration)
    assert noise[MEAN].basis == POOLED and noise[("arith",)].basis == CALIBRATED


def test_the_committed_example_shows_the_refusal():
    md = (EXAMPLE / "leaderboard.md").read_text()
    assert ("**A/A calibration not pooled** at ckpt-100 on the mean over benchmarks: the sweep's own pooled training "
            "noise (sd 1.49 pts against 0.23) gives F = 43.3 on (7, 7) df, one-sided p = 3.1e-05 < 0.05: refused") in md
    assert "**A/A calibration suspect:**" in md
    summary = json.loads((EXAMPLE / "leaderboard.json").read_text())["summary"]
    final_mean = [r for r in summary if (r["ckpt"], r["bench"], r["metric"]) == ("ckpt-100", "all", "avg@4")
                  and r.get("diff_variance")]
    assert final_mean and {r["diff_variance"] for r in final_mean} <= {POOLED, MODERATED[POOLED]}
