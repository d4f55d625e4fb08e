"""A job for tests/test_zero3.py, run on 2 processes by torch.distributed.run over gloo: the actor's token-statistics
passes with rank-dependent row and token counts. Process 0 has 3 rows of 6 completion tokens, process 1 5 rows of
10 (``train.forward_chunk_rows`` = ``backward_chunk_rows`` = 2: 2 row chunks against 3; ``stats_chunk_size`` = 4:
several LM-head chunks, a different number on each process). A tiny float32 Qwen2 (random init, untied head, built
from a config), the same on both processes.

Modes:
- ``calls``: the model as it is (no wrapper); forward pre-hooks count the calls of the LM head module and of the
  first decoder layer in each pass: a no-grad pass (pi_old), a pass with grad and its backward, and
  ``Actor.policy_loss`` in backward row chunks (a no-grad pass, then a forward + backward per chunk). Then the same
  again (recorded under ``without_idle``) with ``Actor._chunks_behind`` forced to 0: each process runs only its
  own row chunks, as before the processes agreed on their number, and the counts differ (the test checks that too).
- ``ddp``: the model under DistributedDataParallel, ``accumulating`` = its ``no_sync``; a comm hook counts the
  gradient all-reduces of a pass with grad and of ``Actor.policy_loss`` in backward row chunks: the chunks must
  all-reduce once, in the last backward, as one backward does (DDP decides in the forward whether its backward
  all-reduces, so a chunk's forward outside no_sync all-reduced in every chunk's backward).
- ``zero3``: the model under DeepSpeed ZeRO-3 (``deepspeed.initialize``, every parameter released after each use,
  as an 8B model's LM head is: ``stage3_param_persistence_threshold`` 0), the same passes, each compared with an
  unsharded copy of the model run in one process on both processes' rows: logp, and the full gradients of the
  pass with grad (ZeRO averages them over the processes), then one ``engine.step``.

Each process writes OUT/process-<rank>.json.

Usage: python -m torch.distributed.run --nproc-per-node=2 tests/zero3_statistics_probe.py OUT MODE
"""

import copy
import datetime
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from harness.config.schema import TrainConfig
from harness.train.actor import Actor
from harness.train.budget import ModelShape, StepAccounting
from harness.train.hooks import new_rollout_batch, prepare_batch
from harness.train.step_batch import StepBatch
from methods.base import StepContext
from methods.uniform import Uniform

ROWS, WIDTHS, PROMPT = (3, 5), (6, 10), 4  # per process: rows, completion tokens
TRAIN = TrainConfig(max_completion_length=max(WIDTHS), forward_chunk_rows=2, backward_chunk_rows=2,
                    stats_chunk_size=4, padding_free=True, learning_rate=1e-2)


class DistProcesses:
    """The actor's ``Processes`` over torch.distributed (what ``AcceleratorProcesses`` does through accelerate);
    ``backward``: the engine's under ZeRO-3."""

    device = torch.device("cpu")

    def __init__(self, backward=None, no_sync=None):
        self.num_processes = dist.get_world_size()
        self.backward_of = backward or (lambda loss: loss.backward())
        self.no_sync = no_sync or nullcontext
        self.backwards = 0

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        values = values.clone()
        dist.all_reduce(values)
        return values

    def max(self, value: int) -> int:
        value = torch.tensor([value])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def backward(self, loss: torch.Tensor) -> None:
        self.backwards += 1
        self.backward_of(loss)

    def accumulating(self, model):
        return self.no_sync()


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def process_inputs(method, rank: int, ctx: StepContext) -> dict:
    """Process ``rank``'s reduced batch: ROWS[rank] rollouts of WIDTHS[rank] completion tokens, one prompt group
    per process, rewards alternating 1, 0 (so the uniform method keeps every rollout)."""
    g = torch.Generator().manual_seed(100 + rank)
    rows, width = ROWS[rank], WIDTHS[rank]
    completion_ids = torch.randint(4, 300, (rows, width), generator=g)
    mask = torch.ones(rows, width)
    rewards = torch.tensor([float(i % 2) for i in range(rows)])
    batch = new_rollout_batch(completion_ids, mask, rewards, torch.full((rows,), rank), "group")
    prompt_ids = torch.randint(4, 300, (1, PROMPT), generator=g).expand(rows, PROMPT)
    out = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
           "completion_mask": mask.long()}
    return StepBatch.kept(out, prepare_batch(method, batch, ctx), torch.device("cpu"))


def mean_logp_loss(logp: torch.Tensor, inputs: dict) -> torch.Tensor:
    mask = inputs.completion_mask.float()
    return -(logp * mask).sum() / mask.sum()


class CallCounter:
    """Calls of the LM head module and of the first decoder layer (forward pre-hooks: in forward, and again in
    backward wherever a module is recomputed)."""

    def __init__(self, model):
        self.head = self.layer = 0
        model.get_output_embeddings().register_forward_pre_hook(lambda module, args: self._count("head"))
        model.model.layers[0].register_forward_pre_hook(lambda module, args: self._count("layer"))

    def _count(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)

    def since(self, before: tuple[int, int]) -> dict[str, int]:
        return {"head": self.head - before[0], "layer": self.layer - before[1]}

    def mark(self) -> tuple[int, int]:
        return self.head, self.layer


def passes(actor: Actor, model, inputs: dict, counter: CallCounter, step) -> dict:
    """The three passes, each's module calls and backward count; ``step(model)`` after the pass with grad."""
    record, processes = {}, actor.processes
    mark = counter.mark()
    with torch.no_grad():
        record["nograd_logp"] = actor.statistics(model, inputs, (), "old_logp", False)["logp"].tolist()
    record["nograd_calls"] = counter.since(mark)
    mark, backwards = counter.mark(), processes.backwards
    logp = actor.statistics(model, inputs, ("entropy",), "train", True)["logp"]
    processes.backward(mean_logp_loss(logp, inputs))
    record["grad_logp"] = logp.detach().tolist()
    record["grad_calls"] = {**counter.since(mark), "backward": processes.backwards - backwards}
    record["gradients"] = step(model)
    mark, backwards = counter.mark(), processes.backwards
    ctx = StepContext(step=0, process_index=dist.get_rank(), max_completion_length=TRAIN.max_completion_length)
    loss = actor.policy_loss(model, inputs, ctx)
    processes.backward(loss)
    record["chunked_loss"] = float(loss.detach())
    record["chunked_calls"] = {**counter.since(mark), "backward": processes.backwards - backwards}
    return record


def reference_record(model, method) -> dict:
    """The unsharded model in this process, on both processes' rows: logp of each, and the gradients of the mean
    of the two processes' losses (what ZeRO's averaged gradients must equal)."""
    actor = Actor(method, TRAIN, StepAccounting(ModelShape.of(model), torch.device("cpu")), None,
                  lambda name, value: None, ())
    record = {"logp": []}
    for rank in (0, 1):
        inputs = process_inputs(method, rank, StepContext(process_index=rank))
        logp = actor.statistics(model, inputs, ("entropy",), "train", True)["logp"]
        (mean_logp_loss(logp, inputs) / 2).backward()
        record["logp"].append(logp.detach().tolist())
    record["gradients"] = {name: p.grad for name, p in model.named_parameters()}
    return record


def main(out: Path, mode: str) -> None:
    if mode == "zero3":
        import deepspeed

        # DeepSpeed JIT-compiles its shared-memory all-reduce for CPU inference (inference_all_reduce only, unused
        # here) in init_distributed: ~2 minutes of each process's CPU on this machine, whenever its build cache was
        # built with other flags
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (deepspeed.comm.torch: torch itself)
        deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=60))
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    method = Uniform()
    model = tiny_qwen2()
    record = {}
    if mode == "zero3":
        reference = reference_record(copy.deepcopy(model), method)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                  "zero_allow_untested_optimizer": True,
                  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                        "stage3_max_live_parameters": 1, "stage3_prefetch_bucket_size": 0,
                                        "stage3_max_reuse_distance": 0}}
        optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN.learning_rate)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        processes, target = DistProcesses(engine.backward), engine

        def step(wrapped) -> dict:
            full = {name: deepspeed.utils.safe_get_full_grad(p) for name, p in engine.module.named_parameters()}
            wrapped.step()
            return {name: (full[name] - reference["gradients"][name]).abs().max().item() for name in full}

        record["reference_logp"] = reference["logp"][rank]
        record["partitioned"] = engine.module.lm_head.weight.ds_numel > engine.module.lm_head.weight.numel()
    elif mode == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        target = DistributedDataParallel(model)
        allreduces = []
        target.register_comm_hook(None, lambda state, bucket: allreduces.append(1) or allreduce_hook(state, bucket))
        processes = DistProcesses(no_sync=target.no_sync)

        def step(wrapped) -> dict:
            wrapped.zero_grad()
            return {}
    else:
        processes, target = DistProcesses(), model

        def step(wrapped) -> dict:
            wrapped.zero_grad()
            return {}

    counter = CallCounter(getattr(target, "module", target))
    accounting = StepAccounting(ModelShape.of(getattr(target, "module", target)), torch.device("cpu"))
    actor = Actor(method, TRAIN, accounting, processes, lambda name, value: None, ())
    inputs = process_inputs(method, rank, StepContext(process_index=rank))
    record.update(passes(actor, target, inputs, counter, step))
    if mode == "ddp":  # the all-reduces of the pass with grad (one backward) and of the chunked policy loss
        before = len(allreduces)
        logp = actor.statistics(target, inputs, (), "train", True)["logp"]
        processes.backward(mean_logp_loss(logp, inputs))
        one_backward = len(allreduces) - before
        step(target)
        before = len(allreduces)
        ctx = StepContext(step=0, process_index=rank, max_completion_length=TRAIN.max_completion_length)
        processes.backward(actor.policy_loss(target, inputs, ctx))
        record["allreduces"] = {"one_backward": one_backward, "chunked": len(allreduces) - before}
    if mode == "calls":
        Actor._chunks_behind = lambda self, chunks, inputs: 0
        record["without_idle"] = passes(actor, target, inputs, counter, step)
    dist.barrier()
    (out / f"process-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2])
