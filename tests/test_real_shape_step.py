"""bench/real_shape_step.py, the GPU smoke test's real-size training step, on CPU at ``--scale tiny``: the same code
path (the paper preset's architecture family, chunk settings, precision and the harness's actor) runs two optimizer
steps and writes the measured and analytic figures; and the analytic figure it judges a GPU's peak against."""

from __future__ import annotations

import json
import math

import pytest

from bench.real_shape_step import GIB, analytic_figures, default_rows, main, run_shapes, verdict_of
from harness.config.loading import resolve
from harness.config.memory import ARCHITECTURES
from harness.config.paths import CONFIG_DIR

SWEEPS = CONFIG_DIR / "sweeps"


@pytest.mark.parametrize(("sweep", "model_class"), [("paper-ktae", "Qwen2ForCausalLM"),
                                                    ("paper-nat", "Qwen3ForCausalLM")])
def test_tiny_real_shape_step_runs_the_update_path_and_writes_both_figures(sweep, model_class, tmp_path):
    preset = resolve(SWEEPS / f"{sweep}.yaml").preset
    record = main(["--sweep", str(SWEEPS / f"{sweep}.yaml"), "--device", "cpu", "--scale", "tiny",
                   "--results", str(tmp_path)])
    stem = sweep.removeprefix("paper-")
    written = json.loads((tmp_path / f"real_shape_step_{stem}_cpu_tiny.json").read_text())
    assert written["verdict"] == record["verdict"] == "n/a"  # no verdict on CPU: the resident set is not comparable
    assert "error" not in written
    assert [s["step"] for s in written["steps"]] == [1, 2]
    assert all(math.isfinite(s["loss"]) and not s["skipped"] and s["seconds"] > 0 for s in written["steps"])
    assert written["parameters_moved"] == written["parameter_tensors"] > 0  # every weight took the AdamW step
    # the preset's own architecture family, chunking and precision, scaled down
    arch = ARCHITECTURES[preset.model.name_or_path]
    assert written["architecture"]["qk_norm"] == arch.qk_norm and written["architecture"]["num_hidden_layers"] == 2
    assert written["rows"] == 2 * preset.train.backward_chunk_rows
    assert written["completion_tokens"] == 64
    settings = written["settings"]
    assert settings["backward_chunk_rows"] == preset.train.backward_chunk_rows
    assert settings["forward_chunk_rows"] == preset.train.forward_chunk_rows
    assert (settings["master_dtype"], settings["compute_dtype"]) == ("float32", "bfloat16")
    # the measurement and both analytic figures
    assert written["measured_peak_bytes"] > 0 and written["measured_kind"].startswith("peak resident set")
    analytic = written["analytic"]
    assert analytic["run_bytes"] == pytest.approx(sum(analytic["run_parts"].values()))
    assert analytic["run_bytes"] > 0 and analytic["plan_training_bytes"] > 0
    assert not any(name.startswith(("vLLM", "CUDA")) for name in analytic["run_parts"])
    assert any(name.startswith("vLLM share") for name in analytic["run_excluded"])  # colocated vLLM: left out
    assert (tmp_path / "summary.md").read_text().count("verdict: n/a real-shape step") == 1
    assert written["model_class"] == model_class


def test_the_analytic_figure_of_the_run_is_the_plans_training_step_at_one_process():
    """paper-ktae (ddp over 4 GPUs): one process holds the plan's training tensors less DDP's buckets; the vLLM
    share and the CUDA context (outside torch's allocator) are not in the figure max_memory_allocated is held to."""
    preset = resolve(SWEEPS / "paper-ktae.yaml").preset
    shapes = run_shapes(preset, "real")
    assert (shapes.prompt_tokens, shapes.completion_tokens) == (1024, 3072)  # vllm_max_model_length 4096
    rows = default_rows(shapes)
    assert rows == 16
    figures = analytic_figures(preset, shapes, rows, run_reference=False, plan_reference=False)
    plan = figures["plan_training_parts"]
    n = ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"].parameters
    assert plan["DDP gradient buckets"] == 4 * n and "DDP gradient buckets" not in figures["run_parts"]
    expected = figures["plan_training_bytes"] - plan["DDP gradient buckets"] - plan["CUDA context (assumed)"]
    assert figures["run_bytes"] == pytest.approx(expected)
    assert 30 * GIB < figures["run_bytes"] < 45 * GIB  # fits an 80 GiB GPU alone, as the smoke test runs it


@pytest.mark.parametrize(("device", "measured", "error", "expected"), [
    ("cuda", 10 * GIB, None, "PASS"), ("cuda", 10 * GIB + 1, None, "FAIL"), ("cuda", 1, "out of memory", "FAIL"),
    ("cpu", 1, None, "n/a")])
def test_verdict_passes_only_when_the_plan_does_not_under_estimate(device, measured, error, expected):
    record = {"device": device, "measured_peak_bytes": measured, "analytic": {"run_bytes": 10 * GIB}}
    if error:
        record["error"] = error
    assert verdict_of(record) == expected
