"""``TargetedGRPOTrainer``: TRL's GRPOTrainer with thin overrides that hand the step to the harness.

TRL keeps rollout generation, reward calls, the optimizer, scheduler, logging and the Trainer loop (backward,
clipping, optimizer step). The overrides (each a TRL touch point, ``harness.train.trl.TOUCH_POINTS``):

- ``_generate_and_score_completions``: after TRL has generated and scored (one round, or dynamic sampling's rounds
  until the step holds its groups with signal: ``harness.train.dynamic_sampling``), the baseline's advantages and
  the method's hooks (``harness.train.hooks.prepare_batch``); dropped rollouts and truncated columns are removed
  here, before any forward pass (``Actor.step_batch``: a ``harness.train.step_batch.StepBatch``), then the actor's
  no-grad passes (``Actor.before_updates``: pi_old, pi_ref).
- ``_prepare_inputs``: every optimizer step takes its mini-batch from ``harness.train.actor.update_schedule``
  (one mini-batch per generation batch included).
- ``_compute_loss``: ``Actor.policy_loss``.
- ``_generate_single_turn``: TRL's ``generate`` call decoded by harness/model/decode.py (``train.fast_decode``).
- ``_calculate_rewards``: keeps the rewards TRL gathered over the processes, for the advantages.
- ``create_optimizer``: the optimizer step a non-finite loss skips; ``_save_checkpoint``: the budget ledger beside
  each resumable checkpoint (``harness.train.budget.StepAccounting``).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from harness.config.launch import require_vllm_cpu_build
from harness.config.loopback import use_loopback
from harness.config.rules import ZERO3_REFERENCE, dynamic_sampling_problems
from harness.config.schema import ConfigError, PresetConfig
from harness.model.checkpoints import TORCH_DTYPES
from harness.model.decode import generating_with_sample
from harness.train.actor import Actor, update_schedule
from harness.train.budget import (
    BudgetLedger,
    ModelShape,
    PhaseClock,
    StepAccounting,
    rotate_checkpoints,
)
from harness.train.dynamic_sampling import GroupCollector, GroupExchange, PromptStream, sampled_step
from harness.train.hooks import new_rollout_batch, statistics_read
from harness.train.sample_batch import write_sample_batch
from harness.train.trl.patches import (
    AcceleratorProcesses,
    class_forward_while_generating,
    deepspeed_engine_facts,
    frozen_copy,
    one_step_per_generation,
    skip_cpu_inference_allreduce_build,
    skippable_step,
)
from harness.train.trl.vllm import colocated_engine_settings, colocated_rendezvous, reload_into_cpu_engine
from methods.base import Method, StepContext

KEPT_TRAINER_CHECKPOINTS = 2  # the newest complete trainer checkpoint and the one before it


class TargetedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage, rollout selection, truncation and loss come from a ``Method``."""

    def __init__(self, *args, method: Method, preset: PresetConfig, run_seed: int,
                 sample_batch_path: Path | None = None, run_key: str = "", **kwargs):
        colocated = preset.train.use_vllm and preset.train.vllm_mode == "colocate"
        cpu_engine = colocated and preset.train.vllm_device == "cpu"
        if cpu_engine:
            require_vllm_cpu_build("train.vllm_device")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; unset, vLLM sizes it from the machine's memory
        if preset.train.use_vllm:  # Gloo and NCCL of vLLM's groups, and the weight sync of server mode, on loopback
            use_loopback()
        # one process: vLLM's own rendezvous on loopback (under accelerate launch vLLM joins the launcher's store)
        rendezvous = (colocated_rendezvous() if colocated and "WORLD_SIZE" not in os.environ
                      and not os.environ.get("MASTER_PORT") else None)
        with colocated_engine_settings(preset, run_seed) if colocated else nullcontext():
            super().__init__(*args, **kwargs)
        self.loopback_rendezvous = rendezvous  # kept for the job's lifetime, as vLLM's process group is
        if self.is_deepspeed_enabled and not torch.cuda.is_available():
            skip_cpu_inference_allreduce_build()
        if cpu_engine:
            generation = self.vllm_generation
            generation.sync_weights = lambda: reload_into_cpu_engine(generation)
        self.run_key = run_key  # identifies the configuration; a checkpoint of another one is never resumed
        self.sample_batch_path = sample_batch_path
        self.preset = preset
        self.run_seed = run_seed
        self.accounting = StepAccounting(ModelShape.of(self.accelerator.unwrap_model(self.model)),
                                         self.accelerator.device)
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
        self.exchange_groups = GroupExchange()
        reference = None
        if "ref_logp" in statistics_read(method, preset.train.beta):
            if self.is_deepspeed_enabled:
                raise ConfigError(f"method {method.name!r}: {ZERO3_REFERENCE}")
            reference = frozen_copy(self.accelerator.unwrap_model(self.model), TORCH_DTYPES[preset.model.dtype])
        self.processes = AcceleratorProcesses(self.accelerator)
        self.actor = Actor(method, preset.train, self.accounting, self.processes, self._log_train,
                           self.special_token_ids, reference)
        self._updates = iter(())  # the optimizer steps' inputs left of the current generation batch

    # --- what run.py and bench/ read -----------------------------------------------------------------------------

    @property
    def method(self) -> Method:
        return self.actor.method

    @property
    def ledger(self) -> BudgetLedger:
        return self.accounting.ledger

    @property
    def clock(self) -> PhaseClock:
        return self.accounting.clock

    @property
    def saved_checkpoints(self) -> dict[str, dict]:
        return self.accounting.saved_checkpoints

    def step_context(self) -> StepContext:
        budget = self.preset.train.budget
        progress = min(1.0, self.ledger.spent(budget.kind) / max(budget.amount, 1e-12))
        return self.actor.settings.context(progress, self.state.global_step, self.run_seed,
                                           self.accelerator.process_index)

    # --- the update loop: TRL's Trainer asks for each optimizer step's inputs ---------------------------------------

    def _prepare_inputs(self, generation_batch):
        """The batch of the next optimizer step: the next mini-batch of ``update_schedule`` (whole prompt groups, in
        generation order; TRL 1.16 would shuffle the generation batch by rows and cut it into equal row slices,
        spreading a group over mini-batches); a new generation batch when the last one's schedule is used up (or
        after resuming, at a generation boundary). Every step goes this way, one step per generation batch too (a
        schedule of one mini-batch)."""
        train = self.preset.train
        if not self.model.training:  # TRL's evaluation loop (the harness evaluates checkpoints with lm-eval)
            return super()._prepare_inputs(generation_batch)
        inputs = next(self._updates, None)
        if inputs is not None:
            return inputs
        batch = self._generate_and_score_completions(generation_batch)
        groups = train.prompts_per_step // self.accelerator.num_processes
        index = self.accelerator.process_index
        try:  # the same decision (and error) on every process
            self._updates = update_schedule(batch, batch.group_ids - index * groups, groups, train.mini_batches,
                                            train.ppo_epochs, self.processes, index)
        except ValueError as error:
            raise RuntimeError(f"method {self.method.name!r}, step {self.state.global_step}: {error}") from error
        return next(self._updates)

    def _compute_loss(self, model, inputs):
        return self.actor.policy_loss(model, inputs, self.step_context())

    def create_optimizer(self, model=None):
        if self.optimizer is not None:  # train() called again (bench/): the step below is wrapped already
            return super().create_optimizer(model)
        optimizer = super().create_optimizer(model)
        skippable_step(optimizer, self.actor)
        return optimizer

    # --- rollouts: generation, rewards, advantages, selection and truncation (before any forward pass) -------------

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
        with one_step_per_generation(self):
            out = super()._generate_and_score_completions(inputs)
        self.clock.stop("generation", started)
        self.accounting.count_generation(out["prompt_mask"].sum(dim=1).tolist(),
                                         out["completion_mask"].sum(dim=1).tolist())
        self.accounting.digests.add_rollouts(out["completion_ids"])
        gathered = torch.nan_to_num(self._gathered_rewards.cpu(), nan=0.0)
        return out, gathered.sum(dim=1), gathered[:, 0]

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            with one_step_per_generation(self):
                return super()._generate_and_score_completions(inputs)
        train = self.preset.train
        if train.dynamic_sampling.enabled:  # the sampler's batch is not generated: every round reads the stream
            out, rewards = self._dynamically_sampled()
        else:
            out, rewards_all, _ = self._generate_round(inputs)
            n_local = out["completion_ids"].shape[0]
            rewards = rewards_all[self.accelerator.process_index * n_local:][:n_local]
        # groups of a process are numbered from process_index x its share of prompts_per_step (_prepare_inputs)
        first_group = self.accelerator.process_index * (train.prompts_per_step // self.accelerator.num_processes)
        group_ids = first_group + torch.arange(len(rewards)) // self.num_generations
        rollouts = new_rollout_batch(out["completion_ids"].cpu(), out["completion_mask"].cpu(), rewards, group_ids,
                                     train.scale_rewards, self.special_token_ids)
        if self.sample_batch_path is not None and self.state.global_step == 0:
            write_sample_batch(self.sample_batch_path, self.actor, self.model, out, rollouts, self.processing_class,
                               self.num_generations, self.run_seed, self.accelerator.is_main_process)
        return self.actor.step_batch(self.model, out, rollouts, self.step_context())

    def _dynamically_sampled(self) -> tuple[dict, torch.Tensor]:
        """DAPO's dynamic sampling (``harness.train.dynamic_sampling.sampled_step``) over rounds TRL generates."""
        train = self.preset.train
        collector = GroupCollector(groups_per_step=train.prompts_per_step, processes=self.accelerator.num_processes,
                                   process_index=self.accelerator.process_index, group_size=self.num_generations,
                                   pad_token_id=self.processing_class.pad_token_id)
        config = train.dynamic_sampling
        return sampled_step(self._generate_round, self.prompt_stream, self.train_dataset, collector,
                            config.prompts_per_round or train.prompts_per_step, config.max_generation_rounds,
                            self.exchange_groups, self._log_train, self.state.global_step + 1,
                            self.accelerator.is_main_process)

    # --- budget, checkpoints, metrics --------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        """TRL/transformers save weights, optimizer, scheduler, RNG and trainer state; the ledger goes beside them,
        so a resumed run continues the budget count. transformers has no barrier after its save: other processes
        would finish (and mark the folder complete) while the main process is still writing the weights, so a kill
        in that window resumed a torn folder. Each process writes its digests, all wait for each other, then the main
        process marks the folder complete and rotates (transformers' rotation is off: ``save_total_limit=None``)."""
        super()._save_checkpoint(model, trial)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self.accounting.save_digests(folder)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.accounting.mark_complete(folder, self.run_key, self.prompt_stream.cursor)
            rotate_checkpoints(folder.parent, KEPT_TRAINER_CHECKPOINTS)

    def restore_ledger(self, checkpoint: Path) -> None:
        """The budget ledger and dynamic sampling's prompt-stream position of a trainer checkpoint."""
        self.prompt_stream.cursor = self.accounting.restore(checkpoint)

    def max_over_processes(self, value: int) -> int:
        """The largest of one number over the processes (peak memory: the busiest device)."""
        return self.processes.max(value)

    def precision_in_use(self) -> dict:
        """What the run trained with, read from the live objects (run.json ``precision``): the autocast mode, the
        dtypes of the trainable weights and of the optimizer state (DeepSpeed: its float32 partitions), and under
        DeepSpeed what its engine does (``deepspeed_engine_facts``)."""
        trainable = {str(p.dtype) for p in self.model.parameters() if p.requires_grad}
        states: set[str] = set()
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper
        for state in getattr(optimizer, "state", {}).values():
            states |= {str(v.dtype) for v in state.values() if torch.is_tensor(v) and v.is_floating_point()
                       and v.dim() > 0}
        for group in getattr(optimizer, "fp32_partitioned_groups_flat", None) or []:  # DeepSpeed ZeRO-3
            states.add(f"{group.dtype} (deepspeed master partition)")
        record = {"mixed_precision": self.accelerator.mixed_precision, "compute_dtype": self.preset.model.dtype,
                  "trainable_dtypes": sorted(trainable), "optimizer_state_dtypes": sorted(states),
                  "distributed": self.accelerator.distributed_type.value}
        if self.is_deepspeed_enabled:  # no engine when a resumed run found nothing left to train
            engine = self.model_wrapped
            record["deepspeed"] = deepspeed_engine_facts(engine) if hasattr(engine, "get_data_types") else None
        return record

    def _log_train(self, name: str, value: float) -> None:
        self._metrics["train"][name].append(value)
