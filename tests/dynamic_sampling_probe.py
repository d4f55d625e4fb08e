"""A job for tests/test_distributed.py, run on 2 processes by torch.distributed.run: one dynamically sampled step of
``TargetedGRPOTrainer`` on prompts whose signal their answer fixes ("mixed": rewards 0, 1, 0, ... over a group's
rollouts; "none": all 0). The answers are placed so that the prompt stream's first rounds hold groups with signal at
positions ``SIGNAL_POSITIONS``: unevenly spread over the processes. Each process writes to OUT/process-<rank>.json
the prompts and answers of its share of every round, the prompts of the rows it trained, and its logged metrics.

Usage: python -m torch.distributed.run --nproc-per-node=2 tests/dynamic_sampling_probe.py MODEL_DIR OUT
"""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from harness.config.schema import PresetConfig
from harness.model.checkpoints import load_policy
from harness.train.dynamic_sampling import PromptStream
from harness.train.trl.settings import grpo_config
from harness.train.trl.trainer import TargetedGRPOTrainer
from methods.registry import get_method_class

PROMPTS, ROUND, SEED = 16, 4, 0
# rounds of 4 prompts over 2 processes: round 1 = stream positions 0-3 (process 0: 0, 1; process 1: 2, 3), round 2 =
# positions 4-7 (process 0: 4, 5). With signal: 0, 1, 2 and 4, so 4 groups over both processes after round 2, when
# process 1 alone holds 1 of its 2
SIGNAL_POSITIONS = (0, 1, 2, 4)


def mixed_reward(completions, answer, **kwargs):
    return [float(j % 2) if a == "mixed" else 0.0 for j, a in enumerate(answer)]


def dataset() -> Dataset:
    order = PromptStream(PROMPTS, SEED).take(PROMPTS)
    answers = ["none"] * PROMPTS
    for position in SIGNAL_POSITIONS:
        answers[order[position]] = "mixed"
    return Dataset.from_list([{"prompt": f"Q: {i}+{i % 3}\n", "answer": answers[i]} for i in range(PROMPTS)])


def main(model_dir: Path, out: Path) -> None:
    preset = PresetConfig(name="probe")
    train = preset.train
    train.prompts_per_step, train.num_generations, train.max_completion_length = 4, 2, 6
    train.budget.kind, train.budget.amount = "samples", 1e9
    train.dynamic_sampling.enabled, train.dynamic_sampling.prompts_per_round = True, ROUND
    model, tokenizer = load_policy(model_dir)
    trainer = TargetedGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[mixed_reward],
                                  args=grpo_config(preset, out / "trainer", seed=SEED), train_dataset=dataset(),
                                  method=get_method_class("uniform")(), preset=preset, run_seed=SEED)
    trainer.args.max_steps = 1
    rounds, trained = [], []
    generate, compute_loss = trainer._generate_round, trainer._compute_loss

    def recording_round(inputs):
        rounds.append([[x["prompt"], x["answer"]] for x in inputs[::train.num_generations]])
        return generate(inputs)

    def recording_loss(model, inputs):
        rows = zip(inputs.prompt_ids.tolist(), inputs.prompt_mask.tolist(), strict=True)
        trained.extend(tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) for ids, mask in rows)
        return compute_loss(model, inputs)

    trainer._generate_round, trainer._compute_loss = recording_round, recording_loss
    trainer.train()
    metrics = next(r for r in trainer.state.log_history if "dynamic_sampling/rounds" in r)
    (out / f"process-{trainer.accelerator.process_index}.json").write_text(
        json.dumps({"rounds": rounds, "trained": trained, "metrics": metrics}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
