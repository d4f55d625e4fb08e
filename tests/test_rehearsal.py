"""Rehearsals of the GPU sweeps (`harness rehearse`: harness/ops/rehearsal.py, rehearsal_setup.py): what a
rehearsal keeps and what it replaces (fast), and, under the `rehearsal` marker, the rehearsal of every paper sweep (and
of every GPU sweep with HARNESS_REHEARSE_ALL=1) end to end through Snakemake on CPU with its checks
(precision, weights moved, ledger against the budget's arithmetic, report; resume after a kill for ``RESUMED``).
"""

import json
import os
from pathlib import Path

import pytest

from harness.config.loading import resolve
from harness.config.paths import REPO_ROOT
from harness.ops import rehearsal, rehearsal_setup

SWEEPS = REPO_ROOT / "configs" / "sweeps"
PAPER_SWEEPS = sorted(p.stem for p in SWEEPS.glob("paper-*.yaml"))
# every sweep that runs on GPUs: the paper sweeps and the project's own head-to-head of all methods
GPU_SWEEPS = [*PAPER_SWEEPS, "head-to-head"]
# the kill-and-resume check of a rehearsal (one more train job, killed and rerun) in CI: one per engine, ddp
# (paper-ktae), ZeRO-3 (paper-nat); dynamic sampling's prompt stream resumes in tests/test_dynamic_sampling.py;
# `harness rehearse` checks it for every sweep
RESUMED = ("paper-ktae", "paper-nat")
# Left out of CI's 60 minutes (each one's protocol is still checked above), run with HARNESS_REHEARSE_ALL=1 or
# `harness rehearse`: head-to-head (336 s; its methods and recipe run in the paper rehearsals), paper-ktae-grpo
# (171 s; paper-ktae's preset, engine and method; what it adds, a KL term to a reference model under DDP, runs in
# tests/test_distributed.py), paper-rsi (171 s; DDP with float32 masters under bf16 autocast as paper-ktae, and the
# same update_schedule) and paper-gmts (173 s; DDP as paper-ktae; its bfloat16 masters under a 2-process launch run
# in tests/test_precision.py; the gmts and rsi methods in tests/methods) and paper-d3s (~240 s; ZeRO-3 with backward
# row chunks as paper-nat; its rollouts dropped per process, so processes hold different row counts, run under
# DeepSpeed ZeRO-3 in tests/test_zero3.py and tests/test_rank_faults.py; the d3s method in tests/methods/test_d3s.py)
CI_SKIPPED = ("head-to-head", "paper-ktae-grpo", "paper-rsi", "paper-gmts", "paper-d3s")
FULL_REHEARSALS = [s for s in GPU_SWEEPS if os.environ.get("HARNESS_REHEARSE_ALL") or s not in CI_SKIPPED]
# the A/A label (uniform-aa: uniform again, other seeds) trains and is reported in paper-ktae's CI rehearsal; the others
# leave it out in CI (one train and one eval job each, ~20% of a rehearsal; `harness rehearse --labels`)
CI_LABELS = {"paper-8020": ["uniform", "entropy"], "paper-nat": ["uniform", "nat", "nat-urs"]}
# what a rehearsal must not change: (dotted key of the resolved preset)
KEPT = ("prompt_template", "model.dtype", "train.master_dtype", "train.learning_rate", "train.weight_decay",
        "train.warmup_steps", "train.max_grad_norm", "train.ppo_epochs", "train.clip_eps_low",
        "train.clip_eps_high", "train.clip_ratio_c", "train.beta", "train.kl_estimator", "train.aggregation",
        "train.scale_rewards", "train.reward", "train.reward_values", "train.temperature", "train.top_p",
        "train.dynamic_sampling.enabled", "train.dynamic_sampling.max_generation_rounds", "train.overlong.penalty",
        "train.launcher", "train.distributed", "train.budget.kind", "eval.k", "eval.temperature",
        "eval.top_p", "eval.greedy", "eval.stop")


def value(resolved, dotted: str):
    node = resolved.to_dict()["preset"]
    for part in dotted.split("."):
        node = node[part]
    return node


def rehearsal_of(sweep: str, tmp_path: Path, **kwargs):
    data_file = tmp_path / "train.jsonl"
    # resolve reads the training file a sweep names (rows, keys, no benchmark problem): the rehearsal's own rows
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rehearsal_setup.rehearsal_rows()))
    return rehearsal_setup.rehearsal_sweep(SWEEPS / f"{sweep}.yaml", tmp_path, tmp_path / "model", data_file,
                                           context_tokens=200, **kwargs)


@pytest.mark.parametrize("sweep", GPU_SWEEPS)
def test_a_rehearsal_keeps_the_protocol_and_replaces_only_scale(sweep, tmp_path):
    paper = resolve(SWEEPS / f"{sweep}.yaml")
    plan = rehearsal_of(sweep, tmp_path)
    small = resolve(plan.sweep)  # passes every check the paper sweep passes
    for key in KEPT:
        assert value(small, key) == value(paper, key), key
    assert small.sweep.methods == paper.sweep.methods and "uniform-aa" in small.sweep.methods
    assert small.sweep.name == paper.sweep.name  # so its claims and fidelity files are the paper's
    assert small.sweep.seeds == paper.sweep.seeds[:1]
    train, paper_train = small.preset.train, paper.preset.train
    assert small.preset.resources.train.gpus == rehearsal_setup.PROCESSES and train.launcher == "accelerate"
    # one prompt group per process and mini-batch; dynamic sampling's round in the paper's proportion to the step
    assert train.mini_batches == min(paper_train.mini_batches, rehearsal_setup.MAX_MINI_BATCHES)
    assert train.prompts_per_step == rehearsal_setup.PROCESSES * train.mini_batches
    if paper_train.dynamic_sampling.enabled:
        paper_ratio = paper_train.dynamic_sampling.prompts_per_round / paper_train.prompts_per_step
        assert train.dynamic_sampling.prompts_per_round == paper_ratio * train.prompts_per_step
    assert bool(train.overlong.buffer) == bool(paper_train.overlong.buffer)
    assert bool(train.loss_micro_batch_tokens) == bool(paper_train.loss_micro_batch_tokens)
    # the preset's distributed engine runs for real (DeepSpeed ZeRO-3 over gloo): the rehearsal checks what it got
    assert train.distributed == paper_train.distributed and not train.use_vllm and small.preset.eval.backend == "hf"
    assert any(f"distributed: {paper_train.distributed}, as the preset" in line for line in plan.replaced)
    assert all(b.limit == rehearsal_setup.BENCHMARK_ROWS for b in small.preset.eval.benchmarks.values())
    assert set(small.preset.eval.benchmarks) == set(paper.preset.eval.benchmarks)


def test_the_vllm_cpu_rehearsal_runs_one_colocated_process(tmp_path):
    small = resolve(rehearsal_of("paper-ktae", tmp_path, mode="vllm-cpu").sweep)
    train = small.preset.train
    assert (train.launcher, train.use_vllm, train.vllm_device, small.preset.resources.train.gpus) == (
        "python", True, "cpu", 0)
    assert small.preset.eval.backend == "vllm" and small.preset.eval.vllm.device == "cpu"


def test_the_cuda_rehearsal_runs_one_gpu_job_per_gpu(tmp_path):
    """--mode cuda: the train and eval jobs each ask for a GPU, and Snakemake is given the GPUs there are as the
    `gpu` resource, so on one GPU they run one at a time (two eval engines at half its memory each collided)."""
    from harness.ops.resources import rule_resources

    small = rehearsal_of("paper-ktae", tmp_path, mode="cuda")
    asked = rule_resources(resolve(small.sweep).preset)
    assert asked["train"]["gpu"] == asked["eval"]["gpu"] == 1
    command = rehearsal.snakemake_command(small, tmp_path, cores=8, gpus=1)
    assert command[command.index("--resources") + 1] == "gpu=1"
    # on CPU a train job's 2 processes stand for its GPUs: train jobs run one at a time
    assert rehearsal.gpu_slots("cpu") == rehearsal_setup.PROCESSES and rehearsal.gpu_slots("vllm-cpu") == 0


def test_architectures_follow_the_hub_id():
    assert rehearsal_setup.architecture("Qwen/Qwen2.5-Math-1.5B") == "qwen2"
    assert rehearsal_setup.architecture("Qwen/Qwen3-8B-Base") == "qwen3"
    assert rehearsal_setup.architecture("meta-llama/Llama-3.1-8B") == "llama"
    with pytest.raises(ValueError, match="no rehearsal architecture"):
        rehearsal_setup.architecture("mistralai/Mistral-7B")


def test_rehearsal_rows_have_two_answers_about_evenly():
    rows = rehearsal_setup.rehearsal_rows()
    answers = [r["answer"] for r in rows]
    assert len(rows) == rehearsal_setup.TRAIN_ROWS and set(answers) == {"2", "3"}
    assert 0.4 < answers.count("2") / len(rows) < 0.6  # a format-only model is right about half the time


@pytest.fixture(scope="module")
def rehearsal_root(tmp_path_factory):
    return tmp_path_factory.mktemp("rehearsals")  # shared: rehearsals of one architecture and template share a model


@pytest.mark.rehearsal
@pytest.mark.parametrize("sweep", FULL_REHEARSALS)
def test_paper_sweep_rehearsal(sweep, rehearsal_root, capsys):
    resume = sweep in RESUMED
    labels = None if os.environ.get("HARNESS_REHEARSE_ALL") else CI_LABELS.get(sweep)
    assert rehearsal.rehearse(SWEEPS / f"{sweep}.yaml", rehearsal_root, resume=resume,
                              labels=labels) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "replaced: model:" in out and ("resume:" in out) == resume and f"passed: {sweep}" in out
    root = rehearsal_root / sweep
    board = (root / "leaderboard.md").read_text()
    for element in ("| precision |", "| reward |", "| aggregation |", "| eval_top_p |", "| eval_stop |",
                    "| eval_grader |", "| budget |"):
        assert element in board, element
    # one seed per label: the report says it cannot judge
    assert "not judged" in board and "one seed per label" in board
    assert ("uniform-aa" in board) == (labels is None)


def test_a_rehearsal_of_some_labels_keeps_the_sweeps_order_and_refuses_others(tmp_path):
    small = resolve(rehearsal_of("paper-nat", tmp_path, labels=["nat", "uniform"]).sweep)
    assert small.sweep.methods == ["uniform", "nat"]
    with pytest.raises(ValueError, match=r"--labels uniform,gmts: .*paper-nat.yaml has the methods \['uniform', "):
        rehearsal_of("paper-nat", tmp_path, labels=["uniform", "gmts"])
