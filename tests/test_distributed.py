"""Two training processes (DDP over gloo on CPU, launched by torchrun as accelerate launch would on GPUs): the
budget is counted over both, both stop at the same step, each file is written once, and the row-chunked backward
(gradients accumulated without synchronisation until the last chunk) gives the same gradients as one backward."""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from harness.config.paths import SweepPaths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_two_processes(tiny_sweep, root, backward_chunk_rows: int, extra: tuple[str, ...] = ()):
    overrides, paths = tiny_sweep
    mine = SweepPaths(root / "tiny")  # a copy of the shared sweep's data and warm start, so each run has its own folder
    shutil.copytree(paths.data_dir, mine.data_dir)
    shutil.copytree(paths.warmstart_dir.parent, mine.warmstart_dir.parent)
    # 2 prompts x 4 rollouts per step over 2 processes: 4 rollouts each. A samples budget of 3 global steps; a
    # process that counted only its own rollouts would run 6 steps. The k1 KL estimator's gradient (beta per token,
    # whatever ref_logp is) gives every step a real gradient even if every reward of the short warm start is 0; k3's
    # would be float noise in step 1 (pi_theta = pi_ref), which Adam turns into lr-sized steps.
    settings = [*overrides, f"results_dir={root}", "train.budget.kind=samples", "train.budget.amount=24",
                "train.budget.checkpoint_fractions=[0.5,1.0]", "train.save_every_steps=1", "train.weight_decay=0.1",
                "train.beta=0.1", "train.kl_estimator=k1", "train.learning_rate=1e-3",
                f"train.backward_chunk_rows={backward_chunk_rows}",
                *extra]
    sweep = root / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "preset": "tiny", "methods": ["uniform"], "seeds": [0]}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "harness.cli", "train",
               "--sweep", str(sweep), "--method", "entropy", "--seed", "0", *[f"--set={o}" for o in settings]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return mine.run_dir("entropy", 0), done, mine


@pytest.fixture(scope="module")
def two_process_run(tiny_sweep, tmp_path_factory):
    return train_two_processes(tiny_sweep, tmp_path_factory.mktemp("ddp"), backward_chunk_rows=0)


@pytest.fixture(scope="module")
def two_process_chunked_run(tiny_sweep, tmp_path_factory):
    return train_two_processes(tiny_sweep, tmp_path_factory.mktemp("ddp_chunked"), backward_chunk_rows=2)


@pytest.fixture(scope="module")
def two_process_minibatch_run(tiny_sweep, tmp_path_factory):
    # 4 prompts x 4 rollouts per generation batch, 2 groups per process, 2 mini-batch steps per generation batch:
    # a samples budget of 32 is 2 generation batches, 4 optimizer steps
    # verl's legacy micro-batch means within 100 tokens (each process splits its 4 rows; both take the larger count)
    return train_two_processes(tiny_sweep, tmp_path_factory.mktemp("ddp_minibatch"), backward_chunk_rows=0,
                               extra=("train.prompts_per_step=4", "train.mini_batches=2", "train.save_every_steps=2",
                                      "train.budget.amount=32", "train.loss_micro_batch_tokens=100"))


def weights(folder):
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def test_budget_counts_every_process_and_both_stop_together(two_process_run):
    run_dir, _, _ = two_process_run
    record = json.loads((run_dir / "run.json").read_text())
    assert record["budget"]["processes"] == 2
    assert record["budget"]["spent_steps"] == 3 and record["budget"]["spent"] == 24
    assert record["counters"]["rollouts_generated"] == 24
    assert record["budget"]["checkpoints"] == {"ckpt-050": 2, "ckpt-100": 3}
    ledger = json.loads((run_dir / "trl" / "checkpoint-3" / "harness_budget.json").read_text())["ledger"]
    assert ledger["samples"] == 24 and ledger["steps"] == 3


def test_each_file_is_written_once(two_process_run):
    run_dir, done, _ = two_process_run
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert done.stdout.count("trained entropy seed 0") == 1
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("ckpt")) == ["ckpt-050", "ckpt-100"]
    assert json.loads((run_dir / "sample_batch.json").read_text())["completion_ids"]


def test_budget_checkpoint_holds_the_trained_weights(two_process_run):
    run_dir, _, paths = two_process_run
    saved, trainer_checkpoint = weights(run_dir / "ckpt-100"), weights(run_dir / "trl" / "checkpoint-3")
    assert saved.keys() == trainer_checkpoint.keys()
    assert all(torch.equal(saved[k], trainer_checkpoint[k]) for k in saved)
    warm_start = weights(paths.warmstart_dir)
    assert not all(torch.equal(saved[k], warm_start[k]) for k in saved)


def test_row_chunked_backward_gives_the_same_synchronised_gradients(two_process_run, two_process_chunked_run):
    # grad_norm is taken after the all-reduce: a chunk left unsynchronised would change it by far more than float
    # noise. (Weights are not compared elementwise: Adam turns float noise in near-zero gradients into lr-sized steps.)
    def logged(run):
        lines = (run[0] / "metrics.jsonl").read_text().splitlines()
        return [(r["grad_norm"], r["loss"], r["kl"]) for r in map(json.loads, lines)]

    whole, chunked = logged(two_process_run), logged(two_process_chunked_run)
    assert len(whole) == len(chunked) == 3 and whole[-1][0] > 1e-3  # the last step has a real gradient
    # abs: in step 1 pi_theta = pi_ref; the reference's log-probs (one pass before the updates, forward_chunk_rows
    # rows per chunk) differ from the 2-row chunks' by float rounding of the padding, a kl of ~1e-8 where the
    # unchunked run's is exactly 0
    for a, b in zip(chunked, whole, strict=True):
        assert a == pytest.approx(b, rel=1e-3, abs=1e-7)


def test_loss_denominators_are_the_steps_over_both_processes(two_process_run):
    # one mean over the step's tokens of both processes: the KL term's denominator (every completion token) is the
    # all-reduced count, which equals the step's generated tokens of both processes as the budget ledger counts them;
    # entropy's selected count is the sum of each process's max(1, ceil(0.2 n_p))
    run_dir, _, _ = two_process_run
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    generated = [0] + [r["tokens/generated_total"] for r in lines]
    for step, record in enumerate(lines):
        tokens = generated[step + 1] - generated[step]
        assert record["loss/kl_denominator"] == tokens
        assert 0.2 * tokens <= record["loss/denominator"] <= 0.2 * tokens + 2


def test_dynamic_sampling_rounds_are_decided_alike_on_both_processes(tiny_sweep, tmp_path):
    # each process trains 1 of the 2 groups per step; both must run the same rounds and exchanges (generation, the
    # reward gather and the exchange of groups are collective: a process deciding otherwise would hang the run). The
    # 10-step warm start scores 0 almost everywhere, so most steps run out of their 3 rounds and are completed with
    # zero-variance groups.
    run_dir, _, _ = train_two_processes(tiny_sweep, tmp_path, backward_chunk_rows=0, extra=(
        "train.dynamic_sampling.enabled=true", "train.dynamic_sampling.max_generation_rounds=3",
        "train.budget.amount=48"))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(m["dynamic_sampling/groups_kept"] + m["dynamic_sampling/groups_filled"] == 2 for m in lines)
    assert all(1 <= m["dynamic_sampling/rounds"] <= 3 for m in lines)
    totals = [4 * sum(m["dynamic_sampling/groups_generated"] for m in lines[:i + 1]) for i in range(len(lines))]
    assert [m["budget/samples_total"] for m in lines] == totals  # both processes' rounds, every group
    record = json.loads((run_dir / "run.json").read_text())
    assert record["counters"]["rollouts_generated"] == totals[-1] >= 48


def test_mini_batches_share_the_budget_and_count_each_pass_once(two_process_minibatch_run):
    # the rollouts of both processes count, both stop at the end of the second generation batch, and the old-policy
    # and reference passes run once per generation batch on each process (one no-grad forward of its reduced batch
    # each: the same FLOPs). Losses are not compared with a single-process run: each process samples its own rollouts.
    run_dir, done, _ = two_process_minibatch_run
    record = json.loads((run_dir / "run.json").read_text())
    assert record["budget"]["processes"] == 2
    assert record["budget"]["spent"] == 32 and record["budget"]["spent_steps"] == 4
    assert record["budget"]["checkpoints"] == {"ckpt-050": 2, "ckpt-100": 4}  # generation-batch ends
    flops = record["budget"]["ledger"]["flops"]
    assert flops["old_logp"] > 0 and flops["reference"] == pytest.approx(flops["old_logp"])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert all(r["loss/micro_batches"] >= 1 for r in lines)
    assert done.stdout.count("trained entropy seed 0") == 1


def test_dynamic_sampling_trains_the_first_groups_with_signal_of_both_processes(tiny_model_dir, tmp_path):
    # tests/dynamic_sampling_probe.py: one step, 4 groups, rounds of 4 prompts (2 per process); the groups with
    # signal fall 3 on process 0 and 1 on process 1 in the first two rounds. Acceptance over both processes stops
    # after round 2 (a quota of 2 per process would need a third), the first 4 with signal in generation order are
    # trained, 2 per process, and one group moves from process 0 to process 1.
    probe = Path(__file__).resolve().parent / "dynamic_sampling_probe.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(probe), str(tiny_model_dir),
               str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = [json.loads((tmp_path / f"process-{p}.json").read_text()) for p in (0, 1)]
    assert len(runs[0]["rounds"]) == len(runs[1]["rounds"]) == 2
    generated = [group for r in range(2) for run in runs for group in run["rounds"][r]]  # (round, process, group)
    assert len({prompt for prompt, _ in generated}) == 8  # one stream: no prompt twice
    first = [prompt for prompt, answer in generated if answer == "mixed"][:4]
    assert [prompt for prompt, _ in generated].index(first[-1]) == 4  # the 4th with signal is process 0's round 2
    for p, run in enumerate(runs):
        assert sorted(run["trained"]) == sorted(first[2 * p:2 * p + 2] * 2)  # 2 whole groups (TRL shuffles rows)
        metrics = run["metrics"]
        assert (metrics["dynamic_sampling/rounds"], metrics["dynamic_sampling/groups_kept"]) == (2, 4)
        assert (metrics["dynamic_sampling/groups_generated"], metrics["dynamic_sampling/groups_moved"]) == (8, 1)
