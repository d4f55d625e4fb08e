"""Digests of a run and `harness verify` (harness/ops/verify.py): a replay of an unchanged run is bit-identical,
a perturbed one diverges at the step the perturbation first acts on; pinned CPU kernels are in effect."""

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.loading import load_method, resolve
from harness.ops.verify import read_run, verify_run
from harness.train.run import run_training

SEED = 7  # a seed no other test of the session's tiny sweep trains
STEPS = 4


@pytest.fixture(scope="module")
def recorded(tiny_sweep, tmp_path_factory) -> tuple[Path, Path]:
    """A 4-step uniform run of the tiny sweep (checkpoints at 2 and 4 steps), and a replay folder verify reuses."""
    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"},
                       [*overrides, f"train.budget.amount={STEPS}", "train.budget.checkpoint_fractions=[0.5, 1.0]"])
    run_training(resolved, load_method("uniform"), SEED, paths)
    return paths.run_dir("uniform", SEED), tmp_path_factory.mktemp("verify")


def test_run_records_digests_and_its_kernels(recorded):
    record = json.loads((recorded[0] / "run.json").read_text())
    steps = record["digests"]["first_steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert len({s["rollouts_sha256"] for s in steps}) == 4  # one generation batch per step here
    assert steps[-1]["rollouts_sha256"] == record["digests"]["rollouts"]
    checkpoints = record["digests"]["checkpoints"]
    assert sorted(checkpoints) == ["ckpt-050", "ckpt-100"] and checkpoints["ckpt-050"]["step"] == 2
    assert checkpoints["ckpt-050"]["rollouts_sha256"] == steps[1]["rollouts_sha256"]
    assert len(record["warmstart_sha256"]) == 64
    kernels = record["provenance"]["kernels"]
    assert kernels["cpu_kernels"] == "pinned" and kernels["deterministic_algorithms"] is True
    assert kernels["torch_cpu_capability"] == "AVX2" and kernels["env"]["MKL_CBWR"] == "AVX2,STRICT"
    assert record["provenance"]["hardware"]["cpu_model"]


def test_unchanged_replay_is_bit_identical(recorded):
    run_dir, out = recorded
    verdict = verify_run(run_dir, out, STEPS)
    assert verdict.identical, verdict.describe()
    assert "bit-identical" in verdict.describe()
    assert verdict.describe().count(", packages of ") == 2  # both machines' package lock (or none)


def test_perturbed_weight_decay_diverges_at_the_first_update(recorded, tmp_path):
    run_dir, out = recorded
    perturbed = tmp_path / "run"
    shutil.copytree(run_dir, perturbed, ignore=shutil.ignore_patterns("ckpt-*", "trl", "tensorboard"))
    record = json.loads((perturbed / "run.json").read_text())
    # the 10-step warm start earns no reward, so every advantage is 0 and only AdamW's decoupled weight decay moves
    # the weights: the record holds weight_decay 0.1 where the run had 0
    record["config"]["preset"]["train"]["weight_decay"] = 0.1
    (perturbed / "run.json").write_text(json.dumps(record))
    verdict = verify_run(perturbed, out, 2)
    assert not verdict.identical and verdict.first_step == 1
    # step 1's rollouts come before any update, and its logged numbers (loss, gradient norm) too
    assert verdict.differs == ["weights"] and verdict.metric_differences == {}
    assert "first divergence at step 1: weights differ" in verdict.describe()


def test_verify_cli_exit_status_and_a_run_without_digests(recorded, capsys):
    run_dir, out = recorded
    assert main(["verify", str(run_dir), "--out", str(out), "--steps", "1"]) == 0
    assert "bit-identical" in capsys.readouterr().out
    undigested = out.parent / "undigested"
    shutil.copytree(run_dir, undigested)
    record = json.loads((undigested / "run.json").read_text())
    del record["digests"]  # as recorded before runs carried digests
    (undigested / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="digests.first_steps"):
        read_run(undigested)
    with pytest.raises(ValueError, match="records digests of its first 4 steps"):
        verify_run(run_dir, out, 9)


def test_pinned_kernels_are_refused_in_process_without_their_environment(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("MKL_CBWR")
    assert main(["warmstart", "--set", f"results_dir={tmp_path}"]) == 2
    assert "MKL_CBWR" in capsys.readouterr().err
