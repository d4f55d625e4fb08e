"""What bench/ observes of TRL, outside a run: TRL's own GRPOTrainer with a run's settings, the sampling settings
of a trainer, a step's loss inputs, per-phase timings of a trainer, and TRL's fused LM head."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch
from trl import GRPOTrainer

from harness.config.paths import SweepPaths
from harness.config.schema import PresetConfig, Resolved
from harness.train.hooks import new_rollout_batch, prepare_batch
from harness.train.step_batch import StepBatch
from harness.train.trl.settings import grpo_config
from harness.train.trl.trainer import TargetedGRPOTrainer
from methods.base import StepContext


def plain_grpo_trainer(model, tokenizer, train_dataset, reward_funcs: list, preset: PresetConfig, out_dir: Path,
                       seed: int) -> GRPOTrainer:
    """TRL's own GRPOTrainer with the settings of a harness run (``grpo_config``: generation, batch, optimizer), the
    run's reward functions, TRL's DAPO loss and no KL term: the reference a harness step is timed against."""
    args = grpo_config(preset, out_dir, seed)
    args.loss_type, args.beta = "dapo", 0.0
    return GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=train_dataset,
                       reward_funcs=reward_funcs, args=args)


def sampling_settings(trainer: GRPOTrainer) -> tuple:
    """(GenerationConfig, EOS token ids): what TRL samples rollouts with on the transformers ``generate`` path (no
    vLLM), and the ids that end a completion (the mask covers the tokens up to and including the first of them)."""
    if trainer.use_vllm:
        raise ValueError("sampling_settings: this trainer generates with vLLM, not transformers generate")
    return trainer.generation_config, list(trainer.eos_token_ids)


def loss_inputs(trainer: TargetedGRPOTrainer, rollouts: dict, ctx: StepContext) -> StepBatch:
    """The loss inputs of a generated and scored batch, built as in a training step: the baseline's advantages,
    the method's hooks (``trainer.method``) under ``ctx``, dropped rollouts and truncated columns removed.

    ``rollouts``: prompt_ids / prompt_mask (B, P) left-padded, completion_ids / completion_mask (B, T), rewards (B,),
    group_ids (B,). ``trainer.compute_loss(trainer.model, inputs)`` then runs the training forward."""
    train = trainer.preset.train
    batch = new_rollout_batch(rollouts["completion_ids"], rollouts["completion_mask"], rollouts["rewards"],
                              rollouts["group_ids"], train.scale_rewards, trainer.special_token_ids)
    prepared = prepare_batch(trainer.method, batch, ctx)
    out = {k: rollouts[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    kept = StepBatch.kept(out, prepared, rollouts["completion_ids"].device)
    return trainer.actor.before_updates(trainer.model, kept, trainer.step_context())


class PhaseProbe:
    """Wall and process-CPU seconds a trainer (ours or TRL's own) spends per phase, summed until ``reset``:
    ``generation`` (TRL's generate and reward scoring; for ours also the advantages and the method's hooks) and
    ``loss_forward`` (the loss with its forward pass; the backward runs after it). Also the completion lengths and
    a digest of the completion ids of the last generation batch: two trainers that sampled the same rollouts have
    the same digest. The trainer's own methods are wrapped on this instance only; what they compute is unchanged."""

    PHASES = {"generation": "_generate_and_score_completions", "loss_forward": "_compute_loss"}

    def __init__(self, trainer: GRPOTrainer):
        self.reset()
        for phase, name in self.PHASES.items():
            setattr(trainer, name, self._timed(getattr(trainer, name), phase))
        rewards = trainer._calculate_rewards

        def calculate_rewards(inputs, prompts, completions, completion_ids_list):
            self.completion_lengths = [len(c) for c in completion_ids_list]
            ids_digest = hashlib.sha1(repr(completion_ids_list).encode()).hexdigest()
            self.rollouts_digest = hashlib.sha1(ids_digest.encode()).hexdigest()[:12]
            return rewards(inputs, prompts, completions, completion_ids_list)

        trainer._calculate_rewards = calculate_rewards

    def reset(self) -> None:
        self.seconds = {phase: {"wall": 0.0, "cpu": 0.0} for phase in self.PHASES}
        self.completion_lengths: list[int] = []
        self.rollouts_digest = ""

    def _timed(self, inner, phase: str):
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            out = inner(*args, **kwargs)
            self.seconds[phase]["wall"] += time.perf_counter() - wall
            self.seconds[phase]["cpu"] += time.process_time() - cpu
            return out

        return timed


def trl_fused_log_probs(hidden: torch.Tensor, lm_head_weight: torch.Tensor, targets: torch.Tensor,
                        vocab_chunk: int) -> torch.Tensor:
    """Log-probs (N,) of ``targets`` (N,) from hidden states (N, H) through TRL 1.16's fused LM head, with entropy
    computed alongside as GRPOTrainer asks it to: tiles of 4096 positions x ``vocab_chunk`` vocabulary columns, an
    online logsumexp, fp32 gradients accumulated in place in backward. The reference the harness's chunked token
    statistics are measured against (bench/tokenstats_memory.py)."""
    from trl.kernels import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(hidden, lm_head_weight, None, targets, 1.0, vocab_chunk, None, 1.0,
                                        ("log_probs", "entropy"))[0]


def build_plain_trainer(resolved: Resolved, paths: SweepPaths, seed: int, run_dir: Path):
    """TRL's own ``GRPOTrainer`` on what ``build_trainer`` gives a run of seed ``seed``: the warm start, the prompts
    in the same order, the reward and TRL's settings (``plain_grpo_trainer``:
    DAPO loss, no KL). No budget: it stops at ``args.max_steps``. The reference a harness step is timed against in
    bench/."""
    from transformers import set_seed

    from harness.config.kernels import apply_cpu_kernels
    from harness.model.checkpoints import load_policy
    from harness.train.run import reward_functions, training_dataset

    preset = resolved.preset
    apply_cpu_kernels(preset.cpu_kernels)
    torch.set_num_threads(preset.train.threads)
    set_seed(seed)
    model, tokenizer = load_policy(paths.warmstart_dir, preset.train.master_dtype)
    dataset = training_dataset(resolved, paths, tokenizer, seed)
    return plain_grpo_trainer(model, tokenizer, dataset, reward_functions(preset), preset, run_dir, seed)


def train_steps(trainer, steps: int, data_seed: int) -> None:
    """``steps`` more optimizer steps of ``trainer`` from its current weights and optimizer state, on the prompts
    that ``data_seed`` draws: ``Trainer.train()`` again with a fresh step count (``max_steps = steps``) and a fresh
    learning-rate schedule. For benchmarks; a run trains once, in ``harness.train.run.run_training``."""
    trainer.args.seed = trainer.args.data_seed = data_seed
    trainer.args.max_steps = steps
    trainer.train()


def set_budget_progress(trainer, fraction: float) -> None:
    """Put a trainer whose budget counts steps at ``fraction`` of its budget: the ``StepContext.progress`` that
    schedules read (D3S) is then ``fraction`` (plus one step per step taken), as at that point of a run."""
    budget = trainer.preset.train.budget
    if budget.kind != "steps":
        raise ValueError(f"set_budget_progress needs train.budget.kind=steps, not {budget.kind!r}")
    trainer.ledger.steps = round(fraction * budget.amount)
