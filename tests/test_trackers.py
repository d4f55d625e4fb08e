"""Trackers (harness/train/trackers.py): a run's TensorBoard event files hold metrics.jsonl's numbers under the same
names and its config; unknown or uninstalled trackers are clear errors."""

import importlib.util
import json

import pytest

from harness.config.loading import load_method, resolve
from harness.config.schema import ConfigError
from harness.train.run import run_training
from harness.train.trackers import open_trackers

SEED = 8  # a seed no other test of the session's tiny sweep trains


def test_tensorboard_events_hold_the_metrics_and_the_config(tiny_sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"},
                       [*overrides, "train.budget.amount=3", "train.budget.checkpoint_fractions=[1.0]"])
    assert resolved.preset.train.report_to == ["tensorboard"]  # by default
    run_training(resolved, load_method("uniform"), SEED, paths)
    run_dir = paths.run_dir("uniform", SEED)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("loss", "entropy", "budget/flops_total", "tokens/generated_total", "reward"):
        assert name in tags
        scalars = events.Scalars(name)
        assert [e.step for e in scalars] == [m["step"] for m in metrics]
        assert [e.value for e in scalars] == pytest.approx([m[name] for m in metrics], rel=1e-6)  # stored as float32
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "learning_rate: 0.0001" in config_text and "cpu_kernels: pinned" in config_text


def test_report_to_names_only_known_trackers(tiny_sweep):
    overrides, _ = tiny_sweep
    with pytest.raises(ConfigError, match="report_to"):
        resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.report_to=[tensorboard,neptune]"])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_an_uninstalled_tracker_says_how_to_install_it(tmp_path):
    with pytest.raises(ValueError, match=r"pip install -e \.\[trackers\]"):
        open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {}, "")
