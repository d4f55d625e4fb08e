"""A job for tests/test_rank_faults.py, run on 2 processes by torch.distributed.run: the non-finite skip under
DeepSpeed ZeRO-3 over gloo. ``Actor.policy_loss`` of the uniform method, with NaN token weights on process 1 in step 1
(of 3); each step's backward and optimizer step as accelerate's DeepSpeed wrapper runs them (``engine.backward``,
then ``engine.step``: the ZeRO-3 optimizer steps the inner optimizer, wrapped by ``skippable_step`` as
``TargetedGRPOTrainer.create_optimizer`` wraps it, once per parameter sub-group). Every parameter is released after
each use (as an 8B model's must be: ``p.data`` is empty between uses) and the partitions form several sub-groups.
accelerate's own DeepSpeed path does not run on CPU, hence the engine by hand.

Each process writes OUT/process-<rank>.json: per step, which of its sub-groups' float32 partitions moved; its count
of non-finite steps; the error it raised, if any.

Usage: python -m torch.distributed.run --nproc-per-node=2 tests/zero3_skip_probe.py MODEL_DIR OUT [ignored]
"""

import dataclasses
import datetime
import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from harness.config.schema import TrainConfig
from harness.model.checkpoints import load_policy
from harness.train.actor import Actor
from harness.train.budget import ModelShape, StepAccounting
from harness.train.hooks import new_rollout_batch, prepare_batch
from harness.train.step_batch import StepBatch
from harness.train.trl.patches import skippable_step
from methods.base import StepContext
from methods.uniform import Uniform

STEPS, NAN_STEP, WIDTH = 3, 1, 6


class NanOnProcessOne(Uniform):
    """The uniform baseline, with NaN token weights on process 1 in step NAN_STEP."""

    def token_weights(self, stats, batch, ctx):
        result = super().token_weights(stats, batch, ctx)
        if ctx.process_index == 1 and ctx.step == NAN_STEP:
            return dataclasses.replace(result, weights=result.weights * float("nan"))
        return result


class EngineProcesses:
    """The actor's ``Processes`` over torch.distributed and a DeepSpeed engine (what ``AcceleratorProcesses`` does
    through accelerate)."""

    device = torch.device("cpu")

    def __init__(self, engine):
        self.engine = engine
        self.num_processes = dist.get_world_size()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        values = values.clone()
        dist.all_reduce(values)
        return values

    def max(self, value: int) -> int:
        value = torch.tensor([value])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)


def step_inputs(method, rank: int, step: int, ctx: StepContext) -> dict:
    """This process's reduced batch for ``step``: 2 groups x 2 rollouts, different on each process."""
    g = torch.Generator().manual_seed(100 * step + rank)
    completion_ids = torch.randint(4, 40, (4, WIDTH), generator=g)
    mask = torch.ones(4, WIDTH)
    batch = new_rollout_batch(completion_ids, mask, torch.tensor([1.0, 0.0, 0.0, 1.0]),
                              torch.tensor([0, 0, 1, 1]) + 2 * rank, "group")
    prompt_ids = torch.randint(4, 40, (4, 3), generator=g)
    out = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
           "completion_mask": mask.long()}
    return StepBatch.kept(out, prepare_batch(method, batch, ctx), torch.device("cpu"))


def main(model_dir: Path, out: Path) -> None:
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    train = TrainConfig(max_completion_length=WIDTH, learning_rate=1e-2, max_nonfinite_steps=3)
    method = NanOnProcessOne()
    model, _ = load_policy(model_dir)
    accounting = StepAccounting(ModelShape.of(model), torch.device("cpu"))
    actor = Actor(method, train, accounting, None, lambda name, value: None, ())
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.learning_rate)
    skippable_step(optimizer, actor)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "gradient_clipping": train.max_grad_norm, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 2000,
                                    "stage3_max_live_parameters": 1, "stage3_prefetch_bucket_size": 0,
                                    "stage3_max_reuse_distance": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    actor.processes = EngineProcesses(engine)
    partitions = engine.optimizer.fp32_partitioned_groups_flat
    moved, error = [], None
    try:
        for step in range(STEPS):
            ctx = StepContext(step=step, process_index=rank, max_completion_length=WIDTH)
            before = [p.detach().clone() for p in partitions]
            loss = actor.policy_loss(engine, step_inputs(method, rank, step, ctx), ctx)
            engine.backward(loss)
            engine.step()
            moved.append([not torch.equal(p, b) for p, b in zip(partitions, before, strict=True)])
    except Exception as raised:  # recorded: the test reads what each process raised
        error = f"{type(raised).__name__}: {raised}"
    record = {"moved": moved, "sub_groups": len(partitions), "nonfinite_steps": actor.nonfinite_steps,
              "error": error}
    (out / f"process-{rank}.json").write_text(json.dumps(record))
    # a process group left to the interpreter's exit after a raised step may abort there (a non-zero exit code)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
