"""Fault handling: a NaN loss skips the step (no weight moves) and stops the run past the configured limit."""

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from harness.config.loading import resolve
from harness.config.schema import MethodSpec
from harness.train.run import run_training
from methods.base import Method, TokenWeights, aggregation_weights
from methods.registry import register_method


@register_method("test_nan_weights")
class NanWeights(Method):
    """Test-only: NaN weights on every step (a method whose arithmetic broke)."""

    @dataclasses.dataclass
    class Config:
        pass

    def token_weights(self, stats, batch, ctx):
        weights, denominator = aggregation_weights(batch.completion_mask, ctx.aggregation, ctx.max_completion_length)
        return TokenWeights(weights * float("nan"), denominator)


def run(tiny_sweep, *extra):
    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, *extra])
    spec = MethodSpec("nan-label", "test_nan_weights", NanWeights.Config())
    return run_training(resolved, spec, 0, paths), paths


def test_nonfinite_steps_are_skipped_and_counted(tiny_sweep):
    record, paths = run(tiny_sweep, "train.budget.amount=2", "train.budget.checkpoint_fractions=[1.0]",
                        "train.max_nonfinite_steps=2")
    assert record["budget"]["spent_steps"] == 2
    start = load_file(paths.warmstart_dir / "model.safetensors")
    end = load_file(paths.run_dir("nan-label", 0) / "ckpt-100" / "model.safetensors")
    for name, tensor in start.items():  # skipped steps must not move a single weight (not even Adam's momentum)
        torch.testing.assert_close(end[name], tensor, rtol=0, atol=0)


def test_too_many_nonfinite_steps_stop_with_a_clear_message(tiny_sweep):
    from harness.train.actor import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match=r"test_nan_weights.*nan in 2 steps.*max_nonfinite_steps=1"):
        run(tiny_sweep, "train.budget.amount=4", "train.budget.checkpoint_fractions=[1.0]",
            "train.max_nonfinite_steps=1")


TIMING_KEYS = ("seconds/", "budget/accel_seconds", "step_time", "time/", "train_runtime", "_per_second")


def test_same_seed_gives_identical_metrics_on_cpu(tiny_sweep):
    import json

    overrides, paths = tiny_sweep
    runs = []
    for _ in range(2):
        resolved = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.budget.amount=2",
                                                                 "train.budget.checkpoint_fractions=[1.0]"])
        from harness.config.loading import load_method

        run_training(resolved, load_method("entropy"), 0, paths)
        lines = (paths.run_dir("entropy", 0) / "metrics.jsonl").read_text().splitlines()
        runs.append([{k: v for k, v in json.loads(x).items() if not any(t in k for t in TIMING_KEYS)} for x in lines])
    assert runs[0] == runs[1]
    assert len(runs[0]) == 2 and "reward" in runs[0][0]


def test_sigkill_then_rerun_resumes_and_matches_an_uninterrupted_run(tiny_sweep, tmp_path):
    """The real thing: `harness train` killed with SIGKILL after its second checkpoint, then rerun."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    overrides, paths = tiny_sweep
    settings = [*overrides, "train.budget.amount=6", "train.budget.checkpoint_fractions=[0.5,1.0]",
                "train.save_every_steps=1"]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "preset": "tiny", "methods": ["uniform"], "seeds": [0]}))
    command = [sys.executable, "-m", "harness.cli", "train", "--sweep", str(sweep), "--method", "uniform",
               "--seed", "0", *[f"--set={o}" for o in settings]]
    run_dir = paths.run_dir("uniform", 0)

    def metrics():
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [{k: json.loads(x)[k] for k in ("step", "reward", "loss", "budget/flops_total")} for x in lines]

    subprocess.run(command, check=True, capture_output=True, timeout=600)
    uninterrupted = metrics()
    import shutil

    shutil.rmtree(run_dir)
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = run_dir / "trl" / "checkpoint-2" / "harness_budget.json"
    deadline = time.time() + 300
    while not marker.exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    assert job.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    assert not (run_dir / "run.json").exists() and not (run_dir / "metrics.jsonl").exists()

    subprocess.run(command, check=True, capture_output=True, timeout=600)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["resumed_from"] is not None and record["budget"]["spent_steps"] == 6
    assert metrics() == uninterrupted


RESUME_KEYS = ("step", "reward", "loss", "budget/flops_total")


def resumable_sweep(tiny_sweep, fractions: str, seed: int, *extra: str):
    """4 steps with trainer checkpoints at steps 2 and 4 and budget checkpoints at ``fractions``."""
    overrides, _ = tiny_sweep
    return resolve({"name": "tiny", "preset": "tiny", "methods": ["uniform"], "seeds": [seed]},
                   [*overrides, "train.budget.amount=4", f"train.budget.checkpoint_fractions={fractions}",
                    "train.save_every_steps=2", *extra])


def train_then_cut(tiny_sweep, fractions: str, seed: int):
    """A ``resumable_sweep`` run whole; then cut back to the state a kill during step 4 leaves (trainer checkpoint
    2, the budget checkpoints and metrics written up to step 3, no run.json)."""
    import json
    import shutil

    from harness.config.loading import load_method

    _, paths = tiny_sweep
    resolved = resumable_sweep(tiny_sweep, fractions, seed)
    spec = load_method("uniform")
    run_training(resolved, spec, seed, paths)
    run_dir = paths.run_dir("uniform", seed)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    whole = [{k: json.loads(line)[k] for k in RESUME_KEYS} for line in lines]
    (run_dir / "run.json").unlink()
    shutil.rmtree(run_dir / "ckpt-100")
    shutil.rmtree(run_dir / "trl" / "checkpoint-4")
    (run_dir / "metrics.jsonl").rename(run_dir / "metrics.jsonl.partial")
    (run_dir / "metrics.jsonl.partial").write_text("".join(line + "\n" for line in lines[:3]))
    return resolved, spec, run_dir, whole


def resumed_metrics(resolved, spec, seed, paths, run_dir):
    import json

    record = run_training(resolved, spec, seed, paths)
    assert record["resumed_from"] == "checkpoint-2" and record["budget"]["spent_steps"] == 4
    return [{k: json.loads(line)[k] for k in RESUME_KEYS} for line in (run_dir / "metrics.jsonl").open()]


def test_a_resume_saves_again_the_budget_checkpoints_written_after_its_trainer_checkpoint(tiny_sweep):
    # ckpt-075 (step 3) was written after trainer checkpoint 2: the resumed run reaches it again and must replace it
    _, paths = tiny_sweep
    resolved, spec, run_dir, whole = train_then_cut(tiny_sweep, "[0.75,1.0]", seed=3)
    saved = load_file(run_dir / "ckpt-075" / "model.safetensors")
    assert resumed_metrics(resolved, spec, 3, paths, run_dir) == whole
    again = load_file(run_dir / "ckpt-075" / "model.safetensors")
    for name, tensor in saved.items():
        torch.testing.assert_close(again[name], tensor, rtol=0, atol=0)


def test_a_resume_drops_a_metrics_line_cut_short_by_the_kill(tiny_sweep):
    import json

    _, paths = tiny_sweep
    resolved, spec, run_dir, whole = train_then_cut(tiny_sweep, "[0.5,1.0]", seed=4)
    partial = run_dir / "metrics.jsonl.partial"
    partial.write_text(partial.read_text() + json.dumps({"step": 4, "reward": 0.5})[:12])  # killed mid-write
    assert resumed_metrics(resolved, spec, 4, paths, run_dir) == whole


def test_a_run_killed_at_its_time_limit_resumes_after_the_limit_is_raised(tiny_sweep):
    # resources and eval settings change no training step: the resume key leaves them out (harness.train.run.run_key)
    _, paths = tiny_sweep
    _, spec, run_dir, whole = train_then_cut(tiny_sweep, "[0.5,1.0]", seed=5)
    raised = resumable_sweep(tiny_sweep, "[0.5,1.0]", 5, "resources.train.runtime=4320", "eval.k=3")
    assert resumed_metrics(raised, spec, 5, paths, run_dir) == whole


def test_a_corrupt_metrics_line_before_the_last_is_an_error_naming_the_line(tiny_sweep, tmp_path):
    from harness.train.run import _drop_metrics_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: "):
        _drop_metrics_after(metrics, 3)
