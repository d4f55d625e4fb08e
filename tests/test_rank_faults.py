"""A fault on one training process of several: every process decides alike (one all-reduce) whether the step's loss
was non-finite on any process, whether any process kept no rollout, whether any has an empty mini-batch. So they all
skip the step together (the replicas stay bit-identical) or all raise the same error (none is left waiting in a
collective). Two processes for real (DDP over gloo, ``tests/rank_fault_probe.py``), and the decisions with a
stand-in for the other process."""

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.config.schema import TrainConfig
from harness.model.checkpoints import load_policy
from harness.train.actor import UNPACKABLE, Actor, NonFiniteLossError, every_process, update_schedule
from harness.train.budget import ModelShape, StepAccounting
from harness.train.hooks import new_rollout_batch, prepare_batch
from harness.train.row_chunks import Sequences
from harness.train.step_batch import StepBatch
from harness.train.trl.patches import skippable_step
from methods.base import StepContext
from methods.uniform import Uniform

PROBE = Path(__file__).resolve().parent / "rank_fault_probe.py"
ZERO3_PROBE = Path(__file__).resolve().parent / "zero3_skip_probe.py"
# ~20-30 s a probe alone, 2-4x that on a busy machine; a process left waiting in a collective would wait 30 minutes
PROBE_TIMEOUT_S = 300


# --- the decisions, with a stand-in for the other process -------------------------------------------------------

class SecondProcess:
    """Two processes as process 0 sees them: ``sum`` adds process 1's share. In a per-process table
    (``every_process``: a (2, ...) tensor) process 1's row is ``theirs``; in the loss denominators (a (2,) tensor of
    ``Actor.normalised``) process 1 counts as many as process 0."""

    num_processes = 2
    device = torch.device("cpu")

    def __init__(self, theirs: torch.Tensor):
        self.theirs = theirs
        self.sums = 0

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        self.sums += 1
        if values.dim() == 1:
            return values * 2
        other = torch.zeros_like(values)
        other[1] = self.theirs
        return values + other

    def max(self, value: int) -> int:
        return value

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()


class OneProcess:
    """One process: no collective may run (``sum`` would fail)."""

    num_processes = 1
    device = torch.device("cpu")

    def sum(self, values):
        raise AssertionError("a collective with one process")


class NanWeights(Uniform):
    """The uniform baseline with NaN token weights (a method whose arithmetic broke)."""

    def token_weights(self, stats, batch, ctx):
        result = super().token_weights(stats, batch, ctx)
        return dataclasses.replace(result, weights=result.weights * float("nan"))


def test_every_process_stacks_each_process_values_with_one_sum():
    processes = SecondProcess(torch.tensor([float("nan"), 2.0]))
    mine = torch.tensor([1.0, float("inf")])
    table = every_process(processes, mine, 0)
    assert processes.sums == 1
    assert table[0].tolist() == [1.0, float("inf")] and math.isnan(table[1, 0]) and table[1, 1] == 2.0
    assert every_process(OneProcess(), mine, 0).tolist() == [[1.0, float("inf")]]  # no collective


def actor_and_inputs(model_dir, processes, method, **train):
    """An actor on the tiny policy, and one process's reduced batch of 2 groups x 2 rollouts."""
    model, _ = load_policy(model_dir)
    accounting = StepAccounting(ModelShape.of(model), torch.device("cpu"))
    logged = {}
    actor = Actor(method, TrainConfig(max_completion_length=6, **train), accounting, processes,
                  logged.__setitem__, ())
    actor.logged = logged
    g = torch.Generator().manual_seed(0)
    completion_ids = torch.randint(4, 40, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    batch = new_rollout_batch(completion_ids, mask, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]),
                              "group")
    prompt_ids = torch.randint(4, 40, (4, 3), generator=g)
    out = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
           "completion_mask": mask.long()}
    inputs = StepBatch.kept(out, prepare_batch(method, batch, StepContext(max_completion_length=6)),
                            torch.device("cpu"))
    return actor, model, inputs


def gradients(model) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def test_a_nonfinite_loss_on_the_other_process_skips_this_ones_step(tiny_model_dir):
    # this process's loss is finite, process 1's NaN: this one skips too (DDP would otherwise step on the averaged
    # gradient here while process 1 kept its weights), its backward is exact zeros, and it counts the step
    processes = SecondProcess(torch.tensor([float("nan")]))
    actor, model, inputs = actor_and_inputs(tiny_model_dir, processes, Uniform(), max_nonfinite_steps=1)
    ctx = StepContext(max_completion_length=6, process_index=0)
    loss = actor.policy_loss(model, inputs, ctx)
    assert actor.skip_optimizer_step and actor.nonfinite_steps == 1 and actor.logged["nonfinite/skipped_total"] == 1
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert gradients(model) and all(not g.any() for g in gradients(model))
    processes.theirs = torch.tensor([0.5])  # the next step is finite everywhere: this process steps again
    model.zero_grad()
    actor.policy_loss(model, inputs, ctx).backward()
    assert not actor.skip_optimizer_step and any(g.any() for g in gradients(model))
    processes.theirs = torch.tensor([float("inf")])
    with pytest.raises(NonFiniteLossError, match=r"the loss was inf on process 1 in 2 steps.*max_nonfinite_steps=1"):
        actor.policy_loss(model, inputs, ctx)  # the same count on every process: both raise here


def test_nan_token_weights_leave_exactly_zero_gradients(tiny_model_dir):
    # the skipped step's backward runs the step's own graph (its collectives pair up with the other processes'): the
    # NaN weights must not reach the gradients as 0 x NaN
    actor, model, inputs = actor_and_inputs(tiny_model_dir, OneProcess(), NanWeights())
    loss = actor.policy_loss(model, inputs, StepContext(max_completion_length=6))
    assert actor.skip_optimizer_step
    assert math.copysign(1.0, float(loss.detach())) == 1.0  # +0.0, the value logged before
    loss.backward()
    assert gradients(model) and all(not g.any() for g in gradients(model))


def test_a_skipped_step_skips_every_step_call_of_the_update():
    # DeepSpeed ZeRO-3 calls the inner optimizer's step once per parameter sub-group: a flag cleared by the first call
    # stepped all the others
    weights = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.AdamW(weights, lr=0.1)
    actor = SimpleNamespace(skip_optimizer_step=True)
    skippable_step(optimizer, actor)
    for w in weights:
        w.grad = torch.ones(2)
    for _ in range(2):
        optimizer.step()
    assert all(torch.equal(w, torch.ones(2)) for w in weights)
    actor.skip_optimizer_step = False  # the next update's loss was finite
    optimizer.step()
    assert all(not torch.equal(w, torch.ones(2)) for w in weights)


def schedule_batch():
    """4 rows of 2 prompt groups: group 0 (rows 0, 1) and group 1 (rows 2, 3), and each row's group."""
    ids = torch.arange(8).reshape(4, 2)
    return Sequences(ids, torch.ones_like(ids), ids, torch.ones_like(ids)), torch.tensor([0, 0, 1, 1])


def test_an_empty_mini_batch_on_another_process_raises_on_every_process():
    batch, group = schedule_batch()
    theirs = torch.tensor([1.0, 0.0])  # process 1 dropped every rollout of its first mini-batch
    with pytest.raises(ValueError, match=r"mini-batches \[0\] on process 1; lower train.mini_batches=2"):
        update_schedule(batch, group, 2, 2, 1, SecondProcess(theirs), 0)
    parts = list(update_schedule(batch, group, 2, 2, 1, SecondProcess(torch.zeros(2)), 0))
    assert [p.completion_ids.shape[0] for p in parts] == [2, 2]
    kept = batch.rows(torch.tensor([2, 3]))  # one process that dropped group 0: the message as before
    with pytest.raises(ValueError, match=r"^dropped every rollout of mini-batches \[0\]; lower train.mini_batches=2$"):
        update_schedule(kept, group[2:], 2, 2, 1, OneProcess(), 0)


def test_no_rollout_kept_on_another_process_raises_on_every_process():
    actor = SimpleNamespace(processes=SecondProcess(torch.tensor([1.0])), method=Uniform())
    ctx = StepContext(step=4, process_index=0)
    with pytest.raises(RuntimeError, match=r"'uniform' kept no rollout or no token in step 4 on processes \[1\];"):
        Actor._require_kept_tokens(actor, False, ctx)
    actor.processes.theirs = torch.tensor([0.0])
    Actor._require_kept_tokens(actor, False, ctx)


class UnpackableElsewhere(SecondProcess):
    """Process 1 found rows the padding-free forward cannot pack: its count arrives flagged in ``max``."""

    def max(self, value: int) -> int:
        return max(value, UNPACKABLE + 1)


def test_rows_another_process_cannot_pack_raise_here_before_any_forward(tiny_model_dir):
    # packed_rows would raise on process 1 alone, in the middle of its forwards, leaving this one in a weight gather
    actor, model, inputs = actor_and_inputs(tiny_model_dir, UnpackableElsewhere(torch.zeros(1)), Uniform())
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    with pytest.raises(ValueError, match=r"not one contiguous run.*\(none of this process's rows\); set "
                                         r"train.padding_free=false"):
        actor.policy_loss(model, inputs, StepContext(max_completion_length=6, process_index=0))
    assert not calls
    inputs.completion_mask[0, 2] = 0  # this process's own hole: its count in the message
    actor.processes = SecondProcess(torch.zeros(1))
    with pytest.raises(ValueError, match=r"\(1 row\(s\) of this process\)"):
        actor.policy_loss(model, inputs, StepContext(max_completion_length=6, process_index=0))
    assert not calls


# --- two processes for real ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_probe(model_dir: Path, out: Path, scenario: str, probe: Path = PROBE) -> list[dict]:
    """``probe`` (``tests/rank_fault_probe.py``: ``scenario``) on 2 processes; each process's record. A process
    waiting in a collective fails the test at PROBE_TIMEOUT_S (its processes are stopped)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(probe), str(model_dir),
               str(out), scenario]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        launcher.terminate()  # torchrun stops its workers (in sessions of their own: a kill of its group misses them)
        try:
            output, _ = launcher.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            output, _ = launcher.communicate()
        pytest.fail(f"{scenario}: a process still waiting after {PROBE_TIMEOUT_S} s\n{output[-3000:]}")
    assert launcher.returncode == 0, output[-4000:]
    return [json.loads((out / f"process-{p}.json").read_text()) for p in (0, 1)]


def test_nan_on_one_process_skips_the_step_on_both(tiny_model_dir, tmp_path):
    # NaN token weights on process 1 in step 1 of 3: both skip it (the weights after it are those before it), the
    # replicas are bit-identical after every step, and the last step trains again
    first, second = run_probe(tiny_model_dir, tmp_path, "nan_once")
    assert first["error"] is None and second["error"] is None
    assert first["digests"] == second["digests"] and len(first["digests"]) == 3
    after_step = first["digests"]
    assert after_step[1] == after_step[0] != after_step[2]
    assert first["nonfinite_steps"] == second["nonfinite_steps"] == 1


def test_too_many_nonfinite_steps_on_one_process_stop_both(tiny_model_dir, tmp_path):
    # NaN on process 1 in every step, one allowed: both processes raise the same error in the second step
    first, second = run_probe(tiny_model_dir, tmp_path, "nan_stop")
    assert first["error"] == second["error"]
    assert first["error"]["type"] == "NonFiniteLossError"
    assert "the loss was nan on process 1 in 2 steps" in first["error"]["message"]
    assert first["digests"] == second["digests"] and len(first["digests"]) == 1


def test_no_rollout_kept_on_one_process_stops_both(tiny_model_dir, tmp_path):
    first, second = run_probe(tiny_model_dir, tmp_path, "no_rollout")
    assert first["error"] == second["error"]
    assert "kept no rollout or no token in step 1 on processes [1]" in first["error"]["message"]
    assert first["digests"] == second["digests"] and len(first["digests"]) == 1


def test_an_empty_mini_batch_on_one_process_stops_both(tiny_model_dir, tmp_path):
    first, second = run_probe(tiny_model_dir, tmp_path, "empty_mini_batch")
    assert first["error"] == second["error"]
    assert "dropped every rollout of mini-batches [0] on process 1" in first["error"]["message"]


def test_nan_on_one_process_skips_every_sub_group_under_zero3(tiny_model_dir, tmp_path):
    # DeepSpeed ZeRO-3, every parameter released after use, 4 optimizer sub-groups: the skipped step's backward runs
    # (a zero graph over the empty p.data crashed it), and no sub-group of either process moves in the NaN step
    pytest.importorskip("deepspeed")
    first, second = run_probe(tiny_model_dir, tmp_path, "", probe=ZERO3_PROBE)
    for record in (first, second):
        assert record["error"] is None and record["sub_groups"] > 1 and record["nonfinite_steps"] == 1
        assert [all(step) for step in record["moved"]] == [True, False, True]
        assert not any(record["moved"][1])
