"""Two training processes (DDP over gloo on CPU, launched by torchrun as accelerate launch would on GPUs): the
budget is counted over both, both stop at the same step, and each file is written once."""

import json
import socket
import subprocess
import sys

import pytest
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_run(tiny_sweep, tmp_path_factory):
    overrides, paths = tiny_sweep
    # 2 prompts x 4 rollouts per step over 2 processes: 4 rollouts each. A samples budget of 3 global steps; a
    # process that counted only its own rollouts would run 6 steps
    settings = [*overrides, "train.budget.kind=samples", "train.budget.amount=24",
                "train.budget.checkpoint_fractions=[0.5,1.0]", "train.save_every_steps=1"]
    sweep = tmp_path_factory.mktemp("ddp") / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "preset": "tiny"}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "harness.cli", "train",
               "--sweep", str(sweep), "--method", "entropy", "--seed", "0", *[f"--set={o}" for o in settings]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return paths.run_dir("entropy", 0), done, paths


def test_budget_counts_every_process_and_both_stop_together(two_process_run):
    run_dir, _, _ = two_process_run
    record = json.loads((run_dir / "run.json").read_text())
    assert record["budget"]["processes"] == 2
    assert record["budget"]["spent_steps"] == 3 and record["budget"]["spent"] == 24
    assert record["counters"]["rollouts_generated"] == 24
    assert record["budget"]["checkpoints"] == {"ckpt-050": 2, "ckpt-100": 3}


def test_each_file_is_written_once(two_process_run):
    run_dir, done, _ = two_process_run
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert done.stdout.count("trained entropy seed 0") == 1
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("ckpt")) == ["ckpt-050", "ckpt-100"]
    assert json.loads((run_dir / "sample_batch.json").read_text())["completion_ids"]


def test_budget_checkpoint_holds_the_trained_weights(two_process_run):
    import torch
    from transformers import AutoModelForCausalLM

    run_dir, _, paths = two_process_run
    saved = AutoModelForCausalLM.from_pretrained(run_dir / "ckpt-100").state_dict()
    trainer_checkpoint = AutoModelForCausalLM.from_pretrained(run_dir / "trl" / "checkpoint-3").state_dict()
    warm_start = AutoModelForCausalLM.from_pretrained(paths.warmstart_dir).state_dict()
    assert saved.keys() == trainer_checkpoint.keys()
    assert all(torch.equal(saved[k], trainer_checkpoint[k]) for k in saved)
    assert not all(torch.equal(saved[k], warm_start[k]) for k in saved)
    ledger = json.loads((run_dir / "trl" / "checkpoint-3" / "harness_budget.json").read_text())["ledger"]
    assert ledger["samples"] == 24 and ledger["steps"] == 3
