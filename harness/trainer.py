"""The TRL adapter: the only module that imports TRL (pinned: trl==1.16.0; its private methods change).

``TargetedGRPOTrainer`` keeps TRL's rollout generation, reward calls, optimizer, scheduler and logging, and owns
two steps:

- ``_generate_and_score_completions``: after TRL has generated and scored, the harness computes the baseline's
  advantages from the raw rewards and runs ``harness.hooks.prepare_batch`` (method hooks ``on_rollouts`` and
  ``before_forward``). Dropped rollouts and truncated columns are removed from the batch here, *before* any
  forward pass, so what a method skips is really skipped.
- ``_compute_loss``: token statistics from the last hidden states in chunks (``harness.tokenstats``), the method's
  weights and denominator (``harness.hooks.weigh_tokens``), and the clipped surrogate
  ``l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``; loss = sum(w l) / D (+ beta * KL over all tokens).

TRL is configured so that it computes no old-policy or reference log-probs itself (one optimizer step per
generation batch, TRL's own beta = 0): with a single pass over each batch pi_old = pi_theta, and the reference
forward (beta > 0) runs here on the reduced batch. Contract tests (tests/test_trainer_contract.py) pin the TRL
internals this relies on.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from harness.config import PresetConfig
from harness.hooks import PreparedBatch, new_rollout_batch, prepare_batch, weigh_tokens
from harness.scoring import score_batch
from harness.tokenstats import model_token_statistics
from methods.base import Method, RolloutBatch, StepContext, TokenStats, aggregation_weights, group_advantages

BATCH_PREFIX = "tt_"  # keys this adapter adds to TRL's batch dict; TRL shuffles them with the other rows


def reward_function(scorer: str, timeout_s: float):
    """A TRL reward function: 1.0 when the completion's final answer equals the row's ``answer``, else 0.0."""

    def correctness(prompts, completions, answer, **kwargs) -> list[float]:
        return [float(s.correct) for s in score_batch(list(completions), list(answer), scorer, timeout_s)]

    correctness.__name__ = f"correct_{scorer}"
    return correctness


def grpo_config(preset: PresetConfig, out_dir: Path, seed: int, max_steps: int) -> GRPOConfig:
    """TRL settings derived from the preset. TRL's loss switches are inert: ``_compute_loss`` is ours."""
    train = preset.train
    return GRPOConfig(
        output_dir=str(out_dir / "trl"),
        per_device_train_batch_size=train.prompts_per_step * train.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=train.num_generations,
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
        top_p=train.top_p,
        learning_rate=train.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=train.warmup_steps,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        beta=0.0,  # the reference forward, when train.beta > 0, runs in this adapter on the reduced batch
        epsilon=train.clip_eps_low,
        epsilon_high=train.clip_eps_high,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available() and preset.model.dtype == "bfloat16",
        log_completions=False,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        vllm_importance_sampling_correction=False,
    )


@dataclass
class StepCounters:
    """Work done per step, summed over the run (tokens generated, forwarded, carrying a non-zero weight)."""

    generated_tokens: int = 0
    forwarded_tokens: int = 0
    weighted_tokens: int = 0
    rollouts_generated: int = 0
    rollouts_trained: int = 0
    per_step: dict[str, float] = field(default_factory=dict)


class TargetedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage, rollout selection, truncation and loss come from a ``Method``."""

    def __init__(self, *args, method: Method, preset: PresetConfig, run_seed: int,
                 sample_batch_path: Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sample_batch_path = sample_batch_path
        self.method = method
        self.preset = preset
        self.run_seed = run_seed
        self.counters = StepCounters()
        tokenizer = self.processing_class
        self.special_token_ids = tuple(sorted({i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id)
                                               if i is not None}))
        self.ref_policy = None
        if preset.train.beta > 0 or "ref_logp" in method.needs:
            self.ref_policy = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval().requires_grad_(False)

    # --- context -------------------------------------------------------------------------------------------------

    def step_context(self) -> StepContext:
        train = self.preset.train
        progress = min(1.0, self.state.global_step / max(1, self.state.max_steps))
        return StepContext(progress=progress, step=self.state.global_step, seed=self.run_seed,
                           clip_eps_low=train.clip_eps_low, clip_eps_high=train.clip_eps_high, beta=train.beta,
                           aggregation=train.aggregation, max_completion_length=train.max_completion_length)

    # --- rollouts: advantages, selection, truncation (before any forward pass) ---------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func  # (N_all_processes, n_funcs), gathered by TRL
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        device = out["completion_ids"].device
        rewards_all = torch.nan_to_num(self._gathered_rewards.sum(dim=1).cpu(), nan=0.0)
        group_all = torch.arange(len(rewards_all)) // self.num_generations
        advantages_all = group_advantages(rewards_all, group_all, scale=self.preset.train.scale_rewards)
        n_local = out["completion_ids"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        batch = new_rollout_batch(out["completion_ids"].cpu(), out["completion_mask"].cpu(), rewards_all[local],
                                  group_all[local], self.preset.train.scale_rewards, self.special_token_ids,
                                  rollout_advantages=advantages_all[local])
        if self.sample_batch_path is not None and self.state.global_step == 0:
            self._write_sample_batch(out, batch)
        prepared = prepare_batch(self.method, batch, self.step_context())
        if len(prepared.rows) == 0 or prepared.length == 0:
            raise RuntimeError(f"method {self.method.name!r} kept no rollout or no token in step "
                               f"{self.state.global_step}; a method must keep at least one token")
        self._count_rollouts(out, prepared)
        return self._reduced_batch(out, prepared, device)

    @torch.no_grad()
    def _write_sample_batch(self, out: dict, batch: RolloutBatch) -> None:
        """The first generation batch in the ``harness inspect`` format, with token strings: the report colours
        what each method selects on these same rollouts. A diagnostic forward outside the budget."""
        from harness.datafiles import write_json_atomic

        input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        train = self.preset.train
        stats = model_token_statistics(self.model, input_ids, attention_mask, out["completion_ids"].shape[1],
                                       ("entropy", "sum_p2"), train.temperature, train.stats_chunk_size)
        tokenizer = self.processing_class
        write_json_atomic(self.sample_batch_path, {
            "completion_ids": batch.completion_ids.tolist(), "completion_mask": batch.completion_mask.int().tolist(),
            "rewards": batch.rewards.tolist(), "group_ids": batch.group_ids.tolist(),
            "logp": stats["logp"].cpu().tolist(), "entropy": stats["entropy"].cpu().tolist(),
            "sum_p2": stats["sum_p2"].cpu().tolist(), "progress": 0.0, "seed": self.run_seed,
            "special_token_ids": list(self.special_token_ids), "aggregation": train.aggregation,
            "scale_rewards": train.scale_rewards, "clip_eps_low": train.clip_eps_low,
            "clip_eps_high": train.clip_eps_high, "max_completion_length": train.max_completion_length,
            "prompts": tokenizer.batch_decode(out["prompt_ids"], skip_special_tokens=True),
            "completion_tokens": [tokenizer.convert_ids_to_tokens(row) for row in batch.completion_ids.tolist()],
        }, indent=None)

    def _reduced_batch(self, out: dict, prepared: PreparedBatch, device) -> dict:
        rows, length = prepared.rows.to(device), prepared.length
        kept = prepared.batch
        reduced = {
            "prompt_ids": out["prompt_ids"][rows],
            "prompt_mask": out["prompt_mask"][rows],
            "completion_ids": out["completion_ids"][rows, :length],
            "completion_mask": kept.completion_mask.to(device=device, dtype=out["completion_mask"].dtype),
            "advantages": kept.advantages.to(device),
            "num_items_in_batch": kept.completion_mask.sum().to(device),
            f"{BATCH_PREFIX}rewards": kept.rewards.to(device),
            f"{BATCH_PREFIX}group_ids": kept.group_ids.to(device),
            f"{BATCH_PREFIX}rollout_advantages": kept.rollout_advantages.to(device),
        }
        for name, value in kept.extras.items():
            reduced[f"{BATCH_PREFIX}extra_{name}"] = value.to(device)
        return reduced

    def _count_rollouts(self, out: dict, prepared: PreparedBatch) -> None:
        c = self.counters
        generated = int(out["completion_mask"].sum())
        forwarded = int(out["prompt_mask"][prepared.rows.to(out["prompt_mask"].device)].sum()
                        + prepared.batch.completion_mask.sum())
        c.generated_tokens += generated
        c.forwarded_tokens += forwarded
        c.rollouts_generated += out["completion_ids"].shape[0]
        c.rollouts_trained += len(prepared.rows)
        c.per_step = {"tokens/generated": generated, "tokens/forwarded": forwarded,
                      "rollouts/kept_frac": len(prepared.rows) / out["completion_ids"].shape[0]}

    # --- loss ---------------------------------------------------------------------------------------------------

    def _rollout_batch_from_inputs(self, inputs: dict) -> RolloutBatch:
        extras = {k.removeprefix(f"{BATCH_PREFIX}extra_"): v for k, v in inputs.items()
                  if k.startswith(f"{BATCH_PREFIX}extra_")}
        mask = inputs["completion_mask"].float()
        return RolloutBatch(
            completion_ids=inputs["completion_ids"], completion_mask=mask,
            rewards=inputs[f"{BATCH_PREFIX}rewards"], group_ids=inputs[f"{BATCH_PREFIX}group_ids"],
            rollout_advantages=inputs[f"{BATCH_PREFIX}rollout_advantages"], advantages=inputs["advantages"],
            keep=torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device),
            special_token_ids=self.special_token_ids, extras=extras)

    def _token_stats(self, model, inputs: dict) -> TokenStats:
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = inputs["completion_ids"].shape[1]
        train = self.preset.train
        extras = tuple(sorted(({"entropy"} | set(self.method.needs)) & {"entropy", "sum_p2"}))
        stats = model_token_statistics(model, input_ids, attention_mask, logits_to_keep, extras,
                                       train.temperature, train.stats_chunk_size)
        ref_logp = None
        if self.ref_policy is not None:
            with torch.no_grad():
                ref_logp = model_token_statistics(self.ref_policy, input_ids, attention_mask, logits_to_keep, (),
                                                  train.temperature, train.stats_chunk_size)["logp"]
        return TokenStats(logp=stats["logp"], old_logp=stats["logp"].detach(), entropy=stats.get("entropy"),
                          sum_p2=stats.get("sum_p2"), ref_logp=ref_logp)

    def _compute_loss(self, model, inputs):
        started = time.perf_counter()
        ctx = self.step_context()
        batch = self._rollout_batch_from_inputs(inputs)
        stats = self._token_stats(model, inputs)
        result = weigh_tokens(self.method, stats, PreparedBatch(batch, rows=torch.arange(0), length=0), ctx)
        # l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        ratio = torch.exp(stats.logp - stats.old_logp)
        advantages = batch.advantages
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - ctx.clip_eps_low, 1 + ctx.clip_eps_high) * advantages
        per_token_loss = -torch.minimum(unclipped, clipped)
        loss = (result.weights * per_token_loss).sum() / result.denominator
        mask = batch.completion_mask
        if ctx.beta > 0:
            # k3 estimator of KL(pi_theta || pi_ref), over every completion token (not the method's selection)
            log_ratio_ref = stats.ref_logp - stats.logp
            kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
            base_weights, base_denominator = aggregation_weights(mask, ctx.aggregation, ctx.max_completion_length)
            loss = loss + ctx.beta * (base_weights * kl).sum() / base_denominator
            self._log_train("kl", float((kl.detach() * mask).sum() / mask.sum().clamp(min=1)))
        self._log_step_metrics(stats, result, ratio, advantages, mask, started)
        return loss  # one micro-batch per optimizer step (grpo_config): no accumulation scaling

    # --- metrics ------------------------------------------------------------------------------------------------

    def _log_train(self, name: str, value: float) -> None:
        self._metrics["train"][name].append(value)

    def _log_step_metrics(self, stats, result, ratio, advantages, mask, started: float) -> None:
        with torch.no_grad():
            n_tokens = mask.sum().clamp(min=1)
            clipped = ((ratio > 1 + self.preset.train.clip_eps_high) & (advantages > 0)) | (
                (ratio < 1 - self.preset.train.clip_eps_low) & (advantages < 0))
            weighted = (result.weights != 0) & (mask > 0)
            self._log_train("clip_ratio/region_mean", float((clipped * mask).sum() / n_tokens))
            self._log_train("tokens/weighted_frac", float(weighted.sum() / n_tokens))
            if stats.entropy is not None:
                self._log_train("entropy", float((stats.entropy * mask).sum() / n_tokens))
            self.counters.weighted_tokens += int(weighted.sum())
            for name, value in self.counters.per_step.items():
                self._log_train(name, float(value))
            for name, value in result.metrics.items():
                self._log_train(f"method/{name}", float(value))
            self._log_train("time/loss_s", time.perf_counter() - started)


class MetricsWriter(TrainerCallback):
    """Appends every log record (one per optimizer step) to ``metrics.jsonl`` and saves budget checkpoints."""

    def __init__(self, metrics_path: Path, checkpoint_dirs: dict[int, Path], tokenizer, counters: StepCounters):
        self.metrics_path = metrics_path
        self.checkpoint_dirs = checkpoint_dirs  # optimizer step -> directory
        self.tokenizer = tokenizer
        self.counters = counters
        self.started = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        import json

        if not logs or "loss" not in logs:
            return
        record = {"step": state.global_step, "elapsed_s": time.perf_counter() - self.started,
                  "tokens/generated_total": self.counters.generated_tokens,
                  "tokens/forwarded_total": self.counters.forwarded_tokens,
                  "tokens/weighted_total": self.counters.weighted_tokens}
        record.update({k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in logs.items()})
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from harness.models import save_policy

        target = self.checkpoint_dirs.get(state.global_step)
        if target is not None and model is not None:
            staging = target.with_name(target.name + ".partial")
            save_policy(model, self.tokenizer, staging)
            staging.rename(target)
