"""Fault handling: a NaN loss skips the step (no weight moves) and stops the run past the configured limit."""

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from harness.config import MethodSpec, resolve
from harness.train import run_training
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
    from harness.trainer import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match=r"test_nan_weights.*nan in 2 steps.*max_nonfinite_steps=1"):
        run(tiny_sweep, "train.budget.amount=4", "train.budget.checkpoint_fractions=[1.0]",
            "train.max_nonfinite_steps=1")
