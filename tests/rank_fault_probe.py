"""A job for tests/test_rank_faults.py, run on 2 processes by torch.distributed.run: a few steps of
``TargetedGRPOTrainer`` (DDP over gloo) with a fault on process 1 only, ``SCENARIO`` one of:

- ``nan_once``: the uniform method's token weights are NaN on process 1 in step 1 (of 3); 3 non-finite steps allowed;
- ``nan_stop``: NaN weights on process 1 in every step; 1 non-finite step allowed (the second one stops the run);
- ``no_rollout``: process 1 keeps no rollout in step 1;
- ``empty_mini_batch``: two mini-batches of one group each per process; process 1 drops its first group in step 0.

Each process records the digest of its weights after every optimizer step, the error its training raised (type and
message; caught) and its count of non-finite steps, then all processes exchange their records (a collective: a
process left behind in another collective hangs there, and the test's timeout tells) and each writes
OUT/process-<rank>.json.

Usage: python -m torch.distributed.run --nproc-per-node=2 tests/rank_fault_probe.py MODEL_DIR OUT SCENARIO
"""

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from transformers import TrainerCallback

from harness.config.schema import PresetConfig
from harness.model.checkpoints import load_policy
from harness.train.trl.settings import grpo_config
from harness.train.trl.trainer import TargetedGRPOTrainer
from methods.uniform import Uniform

SEED = 0


class FaultOnProcessOne(Uniform):
    """The uniform baseline, with ``scenario``'s fault on process 1 (a method whose arithmetic or selection broke
    there only)."""

    def __init__(self, scenario: str):
        super().__init__()
        self.scenario = scenario

    def on_rollouts(self, batch, ctx):
        batch = super().on_rollouts(batch, ctx)
        if ctx.process_index != 1:
            return batch
        if self.scenario == "no_rollout" and ctx.step == 1:
            return batch.replace(keep=torch.zeros_like(batch.keep))
        if self.scenario == "empty_mini_batch" and ctx.step == 0:
            return batch.replace(keep=batch.group_ids != batch.group_ids.min())  # the first of its 2 groups
        return batch

    def token_weights(self, stats, batch, ctx):
        result = super().token_weights(stats, batch, ctx)
        faulty = ctx.process_index == 1 and (self.scenario == "nan_stop" or
                                             (self.scenario == "nan_once" and ctx.step == 1))
        return dataclasses.replace(result, weights=result.weights * float("nan")) if faulty else result


class WeightDigests(TrainerCallback):
    """The sha256 of the model's weights after each optimizer step."""

    def __init__(self, model):
        self.model, self.digests = model, []

    def on_step_end(self, args, state, control, **kwargs):
        digest = hashlib.sha256()
        for tensor in self.model.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        self.digests.append(digest.hexdigest())


def odd_length_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]  # rewards that differ within a group: real gradients


def trainer_for(scenario: str, model_dir: Path, out: Path) -> TargetedGRPOTrainer:
    preset = PresetConfig(name="probe")
    train = preset.train
    train.num_generations, train.max_completion_length, train.learning_rate = 4, 8, 1e-2
    train.budget.kind, train.budget.amount = "steps", 3
    train.max_nonfinite_steps = 1 if scenario == "nan_stop" else 3
    if scenario == "empty_mini_batch":  # 2 groups per process, one per mini-batch
        train.prompts_per_step, train.mini_batches, train.budget.amount = 4, 2, 2
    else:
        train.prompts_per_step, train.mini_batches = 2, 1
    model, tokenizer = load_policy(model_dir)
    prompts = Dataset.from_list([{"prompt": f"Q: {i}+{i % 3}\n"} for i in range(16)])
    trainer = TargetedGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[odd_length_reward],
                                  args=grpo_config(preset, out / "trainer", seed=SEED), train_dataset=prompts,
                                  method=FaultOnProcessOne(scenario), preset=preset, run_seed=SEED)
    return trainer


def main(model_dir: Path, out: Path, scenario: str) -> None:
    trainer = trainer_for(scenario, model_dir, out)
    digests = WeightDigests(trainer.accelerator.unwrap_model(trainer.model))
    trainer.add_callback(digests)
    error = None
    try:
        trainer.train()
    except Exception as raised:  # recorded: the test compares what each process raised
        error = {"type": type(raised).__name__, "message": str(raised)}
    record = {"digests": digests.digests, "error": error, "nonfinite_steps": trainer.actor.nonfinite_steps}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, record)  # both processes are still in step after what they raised
    (out / f"process-{dist.get_rank()}.json").write_text(json.dumps(record))
    # a process group left to the interpreter's exit after a raised step may abort there (a non-zero exit code)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
