"""``harness calibrate`` and ``harness extend-seeds`` on a synthetic sweep on disk (tests/report_fixture.py): no
training, only the commands' reading of the runs and the files they write."""

import json
from pathlib import Path

import pytest
import yaml
from report_fixture import BENCHES, LABELS, build_sweep

from harness.cli import main
from harness.data.files import read_jsonl
from harness.report.calibration import load_calibration
from harness.report.scores import per_problem_scores, score_matrix
from harness.report.training_noise import pooled_training_noise


def sweep_file(tmp_path: Path, seeds=(0, 1, 2)) -> tuple[Path, Path]:
    """The fixture's runs and a sweep YAML of the tiny preset naming them (same labels, benchmarks and k)."""
    _, paths = build_sweep(tmp_path, seeds=seeds)
    path = tmp_path / "fixture.yaml"
    path.write_text(yaml.safe_dump({"name": "fixture", "preset": "tiny", "methods": list(LABELS),
                                    "seeds": list(seeds), "results_dir": str(tmp_path / "results")}))
    return path, paths.root


def test_harness_calibrate_writes_the_baselines_training_noise(tmp_path, capsys):
    sweep, root = sweep_file(tmp_path)
    out = tmp_path / "tiny.json"
    assert main(["calibrate", "--sweep", str(sweep), "--seeds", "3", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (record["preset"], record["label"], record["seeds"], record["ckpt"], record["metric"]) == (
        "tiny", "uniform", [0, 1, 2], "ckpt-100", "avg@4")
    assert record["benches"] == BENCHES
    # the mean's noise is the one-label pooled training noise of uniform's three seeds, read here independently
    scores = {}
    for bench in BENCHES:
        per_seed = [per_problem_scores(read_jsonl(root / "eval" / "uniform" / f"seed{s}" / "ckpt-100" / bench
                                                  / "samples.jsonl", required=())) for s in range(3)]
        scores[bench] = score_matrix(per_seed, sorted(per_seed[0]))
    noise = pooled_training_noise({"uniform": scores})
    assert record["training_noise"]["mean"]["variance"] == pytest.approx(noise.variance)
    assert record["training_noise"]["mean"]["df"] == 2
    assert load_calibration(out).noise_for(sorted(BENCHES)).df == 2  # the report reads it back
    # a seed the sweep has not run: a clear error, no file
    assert main(["calibrate", "--sweep", str(sweep), "--seeds", "4", "--out", str(tmp_path / "four.json")]) == 2
    assert "seed3" in capsys.readouterr().err and not (tmp_path / "four.json").exists()


def test_harness_extend_seeds_writes_the_next_stage_for_the_open_labels(tmp_path, capsys):
    sweep, root = sweep_file(tmp_path)
    assert main(["extend-seeds", "--sweep", str(sweep), "--first", "3", "--add", "2", "--max-seeds", "7"]) == 0
    out = capsys.readouterr().out
    assert "look at 3 seeds of the schedule [3, 5, 7]" in out
    stage = yaml.safe_load((root / "stage-5-seeds.yaml").read_text())
    # the sweep file as written, with the open claims' labels (their baseline included) and seeds 0..4
    assert (stage["name"], stage["preset"], stage["seeds"]) == ("fixture", "tiny", [0, 1, 2, 3, 4])
    assert "uniform" in stage["methods"] and set(stage["methods"]) < set(LABELS)
    assert stage["methods"] == [label for label in LABELS if label in stage["methods"]]  # the sweep's order
    assert stage["methods"] == ["uniform", "uniform-aa"] and "decided: entropy" in out  # 2.5 logits better: decided
    # the last look adds nothing
    assert main(["extend-seeds", "--sweep", str(sweep), "--first", "3", "--add", "2", "--max-seeds", "3"]) == 0
    assert "no stage to add: the last look" in capsys.readouterr().out
    assert not (root / "stage-3-seeds.yaml").exists()


def test_harness_extend_seeds_refuses_a_snapshot_or_overrides_it_could_not_carry(tmp_path, capsys):
    """The next stage's file is the sweep YAML with other labels and seeds: a resolved snapshot (JSON) or --set
    overrides would not carry into it, so both are refused before anything is written."""
    sweep, root = sweep_file(tmp_path)
    snapshot = tmp_path / "0123456789abcdef.json"
    snapshot.write_text("{}")
    schedule = ["--first", "3", "--add", "2", "--max-seeds", "7"]
    for extra in (["--sweep", str(snapshot)], ["--sweep", str(sweep), "--set", "eval.k=2"]):
        assert main(["extend-seeds", *extra, *schedule]) == 2
        assert "pass that file" in capsys.readouterr().err
    assert not list(root.glob("stage-*"))
