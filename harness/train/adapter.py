"""The TRL adapter: the only module that imports TRL (pinned: trl==1.16.0; its private methods change).

``TargetedGRPOTrainer`` keeps TRL's rollout generation, reward calls, optimizer, scheduler and logging, and
overrides two steps (plus ``_generate_single_turn``, whose transformers ``generate`` call it decodes with
harness/model/decode.py, the same rollouts with less Python per step, unless ``train.fast_decode`` is false):

- ``_generate_and_score_completions``: after TRL has generated and scored, the harness computes the baseline's
  advantages from the raw rewards and runs ``harness.train.hooks.prepare_batch`` (method hooks ``on_rollouts`` and
  ``before_forward``). Dropped rollouts and truncated columns are removed from the batch here, *before* any
  forward pass, so what a method skips is really skipped. With ``train.dynamic_sampling`` TRL generates and scores
  rounds of the prompt stream until all processes together hold the step's groups with signal, which then move to
  the processes that train them (``harness.train.dynamic_sampling``).
- ``_compute_loss``: token statistics from the last hidden states (``harness.train.token_statistics``), computed
  by row chunks (``harness.train.row_chunks``), the method's weights and denominator
  (``harness.train.hooks.weigh_tokens``), and the loss ``sum(w l) / D`` (+ beta KL over all tokens, or with the
  method's KL weights: ``hooks.kl_weights_of``) of ``harness.train.loss``, the pure module that holds the arithmetic.
  D is the denominator of every process's rollouts of the step (all-reduced), or verl's legacy per-micro-batch
  means replace it (``train.loss_micro_batch_tokens``, ``harness.train.micro_batches``): ``_normalised``.

TRL computes no old-policy or reference log-probs itself (TRL's own beta = 0; its old-policy forward is switched
off while it generates). With one optimizer step per generation batch (the default) pi_old = pi_theta and the
ratio is 1. With ``train.mini_batches`` x ``train.ppo_epochs`` > 1 steps per generation batch, ``_prepare_inputs``
splits the reduced batch into mini-batches of whole prompt groups and one no-grad forward over the reduced batch
gives pi_old before the first update. The reference forward (beta > 0) runs here on the reduced batch, once per
generation batch before the updates (``_before_updates``), as verl computes its ref log-probs. The TRL
internals this relies on (version pin, signatures of the overridden methods, no forward of TRL's own) are pinned
by the contract tests in tests/test_trainer.py.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import math
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer

from harness.config.launch import per_device_rollouts, require_vllm_cpu_build
from harness.config.schema import ConfigError, PresetConfig, dynamic_sampling_problems
from harness.data.scoring import score_batch
from harness.model.checkpoints import TORCH_DTYPES
from harness.model.decode import generating_with_sample
from harness.train.budget import (
    BudgetLedger,
    ModelShape,
    PhaseClock,
    generation_flops,
    packed_forward_flops,
    padded_forward_flops,
)
from harness.train.dynamic_sampling import ROLLOUT_TENSORS, GroupCollector, PromptStream
from harness.train.hooks import (
    PreparedBatch,
    denominator_parts,
    loss_inputs_for,
    new_rollout_batch,
    prepare_batch,
    weigh_tokens,
    with_global_denominators,
    with_row_scales,
)
from harness.train.loss import LossConfig, LossInputs, combine_row_metrics, loss_of_rows
from harness.train.micro_batches import balanced_micro_batches, micro_batch_count, micro_batch_row_scales
from harness.train.row_chunks import (
    RowChunk,
    packed_rows,
    row_chunks,
    split_by_prompt_groups,
    statistics_by_row_chunks,
)
from harness.train.token_statistics import EXTRA_STATISTICS, model_token_statistics, packed_model_token_statistics
from methods.base import Method, RolloutBatch, StepContext, TokenStats

# Prefix of the keys this adapter adds to TRL's batch dict for the RolloutBatch fields TRL does not carry (rewards,
# group ids, rollout advantages, a method's extras). TRL slices and shuffles every tensor of the dict by rows, so
# they stay aligned with the rows; "tt" = token targeting, a prefix no TRL key uses.
ROLLOUT_KEY_PREFIX = "tt_"
LEDGER_FILE = "harness_budget.json"  # the budget ledger, saved in each resumable trainer checkpoint
logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """More steps with a NaN/inf loss than ``train.max_nonfinite_steps`` allows."""


def reward_function(scorer: str, timeout_s: float, correct: float = 1.0, wrong: float = 0.0):
    """A TRL reward function: ``correct`` when the completion's final answer equals the row's ``answer``, else
    ``wrong`` (``train.reward_values``: 1/0, or verl's math_dapo scale +1/-1)."""

    def correctness(prompts, completions, answer, **kwargs) -> list[float]:
        return [correct if s.correct else wrong
                for s in score_batch(list(completions), list(answer), scorer, timeout_s)]

    correctness.__name__ = f"correct_{scorer}"
    return correctness


VLLM_PORT_ENV = ("HARNESS_VLLM_SERVER_PORT", "HARNESS_VLLM_GROUP_PORT")  # set by scripts/train-with-vllm-server.sh


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
    ``train.mini_batches`` and ``ppo_epochs`` are TRL's ``steps_per_generation`` and ``num_iterations``; how the
    generation batch is split and where the old log-probs come from is ``TargetedGRPOTrainer._prepare_inputs``.

    vLLM (``train.use_vllm``): TRL generates with vLLM, colocated in each training process or on a server
    (``vllm_settings``). ``vllm_importance_sampling_correction`` stays off: TRL would then compute the sampler's
    log-probs and hand ``importance_sampling_ratio`` to the loss, but ``_compute_loss`` here never reads it, so the
    correction would cost a pass and change nothing. vLLM samples are therefore treated as on-policy, exactly as
    ``generate`` samples are; the small sampler/trainer log-prob mismatch of bf16 kernels is not corrected.
    """
    train = preset.train
    budget = train.budget
    updates = train.mini_batches * train.ppo_epochs  # optimizer steps per generation batch
    # a steps budget stops at the end of a generation batch, as every budget does
    max_steps = int(math.ceil(budget.amount / updates)) * updates if budget.kind == "steps" else budget.max_steps
    rollouts = per_device_rollouts(train, int(os.environ.get("WORLD_SIZE", "1")))
    return GRPOConfig(
        output_dir=str(out_dir / "trl"),
        per_device_train_batch_size=rollouts // train.mini_batches,  # TRL's per-step slice of the generation batch
        gradient_accumulation_steps=1,
        steps_per_generation=train.mini_batches,  # TRL generates once for mini_batches x ppo_epochs steps
        num_iterations=train.ppo_epochs,
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
        # forward passes in model.dtype: bf16 autocast (on CPU too) over the train.master_dtype weights
        bf16=preset.model.dtype == "bfloat16",
        fp16=torch.cuda.is_available() and preset.model.dtype == "float16",
        log_completions=False,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        vllm_importance_sampling_correction=False,
        **vllm_settings(train),
    )


def ephemeral_port() -> int:
    """A free port the kernel assigns, for a one-process job's colocated vLLM rendezvous. TRL 1.16 tries 29500 first
    (``trainer/utils.py _find_free_port``): two such jobs starting together on one machine both find it free and the
    second fails with EADDRINUSE (seen in the vLLM-CPU rehearsal, two train jobs at once)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def frozen_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of the policy in ``dtype`` (model.dtype: the reference needs no master weights) for the
    reference. GRPOTrainer replaces ``model.forward`` by a closure over the original model's forward; a deep copy
    would keep calling the policy through it, so the copy gets its class's own forward back."""
    reference = copy.deepcopy(model).eval().requires_grad_(False).to(dtype)
    reference.__dict__.pop("forward", None)
    return reference


@contextmanager
def colocated_engine_settings(preset: PresetConfig):
    """While TRL 1.16 builds its colocated vLLM engine (``VLLMGeneration._init_vllm``), the engine also gets the
    policy's dtype: TRL passes none, and vLLM's ``"auto"`` turns a float32 checkpoint into bfloat16, so the
    rollouts of a float32 policy would come from rounded weights. With ``train.vllm_device=cpu`` it also runs eager
    (vLLM's CPU build otherwise compiles the model with torch.compile at start, as the eval backend avoids too)."""
    from trl.generation import vllm_generation

    engine = getattr(vllm_generation, "LLM", None)  # absent without vLLM: TRL then raises its own clear ImportError
    if engine is None:
        yield
        return
    extra = {"dtype": preset.model.dtype, **({"enforce_eager": True} if preset.train.vllm_device == "cpu" else {})}
    vllm_generation.LLM = lambda *args, **kwargs: engine(*args, **{**kwargs, **extra})
    try:
        yield
    finally:
        vllm_generation.LLM = engine


def reload_into_cpu_engine(generation) -> None:
    """TRL's weight sync for vLLM's CPU build (``train.vllm_device=cpu``), in place of ``sync_weights``.

    TRL 1.16 copies each parameter into the engine with ``model.load_weights``, which calls the vLLM parameter's
    ``weight_loader``. vLLM's CPU build, after loading, repacks every linear layer's weight for its GEMM kernel
    (``UnquantizedLinearMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=True)``: the packed copy lives in the layer's ``cpu_linear`` closure and ``weight`` becomes an
    empty ``Parameter`` without ``weight_loader``), so the first sync fails with ``AttributeError: 'Parameter' object
    has no attribute 'weight_loader'``, and writing into that empty tensor would not reach the kernel anyway. vLLM's
    in-place ``reload_weights`` (the worker's, through ``collective_rpc``) restores each layer's loading layout,
    loads the trainer's weights and repacks them; TRL's own iterator supplies the weights under the names the
    engine expects."""
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": generation._iter_named_params(),
                                                             "is_checkpoint_format": True})
    generation.llm.reset_prefix_cache()


@contextmanager
def class_forward_while_generating(model):
    """TRL 1.16 puts a fused-LM-head forward on the policy instance (``_fused_forward`` in trl/trainer/utils.py).
    Called without ``fused_lm_head=True``, as ``generate`` calls it, it only calls the forward it replaced. When that
    is the class's own forward (no mixed-precision wrapper in between), the instance attribute is lifted while TRL
    generates: every call computes the same, and harness.model.decode sees a plain model whose decoder layers it
    may call directly (its faster step). Anything else is left as it is."""
    patched = vars(model).get("forward")
    func = getattr(patched, "__func__", None)
    original = (inspect.getclosurevars(func).nonlocals.get("original_forward")
                if func is not None and func.__code__.co_name == "_fused_forward" else None)
    if getattr(original, "__func__", None) is not type(model).forward or original.__self__ is not model:
        yield
        return
    del model.forward
    try:
        yield
    finally:
        model.forward = patched


class TargetedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage, rollout selection, truncation and loss come from a ``Method``."""

    def __init__(self, *args, method: Method, preset: PresetConfig, run_seed: int,
                 sample_batch_path: Path | None = None, run_key: str = "", **kwargs):
        colocated = preset.train.use_vllm and preset.train.vllm_mode == "colocate"
        cpu_engine = colocated and preset.train.vllm_device == "cpu"
        if cpu_engine:
            require_vllm_cpu_build("train.vllm_device")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; unset, vLLM sizes it from the machine's memory
        if colocated and "WORLD_SIZE" not in os.environ and not os.environ.get("MASTER_PORT"):
            os.environ["MASTER_PORT"] = str(ephemeral_port())
        with colocated_engine_settings(preset) if colocated else nullcontext():
            super().__init__(*args, **kwargs)
        if cpu_engine:
            generation = self.vllm_generation
            generation.sync_weights = lambda: reload_into_cpu_engine(generation)
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
        problems = dynamic_sampling_problems(preset.train, self.accelerator.num_processes)
        if problems:
            raise ConfigError("; ".join(problems))
        # the one stream of prompts of dynamic sampling's rounds; its cursor is saved with the ledger
        self.prompt_stream = PromptStream(len(self.train_dataset), run_seed)
        round_prompts = preset.train.dynamic_sampling.prompts_per_round or preset.train.prompts_per_step
        if preset.train.dynamic_sampling.enabled and round_prompts > len(self.train_dataset):
            raise ConfigError(f"a dynamic sampling round of {round_prompts} prompts exceeds the "
                              f"{len(self.train_dataset)} training prompts (train.dynamic_sampling.prompts_per_round)")
        self._exchange_group = None  # dynamic sampling's CPU (gloo) process group, made at its first exchange
        self.ref_policy = None
        if preset.train.beta > 0 or "ref_logp" in method.needs:
            self.ref_policy = frozen_copy(self.accelerator.unwrap_model(self.model), TORCH_DTYPES[preset.model.dtype])

    # --- context -------------------------------------------------------------------------------------------------

    def step_context(self) -> StepContext:
        train = self.preset.train
        progress = min(1.0, self.ledger.spent(train.budget.kind) / max(train.budget.amount, 1e-12))
        return StepContext(progress=progress, step=self.state.global_step, seed=self.run_seed,
                           clip_eps_low=train.clip_eps_low, clip_eps_high=train.clip_eps_high, beta=train.beta,
                           aggregation=train.aggregation, max_completion_length=train.max_completion_length,
                           process_index=self.accelerator.process_index)

    @property
    def updates_per_generation(self) -> int:
        """Optimizer steps per generation batch: train.mini_batches x train.ppo_epochs."""
        return self.preset.train.mini_batches * self.preset.train.ppo_epochs

    # --- mini-batches: TRL's buffering, whole prompt groups per mini-batch ------------------------------------------

    def _prepare_inputs(self, generation_batch):
        """The batch of the next optimizer step. One step per generation batch: TRL's own path. Several: TRL 1.16
        would shuffle the generation batch by rows and cut it into equal row slices, which spreads a prompt group
        over mini-batches (and, after rollout dropping, cuts off the remainder rows); here mini-batch j holds prompt
        groups [j P / k, (j + 1) P / k) of the process's P groups in generation order, the same in every epoch."""
        updates = self.updates_per_generation
        if not self.model.training or updates == 1:
            return super()._prepare_inputs(generation_batch)
        mini_batches = self.preset.train.mini_batches
        if self._step % updates == 0 or self._buffered_inputs is None:  # None: resumed (at a generation boundary)
            batch = self._generate_and_score_completions(generation_batch)
            groups = self.preset.train.prompts_per_step // self.accelerator.num_processes
            self._buffered_inputs = split_by_prompt_groups(
                batch, batch[f"{ROLLOUT_KEY_PREFIX}group_ids"] - self.accelerator.process_index * groups, groups,
                mini_batches)
            empty = [j for j, part in enumerate(self._buffered_inputs) if part["completion_ids"].shape[0] == 0]
            if empty:
                raise RuntimeError(f"method {self.method.name!r} dropped every rollout of mini-batches {empty} in step "
                                   f"{self.state.global_step}; lower train.mini_batches={mini_batches}")
        return self._buffered_inputs[self._step % mini_batches]

    @contextmanager
    def _trl_sees_one_step_per_generation(self):
        """TRL 1.16 runs a forward of its own for old log-probs when steps_per_generation x num_iterations exceeds
        gradient_accumulation_steps: full-vocabulary logits over the batch before rollout dropping, outside the
        budget. The harness computes them on the reduced batch (``_rollout_policy_logp``), so while TRL generates
        it sees the values for which it computes none (the only place TRL reads them there)."""
        saved = self.args.steps_per_generation, self.num_iterations
        self.args.steps_per_generation, self.num_iterations = 1, 1
        try:
            yield
        finally:
            self.args.steps_per_generation, self.num_iterations = saved

    def _rollout_policy_logp(self, inputs: dict, loss_positions: torch.Tensor | None = None) -> torch.Tensor:
        """log pi_old (B, T) of the reduced batch before its first update: one no-grad forward, phase old_logp; the
        LM head only at ``loss_positions`` (the method's, or None: every position)."""
        started = self.clock.start()
        with torch.no_grad():
            logp = self._chunked_statistics(self.model, inputs, (), "old_logp", False, loss_positions)["logp"]
        self.clock.stop("old_logp", started)
        return logp

    # --- rollouts: advantages, selection, truncation (before any forward pass) ---------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards_per_func  # (N_all_processes, n_funcs), gathered by TRL
        return rewards_per_func

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's rollout generation; on its transformers ``generate`` path (no vLLM, no continuous batching) with
        ``train.fast_decode`` that call is decoded by harness/model/decode.py: the same rollouts (tokens and RNG
        draws), less Python per step."""
        args = (prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if not self.preset.train.fast_decode or self.use_vllm or self.use_transformers_continuous_batching:
            return super()._generate_single_turn(*args)
        model = self.accelerator.unwrap_model(self.model_wrapped)  # the model TRL unwraps to generate with
        with class_forward_while_generating(model), generating_with_sample(model):
            return super()._generate_single_turn(*args)

    def _generate_round(self, inputs) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """TRL generates and scores ``inputs`` (this process's rows), counted in the budget. Returns TRL's batch of
        this process, and the summed rewards and the correctness (the first reward function) of every process's
        rollouts (N_all,), gathered by TRL, in process order."""
        started = self.clock.start()
        with self._trl_sees_one_step_per_generation():
            out = super()._generate_and_score_completions(inputs)
        self.clock.stop("generation", started)
        self._count_generation(out)
        gathered = torch.nan_to_num(self._gathered_rewards.cpu(), nan=0.0)
        return out, gathered.sum(dim=1), gathered[:, 0]

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            with self._trl_sees_one_step_per_generation():
                return super()._generate_and_score_completions(inputs)
        train = self.preset.train
        if train.dynamic_sampling.enabled:  # the sampler's batch is not generated: every round reads the stream
            out, rewards = self._dynamically_sampled()
        else:
            out, rewards_all, _ = self._generate_round(inputs)
            n_local = out["completion_ids"].shape[0]
            rewards = rewards_all[self.accelerator.process_index * n_local:][:n_local]
        device = out["completion_ids"].device
        # groups of a process are numbered from process_index x its share of prompts_per_step (_prepare_inputs)
        first_group = self.accelerator.process_index * (train.prompts_per_step // self.accelerator.num_processes)
        group_ids = first_group + torch.arange(len(rewards)) // self.num_generations
        batch = new_rollout_batch(out["completion_ids"].cpu(), out["completion_mask"].cpu(), rewards, group_ids,
                                  train.scale_rewards, self.special_token_ids)
        if self.sample_batch_path is not None and self.state.global_step == 0:
            self._write_sample_batch(out, batch)  # every process runs the forward (collectives under ZeRO-3/FSDP)
        prepared = prepare_batch(self.method, batch, self.step_context())
        if len(prepared.rows) == 0 or prepared.length == 0:
            raise RuntimeError(f"method {self.method.name!r} kept no rollout or no token in step "
                               f"{self.state.global_step}; a method must keep at least one token")
        self._log_train("rollouts/kept_frac", len(prepared.rows) / out["completion_ids"].shape[0])
        return self._before_updates(self._reduced_batch(out, prepared, device))

    def _before_updates(self, reduced: dict) -> dict:
        """The no-grad passes over the reduced batch, once before its optimizer steps (verl computes old and
        reference log-probs once per generation batch too): pi_old when the batch feeds several steps, pi_ref when
        there is a reference model (KL term, or a method reading ref_logp); both at the method's ``loss_positions``."""
        positions = self.method.loss_positions(self._rollout_batch_from_inputs(reduced), self.step_context())
        if self.updates_per_generation > 1:
            reduced[f"{ROLLOUT_KEY_PREFIX}old_logp"] = self._rollout_policy_logp(reduced, positions)
        if self.ref_policy is not None:
            reduced[f"{ROLLOUT_KEY_PREFIX}ref_logp"] = self._reference_logp(reduced, positions)
        return reduced

    def _dynamically_sampled(self) -> tuple[dict, torch.Tensor]:
        """DAPO's dynamic sampling (``harness.train.dynamic_sampling``): rounds of ``prompts_per_round`` prompts of
        the stream until the groups with signal of all processes reach prompts_per_step, or ``max_generation_rounds``
        rounds; then the trained groups move to the processes that train them (``_exchange_groups``). Returns this
        process's trained groups' rollouts (prompt/completion ids and masks) and summed rewards, and logs the step's
        counts."""
        train = self.preset.train
        config = train.dynamic_sampling
        collector = GroupCollector(groups_per_step=train.prompts_per_step, processes=self.accelerator.num_processes,
                                   process_index=self.accelerator.process_index, group_size=self.num_generations,
                                   pad_token_id=self.processing_class.pad_token_id)
        round_prompts = config.prompts_per_round or train.prompts_per_step
        while True:
            out, rewards_all, correct_all = self._generate_round(self._stream_inputs(round_prompts))
            collector.add_round({k: out[k].cpu() for k in ROLLOUT_TENSORS}, rewards_all, correct_all)
            if collector.full or collector.rounds >= config.max_generation_rounds:
                break
        metrics = collector.metrics()
        for name, value in metrics.items():
            self._log_train(f"dynamic_sampling/{name}", float(value))
        self._log_train("dynamic_sampling/epoch", self.prompt_stream.passes)
        if not collector.full and self.accelerator.is_main_process:
            logger.warning(f"step {self.state.global_step + 1}: dynamic sampling ran out of its "
                           f"{config.max_generation_rounds} rounds with {metrics['groups_kept']} of "
                           f"{train.prompts_per_step} groups with signal; {metrics['groups_filled']} zero-variance "
                           "groups complete the step (train.dynamic_sampling.max_generation_rounds)")
        rollouts, rewards = collector.batch(self._exchange_groups(collector))
        device = out["completion_ids"].device
        return {k: v.to(device) for k, v in rollouts.items()}, rewards

    def _exchange_groups(self, collector: GroupCollector) -> dict:
        """The trained groups this process did not generate, from the processes that did: point-to-point sends over
        a CPU (gloo) process group, each group once, to the one process that trains it, as pickled compact rows
        (int32 ids and bool masks without the group's shared padding columns: 5 bytes per token). Two phases, the
        payload sizes, then the payloads. Cost per step: the moved groups (``dynamic_sampling/groups_moved``) x
        num_generations x their padded prompt + completion tokens x 5 bytes, over all processes; a process receives
        at most its prompts_per_step / processes groups. paper-8020 (512 groups of 16, up to ~22.5k tokens, 8
        processes): at most ~0.9 GB moved per step when every group moves and every rollout has the maximum length,
        at most ~115 MB received per process, plus a pickled copy on each side while it is sent; no GPU memory."""
        if self.accelerator.num_processes == 1:
            return {}
        import pickle

        import torch.distributed as dist

        if self._exchange_group is None and dist.get_backend() != "gloo":
            self._exchange_group = dist.new_group(backend="gloo")  # every process reaches its first exchange together
        group = self._exchange_group
        sends = {q: torch.frombuffer(bytearray(pickle.dumps(rows)), dtype=torch.uint8)
                 for q, rows in collector.outgoing().items()}
        sources = collector.sources()

        def exchange(outgoing: dict[int, torch.Tensor], incoming: dict[int, torch.Tensor]) -> None:
            works = [dist.isend(t, q, group=group) for q, t in outgoing.items()]
            works += [dist.irecv(t, p, group=group) for p, t in incoming.items()]
            for work in works:
                work.wait()

        sizes = {p: torch.zeros(1, dtype=torch.int64) for p in sources}
        exchange({q: torch.tensor([len(t)], dtype=torch.int64) for q, t in sends.items()}, sizes)
        payloads = {p: torch.empty(int(sizes[p]), dtype=torch.uint8) for p in sources}
        exchange(sends, payloads)
        received = {}
        for p in sources:
            received.update(pickle.loads(payloads[p].numpy().tobytes()))
        return received

    def _stream_inputs(self, prompts: int) -> list[dict]:
        """This process's rows for the next ``prompts`` prompts of the stream (all processes draw the same ones and
        each takes its contiguous share), each prompt repeated num_generations times as TRL's sampler does."""
        processes, index = self.accelerator.num_processes, self.accelerator.process_index
        drawn = self.prompt_stream.take(prompts)
        share = len(drawn) // processes
        return [dict(self.train_dataset[i]) for i in drawn[index * share:(index + 1) * share]
                for _ in range(self.num_generations)]

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
            f"{ROLLOUT_KEY_PREFIX}rewards": kept.rewards.to(device),
            f"{ROLLOUT_KEY_PREFIX}group_ids": kept.group_ids.to(device),
            f"{ROLLOUT_KEY_PREFIX}rollout_advantages": kept.rollout_advantages.to(device),
        }
        for name, value in kept.extras.items():
            reduced[f"{ROLLOUT_KEY_PREFIX}extra_{name}"] = value.to(device)
        return reduced

    def _count_generation(self, out: dict) -> None:
        prompt_lengths = out["prompt_mask"].sum(dim=1).tolist()
        completion_lengths = out["completion_mask"].sum(dim=1).tolist()
        ledger = self.step_ledger
        ledger.samples += len(prompt_lengths)
        ledger.prompt_tokens += int(sum(prompt_lengths))
        ledger.generated_tokens += int(sum(completion_lengths))
        ledger.flops["generation"] += generation_flops(self.model_shape, prompt_lengths, completion_lengths)

    # --- loss: statistics, the method's weights, the pure loss (harness.train.loss) -------------------------------

    def _rollout_batch_from_inputs(self, inputs: dict) -> RolloutBatch:
        extras = {k.removeprefix(f"{ROLLOUT_KEY_PREFIX}extra_"): v for k, v in inputs.items()
                  if k.startswith(f"{ROLLOUT_KEY_PREFIX}extra_")}
        mask = inputs["completion_mask"].float()
        return RolloutBatch(
            completion_ids=inputs["completion_ids"], completion_mask=mask,
            rewards=inputs[f"{ROLLOUT_KEY_PREFIX}rewards"], group_ids=inputs[f"{ROLLOUT_KEY_PREFIX}group_ids"],
            rollout_advantages=inputs[f"{ROLLOUT_KEY_PREFIX}rollout_advantages"], advantages=inputs["advantages"],
            keep=torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device),
            special_token_ids=self.special_token_ids, extras=extras)

    def _row_chunk_statistics(self, model, chunk: RowChunk, extras: tuple[str, ...], phase: str,
                              backward: bool, loss_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Statistics (b, T') of one row chunk; its FLOPs go to ``phase`` (x3 when a backward follows).
        ``loss_positions`` (B, T) bool of the whole batch: the LM head runs only there (``Method.loss_positions``)."""
        train = self.preset.train
        picked = None if loss_positions is None else loss_positions[chunk.rows, :chunk.completion_width]
        if train.padding_free:
            packed = packed_rows(chunk, train.share_prompts)
            completion_ids = chunk.input_ids[:, -chunk.completion_width:]
            stats = packed_model_token_statistics(model, packed, completion_ids, extras, train.temperature,
                                                  train.stats_chunk_size, picked)
            positions = packed.positions
            logits = int(packed.valid.sum()) if picked is None else int((packed.valid & picked.bool()).sum())
            flops = packed_forward_flops(self.model_shape, positions, len(chunk.rows), packed.attention_width,
                                         max(logits, 1))  # >= 1: see StatisticsHead
        else:
            stats = model_token_statistics(model, chunk.input_ids, chunk.attention_mask, chunk.completion_width,
                                           extras, train.temperature, train.stats_chunk_size, picked)
            positions = chunk.input_ids.numel()
            flops = padded_forward_flops(self.model_shape, len(chunk.rows), chunk.input_ids.shape[1],
                                         chunk.completion_width,
                                         None if picked is None else max(int(picked.sum()), 1))
        self.step_ledger.flops[phase] += flops * (3.0 if backward else 1.0)  # backward ~ 2x forward
        self.step_ledger.forwarded_positions += positions
        if backward:
            self.step_ledger.trained_positions += positions
        return stats

    def _chunked_statistics(self, model, inputs: dict, extras: tuple[str, ...], phase: str, backward: bool,
                            loss_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Token statistics (B, T) of the whole batch, computed ``train.forward_chunk_rows`` rows at a time."""
        return statistics_by_row_chunks(inputs, self.preset.train.forward_chunk_rows, lambda chunk: (
            self._row_chunk_statistics(model, chunk, extras, phase, backward, loss_positions)))

    def _reference_logp(self, inputs: dict, loss_positions: torch.Tensor | None = None) -> torch.Tensor:
        """log pi_ref (no grad) of a batch, timed as the reference phase."""
        started = self.clock.start()
        # the reference is not prepared by accelerate: its forward gets the policy's autocast explicitly
        with torch.no_grad(), self.accelerator.autocast():
            ref_logp = self._chunked_statistics(self.ref_policy, inputs, (), "reference", False, loss_positions)["logp"]
        self.clock.stop("reference", started)
        return ref_logp

    def _token_stats(self, model, inputs: dict, backward: bool = True,
                     loss_positions: torch.Tensor | None = None) -> TokenStats:
        """Current-policy statistics; old_logp is the rollout policy's (``_rollout_policy_logp``) when the batch
        feeds several optimizer steps, else logp.detach() (pi_old = pi_theta); ref_logp the reference's, computed
        once per generation batch (``_before_updates``), None without a reference model."""
        extras = tuple(sorted(({"entropy"} | set(self.method.needs)) & set(EXTRA_STATISTICS)))
        stats = self._chunked_statistics(model, inputs, extras, "train", backward, loss_positions)
        ref_logp = inputs.get(f"{ROLLOUT_KEY_PREFIX}ref_logp")
        old_logp = inputs.get(f"{ROLLOUT_KEY_PREFIX}old_logp")
        return TokenStats(logp=stats["logp"], old_logp=stats["logp"].detach() if old_logp is None else old_logp,
                          entropy=stats.get("entropy"), sum_p2=stats.get("sum_p2"), ref_logp=ref_logp)

    def _loss_config(self, ctx: StepContext) -> LossConfig:
        train = self.preset.train
        return LossConfig(clip_eps_low=ctx.clip_eps_low, clip_eps_high=ctx.clip_eps_high,
                          clip_ratio_c=train.clip_ratio_c, beta=ctx.beta, kl_estimator=train.kl_estimator)

    def _compute_loss(self, model, inputs):
        """The method's weights on the whole batch, then ``sum(w l) / D`` (+ beta KL) of its rows: in one forward +
        backward, or (``train.backward_chunk_rows``) row chunk by row chunk after a no-grad forward that gives the
        method its batch-wide statistics. ``inputs`` is one mini-batch (the whole generation batch by default);
        one optimizer step per mini-batch (``grpo_config``): no accumulation scaling of the returned loss."""
        started = time.perf_counter()
        ctx = self.step_context()
        batch = self._rollout_batch_from_inputs(inputs)
        chunk_rows = self.preset.train.backward_chunk_rows
        in_chunks = bool(chunk_rows) and batch.completion_mask.shape[0] > chunk_rows
        positions = self.method.loss_positions(batch, ctx)  # (B, T) bool or None: the LM head runs only there
        with torch.no_grad() if in_chunks else nullcontext():
            stats = self._token_stats(model, inputs, backward=not in_chunks, loss_positions=positions)
        result = weigh_tokens(self.method, stats, PreparedBatch(batch, rows=torch.arange(0), length=0), ctx)
        loss_inputs = loss_inputs_for(self.method, batch, result, ctx, positions,
                                      old_logp=inputs.get(f"{ROLLOUT_KEY_PREFIX}old_logp"), ref_logp=stats.ref_logp)
        loss_inputs = self._normalised(loss_inputs, result, batch, inputs, ctx)
        mask, computed = batch.completion_mask, loss_inputs.mask  # metrics average over the computed tokens
        config = self._loss_config(ctx)
        if in_chunks:
            loss, metrics = self._loss_in_backward_chunks(model, inputs, loss_inputs, config, chunk_rows, positions)
        else:
            loss, metrics = loss_of_rows(stats.logp, loss_inputs, config)
        self._log_step_metrics(stats, result, metrics, mask, started, computed)
        if not torch.isfinite(loss.detach()):
            return self._skip_nonfinite_step(model, loss)
        return loss

    def _normalised(self, loss_inputs: LossInputs, result, batch: RolloutBatch, inputs: dict,
                    ctx: StepContext) -> LossInputs:
        """The denominators of the optimizer step's loss (``train.loss_micro_batch_tokens``).

        0: one mean over the rollouts of every process: the method's denominator parts (and the KL term's) are summed
        over the processes in one all-reduce (``hooks.with_global_denominators``; nothing to do with one process).
        N > 0: verl's legacy micro-batch means (``harness.train.micro_batches``): this process's rows are split into
        micro-batches of at most N prompt + completion tokens, as many as the largest count of any process (verl
        takes that maximum too), each weighted by its rows / the process's rows over its own denominator.
        Logs ``loss/denominator`` and ``loss/kl_denominator`` (the step's, over every process) or
        ``loss/micro_batches`` (this process's count)."""
        parts, kl_parts = denominator_parts(result, batch, ctx)
        tokens = self.preset.train.loss_micro_batch_tokens
        processes = self.accelerator.num_processes
        if tokens:
            if parts is None or kl_parts is None:
                raise ValueError(f"method {self.method.name!r} returned no row_denominators (TokenWeights): "
                                 "train.loss_micro_batch_tokens needs them to take each micro-batch's denominator")
            lengths = (inputs["prompt_mask"].sum(dim=1) + inputs["completion_mask"].sum(dim=1)).tolist()
            micro_batches = balanced_micro_batches(lengths, self.max_over_processes(micro_batch_count(lengths, tokens)))
            self._log_train("loss/micro_batches", float(len(micro_batches)))
            return with_row_scales(loss_inputs, micro_batch_row_scales(micro_batches, parts),
                                   micro_batch_row_scales(micro_batches, kl_parts))
        if processes == 1:
            self._log_train("loss/denominator", float(loss_inputs.denominator))
            self._log_train("loss/kl_denominator", float(loss_inputs.kl_denominator))
            return loss_inputs
        local = [result.denominator if parts is None else parts.sum(),
                 loss_inputs.kl_denominator if kl_parts is None else kl_parts.sum()]
        local = torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()).to(self.accelerator.device)
                             for v in local])
        total = self.accelerator.reduce(local, reduction="sum").to(torch.float32).clamp(min=1.0)
        self._log_train("loss/denominator", float(total[0]))
        self._log_train("loss/kl_denominator", float(total[1]))
        return with_global_denominators(loss_inputs, total[0], total[1], processes)

    def _loss_in_backward_chunks(self, model, inputs: dict, loss_inputs: LossInputs, config: LossConfig,
                                 chunk_rows: int, loss_positions: torch.Tensor | None = None,
                                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of the whole batch with activations of only ``chunk_rows`` rows alive at a time: each row chunk
        runs forward + backward with its share of the loss (its rows' terms over the whole batch's denominators),
        gradients accumulating, synchronised across processes only in the last backward, which the Trainer runs on
        the returned loss. Returns the whole loss's value (with the last chunk's graph) and the batch's metrics."""
        chunks = list(row_chunks(inputs, chunk_rows))
        done, parts = torch.zeros((), device=loss_inputs.mask.device), []
        for index, chunk in enumerate(chunks):
            logp = self._row_chunk_statistics(model, chunk, (), "train", True, loss_positions)["logp"]
            rows = loss_inputs.rows(chunk.rows, chunk.completion_width)
            loss, metrics = loss_of_rows(logp, rows, config)
            parts.append((metrics, rows.mask.sum()))
            if index == len(chunks) - 1:
                return loss + done, combine_row_metrics(parts)  # the whole loss's value; the last chunk's gradient
            with self._gradients_accumulate(model):
                self.accelerator.backward(loss)
            done = done + loss.detach()

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
        if self.optimizer is not None:  # train() called again (bench/): the step below is wrapped already
            return super().create_optimizer(model)
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
        for phase in ("generation", "old_logp", "reference"):
            local.seconds[phase] += seconds.get(phase, 0.0)
        local.seconds["train"] += (step_seconds - seconds.get("generation", 0.0) - seconds.get("old_logp", 0.0)
                                   - seconds.get("reference", 0.0))
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

    def precision_in_use(self) -> dict:
        """What the run trained with, read from the live objects (run.json ``precision``): the autocast mode, the
        dtypes of the trainable weights and of the optimizer state (DeepSpeed: its float32 partitions)."""
        trainable = {str(p.dtype) for p in self.model.parameters() if p.requires_grad}
        states: set[str] = set()
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper
        for state in getattr(optimizer, "state", {}).values():
            states |= {str(v.dtype) for v in state.values() if torch.is_tensor(v) and v.is_floating_point()
                       and v.dim() > 0}
        for group in getattr(optimizer, "fp32_partitioned_groups_flat", None) or []:  # DeepSpeed ZeRO-3
            states.add(f"{group.dtype} (deepspeed master partition)")
        return {"mixed_precision": self.accelerator.mixed_precision, "compute_dtype": self.preset.model.dtype,
                "trainable_dtypes": sorted(trainable), "optimizer_state_dtypes": sorted(states),
                "distributed": self.accelerator.distributed_type.value}

    # --- resumable checkpoints ----------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        """TRL/transformers save weights, optimizer, scheduler, RNG and trainer state; the ledger goes beside them,
        so a resumed run continues the budget count."""
        super()._save_checkpoint(model, trial)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        from harness.data.files import write_json_atomic

        write_json_atomic(folder / LEDGER_FILE, {"ledger": self.ledger.to_dict(), "run_key": self.run_key,
                                                 "saved_checkpoints": self.saved_checkpoints,
                                                 "prompt_stream_cursor": self.prompt_stream.cursor})

    def restore_ledger(self, checkpoint: Path) -> None:
        """The budget ledger and dynamic sampling's prompt-stream position of a trainer checkpoint."""
        saved = json.loads((checkpoint / LEDGER_FILE).read_text())
        self.ledger = BudgetLedger.from_dict(saved["ledger"])
        self.saved_checkpoints = saved["saved_checkpoints"]
        self.prompt_stream.cursor = saved.get("prompt_stream_cursor", 0)  # absent from checkpoints before it

    # --- metrics ------------------------------------------------------------------------------------------------

    def _log_train(self, name: str, value: float) -> None:
        self._metrics["train"][name].append(value)

    def _log_step_metrics(self, stats: TokenStats, result, loss_metrics: dict[str, torch.Tensor], mask,
                          started: float, computed) -> None:
        """``mask``: the completion tokens; ``computed``: those with statistics (fewer under loss_positions)."""
        with torch.no_grad():
            n_tokens = mask.sum().clamp(min=1)
            weighted = (result.weights != 0) & (mask > 0)
            for region in ("region", "low", "high", "dual"):  # fractions of completion tokens; 0 while r = 1
                self._log_train(f"clip_ratio/{region}_mean", float(loss_metrics[f"clip_ratio/{region}_mean"]))
            self._log_train("tokens/weighted_frac", float(weighted.sum() / n_tokens))
            if stats.entropy is not None:
                self._log_train("entropy", float((stats.entropy * computed).sum() / computed.sum().clamp(min=1)))
            self.step_ledger.weighted_tokens += int(weighted.sum())
            for name, value in result.metrics.items():
                self._log_train(f"method/{name}", float(value))
            self._log_train("time/loss_s", time.perf_counter() - started)
            if "kl" in loss_metrics:
                self._log_train("kl", float(loss_metrics["kl"]))


# --- outside a run (bench/): the TRL internals a benchmark observes stay in this module ----------------------------

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


def loss_inputs(trainer: TargetedGRPOTrainer, rollouts: dict, ctx: StepContext) -> dict:
    """The loss inputs of a generated and scored batch, built as in a training step: the baseline's advantages,
    the method's hooks (``trainer.method``) under ``ctx``, dropped rollouts and truncated columns removed.

    ``rollouts``: prompt_ids / prompt_mask (B, P) left-padded, completion_ids / completion_mask (B, T), rewards (B,),
    group_ids (B,). ``trainer.compute_loss(trainer.model, inputs)`` then runs the training forward."""
    train = trainer.preset.train
    batch = new_rollout_batch(rollouts["completion_ids"], rollouts["completion_mask"], rollouts["rewards"],
                              rollouts["group_ids"], train.scale_rewards, trainer.special_token_ids)
    prepared = prepare_batch(trainer.method, batch, ctx)
    out = {k: rollouts[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    return trainer._before_updates(trainer._reduced_batch(out, prepared, rollouts["completion_ids"].device))


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
