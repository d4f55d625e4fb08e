"""TRL's settings of a run: the preset -> ``GRPOConfig`` (``grpo_config``, with its vLLM fields) and the reward
function TRL calls."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from trl import GRPOConfig

from harness.config.launch import per_device_rollouts
from harness.config.schema import PresetConfig
from harness.data.scoring import score_batch

MAX_SCORING_WORKERS = 8


def reward_scoring_workers(train, env=None) -> int:
    """``train.reward_scoring_workers``, or for 0 the CPUs this process may use over the training processes on its
    node (``LOCAL_WORLD_SIZE``), between 1 and ``MAX_SCORING_WORKERS``."""
    if train.reward_scoring_workers:
        return train.reward_scoring_workers
    local_processes = int((os.environ if env is None else env).get("LOCAL_WORLD_SIZE", 1))
    return max(1, min(MAX_SCORING_WORKERS, len(os.sched_getaffinity(0)) // local_processes))


def reward_function(scorer: str, timeout_s: float, correct: float = 1.0, wrong: float = 0.0, workers: int = 1):
    """A TRL reward function: ``correct`` when the completion's final answer equals the row's ``answer``, else
    ``wrong`` (``train.reward_values``: 1/0, or verl's math_dapo scale +1/-1); math_verify items are scored on
    ``workers`` worker processes at once."""

    def correctness(prompts, completions, answer, **kwargs) -> list[float]:
        return [correct if s.correct else wrong
                for s in score_batch(list(completions), list(answer), scorer, timeout_s, workers)]

    correctness.__name__ = f"correct_{scorer}"
    return correctness


VLLM_PORT_ENV = ("HARNESS_VLLM_SERVER_PORT", "HARNESS_VLLM_GROUP_PORT")  # set by scripts/train-with-vllm-server.sh
VLLM_HOST_ENV = "HARNESS_VLLM_SERVER_HOST"  # the address the script's server listens on (loopback by default)


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
        out.update(vllm_server_host=env.get(VLLM_HOST_ENV, "127.0.0.1"),
                   vllm_server_port=int(env.get(VLLM_PORT_ENV[0], 8000)),
                   vllm_group_port=int(env.get(VLLM_PORT_ENV[1], 51216)),
                   vllm_server_timeout=1800.0)  # the server loads the model while the trainer starts
    return out


def grpo_config(preset: PresetConfig, out_dir: Path, seed: int) -> GRPOConfig:
    """TRL settings derived from the preset. TRL's loss switches are inert: the loss is ``harness.train.actor``'s.
    The budget stops the run (``BudgetCallback``); ``max_steps`` is the budget for a steps budget, else a safety cap.
    ``train.mini_batches`` and ``ppo_epochs`` are TRL's ``steps_per_generation`` and ``num_iterations``; how the
    generation batch is split and where the old log-probs come from is ``harness.train.actor.update_schedule``.

    vLLM (``train.use_vllm``): TRL generates with vLLM, colocated in each training process or on a server
    (``vllm_settings``). ``vllm_importance_sampling_correction`` stays off: TRL would then compute the sampler's
    log-probs and hand ``importance_sampling_ratio`` to the loss, but the actor's loss never reads it, so the
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
        beta=0.0,  # the reference forward, when train.beta > 0, runs in the actor on the kept batch
        epsilon=train.clip_eps_low,
        epsilon_high=train.clip_eps_high,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="steps" if train.save_every_steps else "no",
        save_steps=train.save_every_steps or 500,
        save_only_model=False,
        # rotation is the harness's (TargetedGRPOTrainer._save_checkpoint): after every process has written and the
        # folder is marked complete, never the last complete one
        save_total_limit=None,
        ddp_timeout=train.collective_timeout_s,  # the process group exists already (run.py); same value
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
