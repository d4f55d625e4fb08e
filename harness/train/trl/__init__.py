"""The TRL boundary: the only package that imports TRL (pinned: trl==1.16.0; its private methods change).

- ``settings``: the preset -> TRL's ``GRPOConfig`` (and its vLLM fields), the reward function TRL calls;
- ``trainer``: ``TargetedGRPOTrainer``, TRL's GRPOTrainer with thin overrides that hand the step to the harness
  (``harness.train.actor``, ``harness.train.hooks``, ``harness.train.budget``);
- ``vllm``: shims of TRL's vLLM generation; ``patches``: the other shims on live TRL/transformers/accelerate objects;
- ``bench_probes``: what bench/ observes of TRL outside a run.

``TOUCH_POINTS`` lists every TRL, transformers, accelerate and vLLM internal the harness relies on, with the code
that relies on it; tests/test_trainer.py walks the list (``test_every_touch_point_holds``) and checks that every
TRL method the trainer overrides is on it. A new TRL release is checked against that test first.
"""

from __future__ import annotations

from dataclasses import dataclass

TRL_VERSION = "1.16.0"


@dataclass(frozen=True)
class TouchPoint:
    """``target``: ``module:qualname`` of the object relied on. ``kind``: ``override`` (the trainer overrides it)
    or ``signature`` (the harness calls it): ``pin`` is its parameter list; ``source``: ``pin`` holds snippets its
    source contains, ``absent`` snippets it must not contain; ``exists``: it exists (a vLLM one where vLLM is
    installed). ``used_by``: the harness code; ``why``: what it relies on."""

    target: str
    kind: str
    pin: tuple[str, ...]
    used_by: str
    why: str
    absent: tuple[str, ...] = ()


GRPO = "trl.trainer.grpo_trainer:GRPOTrainer"
_TRAINER = "harness.train.trl.trainer.TargetedGRPOTrainer"

TOUCH_POINTS = (
    TouchPoint(f"{GRPO}._generate_and_score_completions", "override", ("self", "inputs"), _TRAINER,
               "after TRL generates and scores: advantages, the method's hooks, the kept StepBatch, pi_old/pi_ref"),
    TouchPoint(f"{GRPO}._calculate_rewards", "override",
               ("self", "inputs", "prompts", "completions", "completion_ids_list"), _TRAINER,
               "keeps the rewards TRL gathered over the processes (self._gathered_rewards); PhaseProbe wraps it"),
    TouchPoint(f"{GRPO}._compute_loss", "override", ("self", "model", "inputs"), _TRAINER,
               "the loss is Actor.policy_loss; PhaseProbe wraps it"),
    TouchPoint(f"{GRPO}._prepare_inputs", "override", ("self", "generation_batch"), _TRAINER,
               "several updates per generation batch: mini-batches from actor.update_schedule instead of TRL's "
               "_buffered_inputs / _step slicing; one update: TRL's own path (its row shuffle included)"),
    TouchPoint(f"{GRPO}._generate_single_turn", "override",
               ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"), _TRAINER,
               "train.fast_decode: TRL's generate call decoded by harness/model/decode.py"),
    TouchPoint("transformers.trainer:Trainer.create_optimizer", "override", ("self", "model"), _TRAINER,
               "wraps optimizer.step so that a non-finite loss skips it (patches.skippable_step)"),
    TouchPoint(f"{GRPO}._save_checkpoint", "override", ("self", "model", "trial"), _TRAINER,
               "a barrier after the save, then the main process marks the folder complete (the budget ledger) and "
               "rotates (StepAccounting.mark_complete, budget.rotate_checkpoints)"),
    TouchPoint("deepspeed.comm.torch:TorchBackend.__init__", "source", ("self.shm_comm_op = build_shm_op()",),
               "patches.skip_cpu_inference_allreduce_build", "DeepSpeed's backend builds its CPU inference all-reduce "
               "through the module's build_shm_op, which the CPU rehearsals replace"),
    TouchPoint("transformers.trainer_utils:rotate_checkpoints", "source", ("No deletion if `None`",),
               "settings.grpo_config", "save_total_limit=None turns transformers' rotation off (the harness rotates "
               "only complete checkpoints)"),
    TouchPoint("transformers.trainer:Trainer", "source", ("self.optimizer.step()",), "patches.skippable_step",
               "the Trainer steps through the optimizer's step attribute, which the wrapper replaces"),
    TouchPoint("transformers.trainer_utils:PREFIX_CHECKPOINT_DIR", "exists", (), f"{_TRAINER}._save_checkpoint",
               "the folder name of a trainer checkpoint"),
    TouchPoint(f"{GRPO}.__init__", "source", ('self._metrics = {"train": defaultdict(list)',), f"{_TRAINER}._log_train",
               "the step's metrics are appended to TRL's _metrics['train'], which TRL averages and logs"),
    TouchPoint(f"{GRPO}.__init__", "source",
               ("self.use_vllm =", "self.use_transformers_continuous_batching =", "self.vllm_generation =",
                "self.generation_config =", "self.eos_token_ids =", "self.num_iterations =", "self.num_generations ="),
               f"{_TRAINER}, patches.one_step_per_generation, bench_probes.sampling_settings",
               "trainer attributes read (and num_iterations toggled) by the harness"),
    TouchPoint(f"{GRPO}._generate_and_score_completions", "source",
               ("self.args.steps_per_generation * self.num_iterations", "self._calculate_rewards("),
               "patches.one_step_per_generation",
               "TRL decides on its own old-log-prob forward from these two values, set to 1 while it generates"),
    TouchPoint(f"{GRPO}._get_per_token_logps_and_entropies", "exists", (), "patches.one_step_per_generation",
               "TRL's own log-prob forward, which never runs (tests/test_minibatches.py checks it)"),
    TouchPoint("accelerate.state:GradientState._set_sync_gradients", "exists", (),
               "patches.AcceleratorProcesses.accumulating",
               "backward chunks accumulate without gradient sync or a DeepSpeed optimizer step"),
    TouchPoint("trl.trainer.utils:add_fused_lm_head", "source", ("original_forward = model.forward",
                                                                 "def _fused_forward("),
               "patches.class_forward_while_generating, patches.frozen_copy",
               "TRL puts a closure over the original forward on the policy instance: lifted while generating "
               "(introspected), dropped from the reference's deep copy"),
    TouchPoint("trl.trainer.utils", "source", ("29500",), "vllm.colocated_rendezvous",
               "TRL's _find_free_port tries 29500 first: a one-process colocated job gets a held MASTER_PORT"),
    TouchPoint("trl.generation.vllm_generation:VLLMGeneration._init_vllm", "source",
               ('distributed_executor_backend="external_launcher"', "ensure_master_addr_port()"),
               "vllm.colocated_rendezvous", "a colocated engine rendezvouses through env:// at "
               "MASTER_ADDR:MASTER_PORT, which TRL keeps when they are set: one process's is the loopback store"),
    TouchPoint("torch.distributed.rendezvous:_create_c10d_store", "source", ("multi_tenant=True",),
               "harness.config.loopback.loopback_store", "rank 0's store of an env:// or tcp:// rendezvous is "
               "multi-tenant: the loopback store already on its port serves it"),
    TouchPoint("torch.distributed.elastic.rendezvous.static_tcp_rendezvous:StaticTCPRendezvous.next_rendezvous",
               "source", ("multi_tenant=True",), "harness.ops.loopback_launch",
               "torchrun's static rendezvous (accelerate launch on one machine) opens a multi-tenant store: the "
               "loopback store already on its port serves it"),
    TouchPoint("accelerate.utils.launch:prepare_multi_gpu_env", "source", ("is_port_in_use(main_process_port)",),
               "harness.ops.loopback_launch.hold_port", "accelerate's check of its port, told that the held loopback "
               "port is free (for ddp and fsdp)"),
    TouchPoint("accelerate.utils.launch:prepare_deepspeed_cmd_env", "source", ("is_port_in_use(main_process_port)",),
               "harness.ops.loopback_launch.hold_port", "the same check for deepspeed"),
    TouchPoint("trl.generation.vllm_generation:VLLMGeneration._init_vllm", "source",
               ("self.llm = LLM(", "seed=accelerator.process_index // self.tensor_parallel_size"),
               "vllm.colocated_engine_settings", "the module's LLM is swapped to add the policy's dtype and the run "
               "seed to TRL's per-engine seed",
               absent=("dtype=",)),
    TouchPoint(f"{GRPO}._generate_single_turn", "source", ("self.vllm_generation.sync_weights()",),
               "vllm.reload_into_cpu_engine", "train.vllm_device=cpu replaces sync_weights, called before generating"),
    TouchPoint("trl.generation.vllm_generation:VLLMGeneration._iter_named_params", "signature", ("self",),
               "vllm.reload_into_cpu_engine", "TRL's parameter iterator feeds vLLM's reload_weights"),
    TouchPoint("vllm:LLM.collective_rpc", "exists", (), "vllm.reload_into_cpu_engine",
               "the worker's reload_weights restores the CPU build's repacked layers, loads and repacks the weights "
               "(tests/test_vllm_cpu.py runs it)"),
    TouchPoint("trl.kernels:ChunkedLogProbFunction.forward", "signature",
               ("ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size", "final_logit_softcapping",
                "logit_scale", "outputs"), "bench_probes.trl_fused_log_probs",
               "TRL's fused LM head, called positionally as the reference of bench/tokenstats_memory.py"),
)
