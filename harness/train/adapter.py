"""The TRL adapter: the only module that imports TRL (pinned: trl==1.16.0; its private methods change).

``TargetedGRPOTrainer`` keeps TRL's rollout generation, reward calls, optimizer, scheduler and logging, and owns
two steps:

- ``_generate_and_score_completions``: after TRL has generated and scored, the harness computes the baseline's
  advantages from the raw rewards and runs ``harness.train.hooks.prepare_batch`` (method hooks ``on_rollouts`` and
  ``before_forward``). Dropped rollouts and truncated columns are removed from the batch here, *before* any
  forward pass, so what a method skips is really skipped.
- ``_compute_loss``: token statistics from the last hidden states in chunks (``harness.train.token_statistics``), the
method's
  weights and denominator (``harness.train.hooks.weigh_tokens``), and the clipped surrogate
  ``l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``; loss = sum(w l) / D (+ beta * KL over all tokens).

TRL is configured so that it computes no old-policy or reference log-probs itself (one optimizer step per
generation batch, TRL's own beta = 0): with a single pass over each batch pi_old = pi_theta, and the reference
forward (beta > 0) runs here on the reduced batch. Contract tests (tests/test_trainer_contract.py) pin the TRL
internals this relies on.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer

from harness.config.schema import PresetConfig
from harness.data.scoring import score_batch
from harness.train.budget import BudgetLedger, ModelShape, PhaseClock, generation_flops, padded_forward_flops
from harness.train.hooks import PreparedBatch, new_rollout_batch, prepare_batch, weigh_tokens
from harness.train.token_statistics import model_token_statistics
from methods.base import Method, RolloutBatch, StepContext, TokenStats, aggregation_weights, group_advantages

BATCH_PREFIX = "tt_"  # keys this adapter adds to TRL's batch dict; TRL shuffles them with the other rows
LEDGER_FILE = "harness_budget.json"  # the budget ledger, saved in each resumable trainer checkpoint


class NonFiniteLossError(RuntimeError):
    """More steps with a NaN/inf loss than ``train.max_nonfinite_steps`` allows."""


def reward_function(scorer: str, timeout_s: float):
    """A TRL reward function: 1.0 when the completion's final answer equals the row's ``answer``, else 0.0."""

    def correctness(prompts, completions, answer, **kwargs) -> list[float]:
        return [float(s.correct) for s in score_batch(list(completions), list(answer), scorer, timeout_s)]

    correctness.__name__ = f"correct_{scorer}"
    return correctness


VLLM_PORT_ENV = ("HARNESS_VLLM_SERVER_PORT", "HARNESS_VLLM_GROUP_PORT")  # set by scripts/train-with-vllm-server.sh


def per_device_rollouts(train, world_size: int) -> int:
    """Rollouts per process and step: the step's ``prompts_per_step x num_generations`` split over the
    ``world_size`` processes of ``accelerate launch`` (1 without it), whole prompt groups on each process."""
    if train.prompts_per_step % world_size:
        raise ValueError(f"train.prompts_per_step={train.prompts_per_step} must be a multiple of the {world_size} "
                         "training processes (each process holds whole prompt groups)")
    return train.prompts_per_step // world_size * train.num_generations


def vllm_settings(train, env=None) -> dict:
    """GRPOConfig's vLLM fields from ``train.use_vllm`` / ``vllm_*``. Server mode reads the ports that
    scripts/train-with-vllm-server.sh chose (free ports, so several jobs can share a node)."""
    if not train.use_vllm:
        return {"use_vllm": False}
    out = {"use_vllm": True, "vllm_mode": train.vllm_mode,
           "vllm_max_model_length": train.vllm_max_model_length or None}
    if train.vllm_mode == "colocate":
        out.update(vllm_gpu_memory_utilization=train.vllm_gpu_memory_utilization,
                   vllm_tensor_parallel_size=train.vllm_tensor_parallel_size)
    else:
        env = os.environ if env is None else env
        out.update(vllm_server_host="127.0.0.1", vllm_server_port=int(env.get(VLLM_PORT_ENV[0], 8000)),
                   vllm_group_port=int(env.get(VLLM_PORT_ENV[1], 51216)),
                   vllm_server_timeout=1800.0)  # the server loads the model while the trainer starts
    return out


def grpo_config(preset: PresetConfig, out_dir: Path, seed: int) -> GRPOConfig:
    """TRL settings derived from the preset. TRL's loss switches are inert: ``_compute_loss`` is ours. The budget
    stops the run (``BudgetCallback``); ``max_steps`` is the budget for a steps budget, else a safety cap.

    vLLM (``train.use_vllm``): TRL generates with vLLM, colocated in each training process or on a server
    (``vllm_settings``). ``vllm_importance_sampling_correction`` stays off: TRL would then compute the sampler's
    log-probs and hand ``importance_sampling_ratio`` to the loss, but ``_compute_loss`` here never reads it, so the
    correction would cost a pass and change nothing. vLLM samples are therefore treated as on-policy, exactly as
    ``generate`` samples are; the small sampler/trainer log-prob mismatch of bf16 kernels is not corrected.
    """
    train = preset.train
    budget = train.budget
    max_steps = int(math.ceil(budget.amount)) if budget.kind == "steps" else budget.max_steps
    return GRPOConfig(
        output_dir=str(out_dir / "trl"),
        per_device_train_batch_size=per_device_rollouts(train, int(os.environ.get("WORLD_SIZE", "1"))),
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
        activation_checkpointing=train.activation_checkpointing,
        beta=0.0,  # the reference forward, when train.beta > 0, runs in this adapter on the reduced batch
        epsilon=train.clip_eps_low,
        epsilon_high=train.clip_eps_high,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="steps" if train.save_every_steps else "no",
        save_steps=train.save_every_steps or 500,
        save_only_model=False,
        save_total_limit=2,  # the newest checkpoint may be partial if a job is killed mid-save
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
        **vllm_settings(train),
    )


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy for the reference. GRPOTrainer replaces ``model.forward`` by a closure over the
    original model's forward; a deep copy would keep calling the policy through it, so the copy gets its class's
    own forward back."""
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    reference.__dict__.pop("forward", None)
    return reference


class TargetedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage, rollout selection, truncation and loss come from a ``Method``."""

    def __init__(self, *args, method: Method, preset: PresetConfig, run_seed: int,
                 sample_batch_path: Path | None = None, run_key: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.run_key = run_key  # identifies the configuration; a checkpoint of another one is never resumed
        self.sample_batch_path = sample_batch_path
        self.method = method
        self.preset = preset
        self.run_seed = run_seed
        self.ledger = BudgetLedger()  # totals of the whole run, over every process (identical on each)
        self.step_ledger = BudgetLedger()  # what this process counted in the current step
        self.saved_checkpoints: dict[str, dict] = {}  # budget checkpoint name -> step and spend when saved
        self.nonfinite_steps = 0
        self._skip_optimizer_step = False
        self.model_shape = ModelShape.of(self.accelerator.unwrap_model(self.model))
        self.clock = PhaseClock(self.accelerator.device)
        tokenizer = self.processing_class
        self.special_token_ids = tuple(sorted({i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id)
                                               if i is not None}))
        self.ref_policy = None
        if preset.train.beta > 0 or "ref_logp" in method.needs:
            self.ref_policy = frozen_copy(self.accelerator.unwrap_model(self.model))

    # --- context -------------------------------------------------------------------------------------------------

    def step_context(self) -> StepContext:
        train = self.preset.train
        progress = min(1.0, self.ledger.spent(train.budget.kind) / max(train.budget.amount, 1e-12))
        return StepContext(progress=progress, step=self.state.global_step, seed=self.run_seed,
                           clip_eps_low=train.clip_eps_low, clip_eps_high=train.clip_eps_high, beta=train.beta,
                           aggregation=train.aggregation, max_completion_length=train.max_completion_length)

    # --- rollouts: advantages, selection, truncation (before any forward pass) ---------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func  # (N_all_processes, n_funcs), gathered by TRL
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        started = self.clock.start()
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        self.clock.stop("generation", started)
        self._count_generation(out)
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
            self._write_sample_batch(out, batch)  # every process runs the forward (collectives under ZeRO-3/FSDP)
        prepared = prepare_batch(self.method, batch, self.step_context())
        if len(prepared.rows) == 0 or prepared.length == 0:
            raise RuntimeError(f"method {self.method.name!r} kept no rollout or no token in step "
                               f"{self.state.global_step}; a method must keep at least one token")
        self._log_train("rollouts/kept_frac", len(prepared.rows) / out["completion_ids"].shape[0])
        return self._reduced_batch(out, prepared, device)

    @torch.no_grad()
    def _write_sample_batch(self, out: dict, batch: RolloutBatch) -> None:
        """The first generation batch in the ``harness inspect`` format, with token strings: the report colours
        what each method selects on these same rollouts. A diagnostic forward outside the budget."""
        from harness.data.files import write_json_atomic

        input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        train = self.preset.train
        stats = model_token_statistics(self.model, input_ids, attention_mask, out["completion_ids"].shape[1],
                                       ("entropy", "sum_p2"), train.temperature, train.stats_chunk_size)
        if not self.accelerator.is_main_process:
            return
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

    def _count_generation(self, out: dict) -> None:
        prompt_lengths = out["prompt_mask"].sum(dim=1).tolist()
        completion_lengths = out["completion_mask"].sum(dim=1).tolist()
        ledger = self.step_ledger
        ledger.samples += len(prompt_lengths)
        ledger.prompt_tokens += int(sum(prompt_lengths))
        ledger.generated_tokens += int(sum(completion_lengths))
        ledger.flops["generation"] += generation_flops(self.model_shape, prompt_lengths, completion_lengths)

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

    def _row_chunks(self, inputs: dict, rows_per_chunk: int):
        """Rows sorted by length and cut into chunks, each trimmed to its own longest prompt and kept completion:
        what a method truncated (NAT) is not computed even when other rows of the batch are longer."""
        prompt_lengths = inputs["prompt_mask"].sum(dim=1)
        positions = torch.arange(1, inputs["completion_mask"].shape[1] + 1, device=prompt_lengths.device)
        completion_lengths = (inputs["completion_mask"] * positions).amax(dim=1).long().clamp(min=1)
        order = torch.argsort(prompt_lengths + completion_lengths, stable=True)
        for rows in order.split(rows_per_chunk):
            prompt_width, completion_width = int(prompt_lengths[rows].max()), int(completion_lengths[rows].max())
            prompt_cols = slice(inputs["prompt_ids"].shape[1] - prompt_width, None)  # prompts are left-padded
            input_ids = torch.cat([inputs["prompt_ids"][rows, prompt_cols],
                                   inputs["completion_ids"][rows, :completion_width]], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"][rows, prompt_cols],
                                        inputs["completion_mask"][rows, :completion_width]], dim=1)
            yield rows, input_ids, attention_mask, completion_width

    def _chunk_statistics(self, model, chunk, extras: tuple[str, ...], phase: str, backward: bool) -> dict:
        """Statistics (rows, width) of one row chunk; its FLOPs go to ``phase`` (x3 when a backward follows)."""
        rows, input_ids, attention_mask, width = chunk
        train = self.preset.train
        stats = model_token_statistics(model, input_ids, attention_mask, width, extras, train.temperature,
                                       train.stats_chunk_size)
        flops = padded_forward_flops(self.model_shape, len(rows), input_ids.shape[1], width)
        self.step_ledger.flops[phase] += flops * (3.0 if backward else 1.0)  # backward ~ 2x forward
        self.step_ledger.forwarded_positions += input_ids.numel()
        if backward:
            self.step_ledger.trained_positions += input_ids.numel()
        return stats

    def _chunked_statistics(self, model, inputs: dict, extras: tuple[str, ...], phase: str,
                            backward: bool) -> dict[str, torch.Tensor]:
        """Token statistics (B, T) assembled from the row chunks of ``train.forward_chunk_rows`` rows."""
        T = inputs["completion_ids"].shape[1]
        pieces, order = [], []
        for chunk in self._row_chunks(inputs, self.preset.train.forward_chunk_rows):
            stats = self._chunk_statistics(model, chunk, extras, phase, backward)
            pieces.append({k: torch.nn.functional.pad(v, (0, T - chunk[3])) for k, v in stats.items()})
            order.append(chunk[0])
        inverse = torch.argsort(torch.cat(order))
        return {k: torch.cat([p[k] for p in pieces])[inverse] for k in pieces[0]}

    def _token_stats(self, model, inputs: dict, backward: bool = True, reference: bool = True) -> TokenStats:
        extras = tuple(sorted(({"entropy"} | set(self.method.needs)) & {"entropy", "sum_p2"}))
        stats = self._chunked_statistics(model, inputs, extras, "train", backward)
        ref_logp = None
        if reference and self.ref_policy is not None:
            started = self.clock.start()
            with torch.no_grad():
                ref_logp = self._chunked_statistics(self.ref_policy, inputs, (), "reference", False)["logp"]
            self.clock.stop("reference", started)
        return TokenStats(logp=stats["logp"], old_logp=stats["logp"].detach(), entropy=stats.get("entropy"),
                          sum_p2=stats.get("sum_p2"), ref_logp=ref_logp)

    def _policy_loss(self, logp, ref_logp, advantages, mask, kl_weights, weights, denominator,
                     ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """sum(weights * clipped surrogate) / denominator, plus beta x the k3 KL over every completion token;
        and the KL summed over the ``mask`` tokens, for the log."""
        ratio = torch.exp(logp - logp.detach())  # one optimizer step per generation batch: pi_old = pi_theta
        # l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - ctx.clip_eps_low, 1 + ctx.clip_eps_high) * advantages
        loss = (weights * -torch.minimum(unclipped, clipped)).sum() / denominator
        kl_sum = torch.zeros((), device=logp.device)
        if ctx.beta > 0:
            # k3 estimator of KL(pi_theta || pi_ref), over every completion token (not the method's selection)
            log_ratio_ref = ref_logp - logp
            kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
            base_weights, base_denominator = kl_weights
            loss = loss + ctx.beta * (base_weights * kl).sum() / base_denominator
            kl_sum = (kl.detach() * mask).sum()
        return loss, kl_sum

    def _log_kl(self, kl_sum: torch.Tensor, mask: torch.Tensor, ctx: StepContext) -> None:
        if ctx.beta > 0:
            self._log_train("kl", float(kl_sum / mask.sum().clamp(min=1)))

    def _compute_loss(self, model, inputs):
        started = time.perf_counter()
        ctx = self.step_context()
        batch = self._rollout_batch_from_inputs(inputs)
        chunk_rows = self.preset.train.backward_chunk_rows
        if chunk_rows and batch.completion_mask.shape[0] > chunk_rows:
            return self._loss_in_backward_chunks(model, inputs, batch, ctx, chunk_rows, started)
        stats = self._token_stats(model, inputs)
        result = weigh_tokens(self.method, stats, PreparedBatch(batch, rows=torch.arange(0), length=0), ctx)
        mask = batch.completion_mask
        kl_weights = aggregation_weights(mask, ctx.aggregation, ctx.max_completion_length)
        loss, kl_sum = self._policy_loss(stats.logp, stats.ref_logp, batch.advantages, mask, kl_weights,
                                         result.weights, result.denominator, ctx)
        self._log_step_metrics(stats, result, batch.advantages, mask, ctx, started)
        self._log_kl(kl_sum, mask, ctx)
        if not torch.isfinite(loss.detach()):
            return self._skip_nonfinite_step(model, loss)
        return loss  # one micro-batch per optimizer step (grpo_config): no accumulation scaling

    def _loss_in_backward_chunks(self, model, inputs, batch: RolloutBatch, ctx: StepContext, chunk_rows: int,
                                 started: float):
        """The same loss and gradient with activations of only ``chunk_rows`` rows alive at a time: a no-grad
        forward over the whole batch gives the method its statistics and the token weights; then each row chunk
        runs forward + backward with its share of the loss (gradients accumulate, synchronised across processes
        only in the last backward, which the Trainer runs on the returned loss). Costs one more forward. The
        reference forward of the KL term runs per chunk, on the same shape as the policy's (a method that reads
        ref_logp in its weights gets it from the no-grad pass as well)."""
        with torch.no_grad():
            stats = self._token_stats(model, inputs, backward=False, reference="ref_logp" in self.method.needs)
        result = weigh_tokens(self.method, stats, PreparedBatch(batch, rows=torch.arange(0), length=0), ctx)
        mask = batch.completion_mask
        self._log_step_metrics(stats, result, batch.advantages, mask, ctx, started)
        base_weights, base_denominator = aggregation_weights(mask, ctx.aggregation, ctx.max_completion_length)
        weights = result.weights.detach()
        chunks = list(self._row_chunks(inputs, chunk_rows))
        done, kl_sum = torch.zeros((), device=mask.device), torch.zeros((), device=mask.device)
        for index, chunk in enumerate(chunks):
            rows, width = chunk[0], chunk[3]
            logp = self._chunk_statistics(model, chunk, (), "train", backward=True)["logp"]
            ref_logp = self._chunk_reference_logp(chunk) if ctx.beta > 0 else None
            loss, chunk_kl = self._policy_loss(logp, ref_logp, batch.advantages[rows, :width], mask[rows, :width],
                                               (base_weights[rows, :width], base_denominator),
                                               weights[rows, :width], result.denominator, ctx)
            kl_sum = kl_sum + chunk_kl
            if index == len(chunks) - 1:
                self._log_kl(kl_sum, mask, ctx)
                total = loss + done  # the value of the whole loss; the gradient of the last chunk
                if not torch.isfinite(total.detach()):
                    return self._skip_nonfinite_step(model, total)
                return total
            with self._gradients_accumulate(model):
                self.accelerator.backward(loss)
            done = done + loss.detach()

    def _chunk_reference_logp(self, chunk) -> torch.Tensor:
        started = self.clock.start()
        with torch.no_grad():
            ref_logp = self._chunk_statistics(self.ref_policy, chunk, (), "reference", backward=False)["logp"]
        self.clock.stop("reference", started)
        return ref_logp

    @contextmanager
    def _gradients_accumulate(self, model):
        """A backward that adds to the gradients without synchronising them (DDP/FSDP no_sync) and without an
        optimizer step (DeepSpeed steps in every backward at a gradient-accumulation boundary)."""
        gradient_state = self.accelerator.gradient_state
        sync = gradient_state.sync_gradients
        gradient_state._set_sync_gradients(False)
        try:
            with self.accelerator.no_sync(model):
                yield
        finally:
            gradient_state._set_sync_gradients(sync)

    # --- non-finite losses: skip the step, count it, stop past the limit ------------------------------------------

    def _skip_nonfinite_step(self, model, loss: torch.Tensor) -> torch.Tensor:
        self.nonfinite_steps += 1
        self._log_train("nonfinite/skipped_total", float(self.nonfinite_steps))
        limit = self.preset.train.max_nonfinite_steps
        if self.nonfinite_steps > limit:
            raise NonFiniteLossError(
                f"method {self.method.name!r}: the loss was {float(loss)} in {self.nonfinite_steps} steps (last at "
                f"step {self.state.global_step + 1}), more than train.max_nonfinite_steps={limit}; stopping")
        self._skip_optimizer_step = True
        # a zero loss on the graph: backward gives zero gradients, and the optimizer step is skipped entirely
        return sum((p * 0.0).sum() for p in model.parameters() if p.requires_grad)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        step = optimizer.step

        def step_unless_skipped(*args, **kwargs):
            if self._skip_optimizer_step:  # Adam's moments would still move the weights on zero gradients
                self._skip_optimizer_step = False
                return None
            return step(*args, **kwargs)

        optimizer.step = step_unless_skipped
        return optimizer

    # --- budget: one all-reduce per step ------------------------------------------------------------------------

    def close_step_accounting(self, seconds: dict[str, float], step_seconds: float) -> None:
        """Adds this step's counts, summed over the processes, to the run's totals: every process then holds the
        same totals and takes the same stop decision; seconds become accelerator-seconds (summed over devices)."""
        local = self.step_ledger
        local.step_seconds += step_seconds
        local.seconds["generation"] += seconds.get("generation", 0.0)
        local.seconds["reference"] += seconds.get("reference", 0.0)
        local.seconds["train"] += step_seconds - seconds.get("generation", 0.0) - seconds.get("reference", 0.0)
        counts = torch.tensor(local.counters(), dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        self.ledger.add_counters(counts.cpu().tolist())
        self.ledger.steps += 1
        self.step_ledger = BudgetLedger()

    def max_over_processes(self, value: int) -> int:
        """The largest of one number over the processes (peak memory: the busiest device)."""
        if self.accelerator.num_processes == 1:
            return value
        values = self.accelerator.gather(torch.tensor([value], dtype=torch.int64, device=self.accelerator.device))
        return int(values.max())

    # --- resumable checkpoints ----------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        """TRL/transformers save weights, optimizer, scheduler, RNG and trainer state; the ledger goes beside them,
        so a resumed run continues the budget count."""
        super()._save_checkpoint(model, trial)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        from harness.data.files import write_json_atomic

        write_json_atomic(folder / LEDGER_FILE, {"ledger": self.ledger.to_dict(), "run_key": self.run_key,
                                                 "saved_checkpoints": self.saved_checkpoints})

    def restore_ledger(self, checkpoint: Path) -> None:
        saved = json.loads((checkpoint / LEDGER_FILE).read_text())
        self.ledger = BudgetLedger.from_dict(saved["ledger"])
        self.saved_checkpoints = saved["saved_checkpoints"]

    # --- metrics ------------------------------------------------------------------------------------------------

    def _log_train(self, name: str, value: float) -> None:
        self._metrics["train"][name].append(value)

    def _log_step_metrics(self, stats: TokenStats, result, advantages, mask, ctx: StepContext, started: float) -> None:
        with torch.no_grad():
            n_tokens = mask.sum().clamp(min=1)
            ratio = torch.exp(stats.logp.detach() - stats.old_logp)  # 1 with one optimizer step per batch
            clipped = ((ratio > 1 + ctx.clip_eps_high) & (advantages > 0)) | (
                (ratio < 1 - ctx.clip_eps_low) & (advantages < 0))
            weighted = (result.weights != 0) & (mask > 0)
            self._log_train("clip_ratio/region_mean", float((clipped * mask).sum() / n_tokens))
            self._log_train("tokens/weighted_frac", float(weighted.sum() / n_tokens))
            if stats.entropy is not None:
                self._log_train("entropy", float((stats.entropy * mask).sum() / n_tokens))
            self.step_ledger.weighted_tokens += int(weighted.sum())
            for name, value in result.metrics.items():
                self._log_train(f"method/{name}", float(value))
            self._log_train("time/loss_s", time.perf_counter() - started)


class BudgetCallback(TrainerCallback):
    """Closes each step's accounting, saves the model at budget fractions, stops once the budget is spent, and
    appends every log record (one per optimizer step) to ``metrics.jsonl``."""

    def __init__(self, trainer: TargetedGRPOTrainer, checkpoint_dirs: dict[float, Path], metrics_path: Path):
        self.trainer = trainer
        self.checkpoint_dirs = dict(sorted(checkpoint_dirs.items()))  # budget fraction -> directory
        self.metrics_path = metrics_path
        self._step_started = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = self.trainer.clock.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        trainer, ledger = self.trainer, self.trainer.ledger
        trainer.clock.stop("step", self._step_started)
        seconds = trainer.clock.collect()
        trainer.close_step_accounting(seconds, seconds.pop("step", 0.0))
        budget = trainer.preset.train.budget
        spent = ledger.spent(budget.kind)
        for fraction, directory in self.checkpoint_dirs.items():
            if directory.name not in trainer.saved_checkpoints and spent >= fraction * budget.amount * (1 - 1e-9):
                self._save_model(model, directory)
                trainer.saved_checkpoints[directory.name] = {"fraction": fraction, "step": state.global_step,
                                                             "spent": spent, **ledger.summary()}
        if spent >= budget.amount * (1 - 1e-9):
            control.should_training_stop = True

    def _save_model(self, model, directory: Path) -> None:
        """Every process takes part in gathering the full weights (ZeRO-3 and FSDP shard them); the main process
        writes them; the others wait until the folder exists."""
        from harness.model.policy import save_policy

        trainer = self.trainer
        accelerator = trainer.accelerator
        state_dict = accelerator.get_state_dict(trainer.deepspeed if trainer.is_deepspeed_enabled else model)
        if accelerator.is_main_process:
            staging = directory.with_name(directory.name + ".partial")
            save_policy(accelerator.unwrap_model(model), trainer.processing_class, staging, state_dict)
            staging.rename(directory)
        accelerator.wait_for_everyone()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        record = {"step": state.global_step, **self.trainer.ledger.summary()}
        record.update({k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in logs.items()})
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
