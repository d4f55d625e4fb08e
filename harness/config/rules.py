"""Rules across keys: what a single setting's declaration (``methods/declaration.py``) cannot say.

``section_problems`` holds the rules inside one section (run by the loader whenever a schema is built from YAML or
a resolved sweep), ``sweep_problems`` and ``missing_input_files`` the sweep's, ``check_launch`` those across
sections and method labels (run once per resolved sweep), ``dynamic_sampling_problems`` those the trainer checks
again for its own process count.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from harness.config.choices import GENERATION_COUNTING_BUDGET_KINDS
from harness.config.launch import per_device_rollouts, training_processes, vllm_server_gpus
from harness.config.memory import memory_problems
from harness.config.paths import LABEL_PATTERN, WARMSTART_LABEL, checkpoint_name, resolve_repo_path
from harness.config.schema import (
    COMMIT_SHA,
    BudgetConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    HubDataConfig,
    MethodSpec,
    ModelConfig,
    PresetConfig,
    RewardValuesConfig,
    SweepConfig,
    TrainConfig,
    column_path_parts,
    is_local_model,
)

# a sweep name is one folder name under results_dir (spaces allowed: job commands quote every path)
SWEEP_NAME = re.compile(r"[^/\x00-\x1f.][^/\x00-\x1f]*")


def hub_config_problems(hub: HubDataConfig) -> list[str]:
    """What keeps ``data.hub`` from naming one fixed set of rows (checked when ``data.kind`` is hub)."""
    problems = [f"key 'data.hub.{key}' is empty ({what})" for key, what in (
        ("repo", "the dataset's hub id"), ("problem", "the column path of the problem text"),
        ("answer", "the column path of the final answer")) if not getattr(hub, key)]
    if not hub.files:
        problems.append("key 'data.hub.files' is empty (the repo's .parquet / .jsonl files to read, in order)")
    for key in ("problem", "answer"):
        if getattr(hub, key):
            try:
                column_path_parts(getattr(hub, key))
            except ValueError as exc:
                problems.append(f"key 'data.hub.{key}': {exc}")
    if not COMMIT_SHA.fullmatch(hub.revision) and not hub.allow_unpinned:
        problems.append(f"key 'data.hub.revision': {hub.revision!r} is not a commit sha (40 lower-case hex digits): "
                        "a branch or tag (main) can move, so the rows would not be fixed. Pin the commit (the "
                        "dataset page's history, or `HfApi().dataset_info(repo).sha`), or set "
                        "data.hub.allow_unpinned=true to read it anyway (the data job records the commit it got)")
    bad = [line for line in hub.sha256 if not re.fullmatch(r"[0-9a-f]{64}  \S.*", line)]
    if bad:
        problems.append(f"key 'data.hub.sha256': {bad} are not sha256sum lines '<64 lower-case hex>  <repo path>'")
    return problems


def model_pin_problems(model: ModelConfig) -> list[str]:
    """A pretrained hub model must be named at a commit (``model.revision``, 40 hex digits) unless
    ``model.allow_unpinned``: a branch (main, or "" for the default branch) can move under a running sweep."""
    if model.kind != "pretrained" or not model.name_or_path or is_local_model(model.name_or_path):
        return []
    if COMMIT_SHA.fullmatch(model.revision) or model.allow_unpinned:
        return []
    shown = repr(model.revision) if model.revision else "'' (the default branch)"
    return [f"key 'model.revision': {shown} is not a commit sha (40 lower-case hex digits) of hub model "
            f"{model.name_or_path!r}: a branch or tag can move, so the weights would not be fixed. Pin the commit "
            "(`harness prefetch --sweep <sweep>` on a node with hub access prints it as `revision: <sha>`), or set "
            "model.allow_unpinned=true to load it anyway (the warm start records the commit it got)"]


def _data_problems(data: DataConfig) -> list[str]:
    problems = hub_config_problems(data.hub) if data.kind == "hub" else []
    problems = ["data.kind=hub: " + "; ".join(problems)] if problems else []
    if data.max_ngram_overlap > 0 and not data.overlap_reason.strip():
        problems.append(f"key 'data.overlap_reason' is empty, but data.max_ngram_overlap={data.max_ngram_overlap:g} "
                        "lets training rows share word 8-grams with the benchmarks: say why the preset trains on "
                        "them (the measured overlap and what the shared 8-grams are), or set it to 0")
    return problems


def _budget_problems(budget: BudgetConfig) -> list[str]:
    fractions = list(budget.checkpoint_fractions)
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions) or fractions != sorted(set(fractions)):
        return [f"checkpoint_fractions must be increasing values in (0, 1], got {fractions}"]
    if fractions[-1] != 1.0:
        return [f"checkpoint_fractions must end with 1.0 (the full budget), got {fractions}"]
    names = [checkpoint_name(f) for f in fractions]
    shared = sorted({name for name in names if names.count(name) > 1})
    if shared:
        return [f"key 'train.budget.checkpoint_fractions': {fractions} name the same checkpoint folder {shared} (a "
                "fraction is named by its whole percent: 0.25 -> ckpt-025)"]
    return []


def _reward_values_problems(values: RewardValuesConfig) -> list[str]:
    if not values.correct > values.wrong:
        return [f"key 'train.reward_values': correct={values.correct} must be greater than wrong={values.wrong}"]
    return []


def _train_problems(train: TrainConfig) -> list[str]:
    problems = []
    if 0 < train.loss_micro_batch_tokens <= train.max_completion_length:
        problems.append(f"key 'train.loss_micro_batch_tokens': {train.loss_micro_batch_tokens} must be 0 or larger "
                        f"than train.max_completion_length={train.max_completion_length} (a micro-batch holds at "
                        "least one row: prompt + completion; verl asserts max prompt + max response fit)")
    if train.overlong.buffer > 0 and train.overlong.buffer >= train.max_completion_length:
        problems.append(f"key 'train.overlong.buffer': {train.overlong.buffer} must be smaller than "
                        f"train.max_completion_length={train.max_completion_length} (the buffer is the last part of "
                        "the maximum length; 0 = off)")
    return problems


def unusable_names(names: list[str]) -> list[str]:
    """The names that are not a method label's kind of name (``LABEL_PATTERN``): one path component, no quoting."""
    return [name for name in names if not re.fullmatch(LABEL_PATTERN, name)]


def _eval_problems(eval_cfg: EvalConfig) -> list[str]:
    bad = unusable_names(list(eval_cfg.benchmarks))
    if bad:
        return [f"key 'eval.benchmarks': names {bad} may hold only letters, digits, '_' and '-', as method labels "
                "(each is a folder name under the sweep's eval/)"]
    return []


SECTION_RULES = {DataConfig: _data_problems, BudgetConfig: _budget_problems, EvalConfig: _eval_problems,
                 RewardValuesConfig: _reward_values_problems, TrainConfig: _train_problems,
                 ModelConfig: model_pin_problems}


def section_problems(obj: Any) -> list[str]:
    """The rules of ``SECTION_RULES`` over a schema tree, inner sections first."""
    if not dataclasses.is_dataclass(obj):
        return []
    inner = [p for f in dataclasses.fields(obj) for p in section_problems(getattr(obj, f.name))]
    return inner + SECTION_RULES.get(type(obj), lambda _: [])(obj)


def non_finite_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys of NaN and infinite numbers in a plain mapping (lists: ``key[i]``)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [prefix]
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in non_finite_keys(item, f"{prefix}.{key}" if prefix else key)]
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in non_finite_keys(item, f"{prefix}[{i}]")]
    return []


def sweep_problems(sweep: SweepConfig) -> list[str]:
    """What makes the labels, seeds or name unusable as result paths and Snakemake wildcards, or counts a run
    twice."""
    problems = []
    if not SWEEP_NAME.fullmatch(sweep.name):
        problems.append(f"key 'name': {sweep.name!r} must be one folder name (no '/', no control characters, not "
                        "starting with '.')")
    bad = unusable_names(sweep.methods)
    if bad:
        problems.append(f"key 'methods': labels {bad} may hold only letters, digits, '_' and '-' (they are file "
                        "names and Snakemake wildcards)")
    if WARMSTART_LABEL in sweep.methods:
        problems.append(f"key 'methods': {WARMSTART_LABEL!r} is the warm start's own row, not a method label")
    for key, values in (("methods", sweep.methods), ("seeds", sweep.seeds)):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(f"key '{key}': {repeated} listed more than once (each run would count twice)")
    if not sweep.seeds:
        problems.append("key 'seeds': at least one seed is needed")
    negative = [s for s in sweep.seeds if s < 0]
    if negative:
        problems.append(f"key 'seeds': {negative} are negative (seeds are non-negative integers)")
    return problems


SEED_LIMIT = 2**32  # numpy's RandomState (seeded by transformers, accelerate, lm-eval and vLLM) takes no more
VLLM_ENGINE_SEEDS_PER_RUN = 1 << 16  # harness/train/trl/vllm.py ENGINE_SEEDS_PER_RUN (a test keeps the two equal)


def run_seed_limit(preset: PresetConfig) -> tuple[int, str]:
    """(bound, why): every run seed (sweep seed + the label's seed_offset) must be below the bound. TRL seeds each
    training process with run seed + its index; a colocated vLLM engine gets run seed x 2**16 + its index."""
    train = preset.train
    if train.use_vllm and train.vllm_mode == "colocate":
        return SEED_LIMIT // VLLM_ENGINE_SEEDS_PER_RUN, "colocated vLLM engine i is seeded with run seed x 2**16 + i"
    processes = max(training_processes(preset), 1)
    return SEED_LIMIT - processes + 1, f"TRL seeds training process i with run seed + i ({processes} processes)"


def seed_problems(seeds: list[int], specs: list[MethodSpec], preset: PresetConfig) -> list[str]:
    """Run seeds that numpy's seeding would refuse in every train job of the sweep (``run_seed_limit``)."""
    limit, why = run_seed_limit(preset)
    largest = max(seeds, default=0)
    over = {spec.label: largest + spec.seed_offset for spec in specs if largest + spec.seed_offset >= limit}
    if not over:
        return []
    return [f"key 'seeds': seed {largest} gives the run seeds (seed + the label's seed_offset) {over}, but run seeds "
            f"must be below {limit}: numpy takes seeds below 2**32, and {why}"]


def missing_input_files(preset: PresetConfig) -> list[str]:
    """Benchmark and training files the preset names that are not there (``{data_dir}`` files are generated)."""
    files = {f"eval.benchmarks.{name}.file": bench.file for name, bench in sorted(preset.eval.benchmarks.items())}
    if preset.data.kind in ("jsonl", "mixed"):
        files["data.train_file"] = preset.data.train_file
    return [f"key '{key}': no file {resolve_repo_path(path)}" for key, path in files.items()
            if "{data_dir}" not in path and not resolve_repo_path(path).is_file()]


# accelerate's FSDP on a machine without CUDA trains unsharded (DDP, or independent processes) without a warning, so no
# CPU rehearsal can exercise it, and a reading of its GPU path found faults no run has shown fixed (issue 33 item 8)
FSDP_NEVER_RUN = (
    "train.distributed=fsdp has never run (no GPU here, and accelerate's FSDP runs unsharded on CPU, so no rehearsal "
    "covers it; known faults: FSDP2's input casting copies the packed-attention layout, no_sync keeps whole unsharded "
    "gradients across backward chunks, RAM-efficient loading leaves the reference model on meta, full-state-dict "
    "checkpoints gather the optimizer on rank 0): use deepspeed_zero3 (rehearsed on CPU) or ddp")


# the reference policy is a frozen copy made before accelerate prepares the model: DDP has moved the policy to its
# device by then, DeepSpeed has not (it would stay whole on the CPU, next to the sharded policy; issue 33 item 9)
ZERO3_REFERENCE = (
    "a reference model (train.beta > 0, or a method reading ref_logp) is not supported with "
    "train.distributed=deepspeed_zero3: it is not prepared with the engine (it would stay whole on the CPU); use "
    "beta 0 or ddp")


def check_launch(preset: PresetConfig, released: list[MethodSpec], seeds: list[int], origin: str) -> None:
    """Checks across keys and sections: the launch settings against the GPUs the jobs get, the mini-batches against
    the prompt groups of each process, eval-only labels, and the GPU jobs' peak memory per device against
    ``resources.device_memory_gb``."""
    train, res = preset.train, preset.resources
    server, processes = vllm_server_gpus(train), training_processes(preset)
    problems = []
    if train.launcher == "python" and res.train.gpus > 1 + server:
        problems.append(f"train.launcher=python runs one process on one GPU but resources.train.gpus="
                        f"{res.train.gpus}; set train.launcher=accelerate to train on all of them")
    if train.launcher == "python" and train.distributed != "ddp":
        problems.append(f"train.distributed={train.distributed} needs train.launcher=accelerate")
    if train.distributed == "fsdp":
        problems.append(FSDP_NEVER_RUN)
    if train.distributed == "deepspeed_zero3" and train.beta > 0:
        problems.append(ZERO3_REFERENCE)
    if train.launcher == "accelerate" and processes < 1:
        problems.append(f"train.launcher=accelerate needs resources.train.gpus >= {server + 1} (one per training "
                        f"process{', plus the vLLM server GPUs' if server else ''}), got {res.train.gpus}")
    if train.use_vllm and train.vllm_device == "cpu":
        problems += [f"train.vllm_device=cpu {need}, got {got}" for need, got, ok in (
            ("runs vLLM's CPU build on the job's CPUs: resources.train.gpus must be 0", res.train.gpus,
             res.train.gpus == 0),
            ("colocates one engine with the one training process: train.launcher must be python", train.launcher,
             train.launcher == "python"),
            ("needs train.vllm_mode=colocate", train.vllm_mode, train.vllm_mode == "colocate"),
            ("runs one engine: train.vllm_tensor_parallel_size must be 1", train.vllm_tensor_parallel_size,
             train.vllm_tensor_parallel_size == 1)) if not ok]
    elif train.use_vllm and res.train.gpus < 1:
        problems.append("train.use_vllm=true needs resources.train.gpus >= 1 (or train.vllm_device=cpu)")
    if train.use_vllm and not server and processes >= 1 and processes % train.vllm_tensor_parallel_size:
        problems.append(f"train.vllm_tensor_parallel_size={train.vllm_tensor_parallel_size} must divide the "
                        f"{processes} training processes")
    if processes >= 1:
        try:
            per_device_rollouts(train, processes)
        except ValueError as exc:  # prompts_per_step is not a multiple of the processes
            problems.append(str(exc))
    if train.master_dtype != "float32" and train.master_dtype != preset.model.dtype:
        problems.append(f"train.master_dtype={train.master_dtype} (pure {train.master_dtype} training) needs "
                        f"model.dtype={train.master_dtype}, got model.dtype={preset.model.dtype}")
    if train.clip_ratio_c is not None and not train.clip_ratio_c > 1:
        problems.append(f"train.clip_ratio_c={train.clip_ratio_c} must be > 1 (or null = no dual-clip)")
    problems += dynamic_sampling_problems(train, max(processes, 1))
    updates = train.mini_batches * train.ppo_epochs
    if train.save_every_steps % updates:
        problems.append(f"train.save_every_steps={train.save_every_steps} must be a multiple of train.mini_batches x "
                        f"train.ppo_epochs = {updates}: a trainer checkpoint inside a generation batch would resume "
                        "with other rollouts")
    vllm = preset.eval.vllm
    if preset.eval.backend == "vllm" and vllm.device == "cpu":
        if res.eval.gpus:
            problems.append(f"eval.vllm.device=cpu runs vLLM's CPU build on the job's CPUs: resources.eval.gpus "
                            f"must be 0, got {res.eval.gpus}")
        if vllm.tensor_parallel_size * vllm.data_parallel_size != 1:
            problems.append("eval.vllm.device=cpu runs one engine: eval.vllm.tensor_parallel_size and "
                            "data_parallel_size must be 1")
    elif preset.eval.backend == "vllm" and res.eval.gpus != vllm.tensor_parallel_size * vllm.data_parallel_size:
        problems.append(f"eval.backend=vllm with tensor_parallel_size={vllm.tensor_parallel_size} x "
                        f"data_parallel_size={vllm.data_parallel_size} needs resources.eval.gpus="
                        f"{vllm.tensor_parallel_size * vllm.data_parallel_size}, got {res.eval.gpus}")
    if released and len(seeds) != 1:
        problems.append(f"labels {[s.label for s in released]} evaluate one released checkpoint each (key "
                        f"'checkpoint'), which has no seeds: such a sweep takes one seed, got {seeds}")
    if released and list(train.budget.checkpoint_fractions) != [1.0]:
        problems.append(f"labels {[s.label for s in released]} evaluate one released checkpoint each (key "
                        "'checkpoint'): set train.budget.checkpoint_fractions to [1.0]")
    if not problems:  # peak memory per device of the GPU jobs (analytic, harness/config/memory.py); a reference
        problems += memory_problems(preset)  # model counts here for beta > 0; `harness plan` also for methods' needs
    if problems:
        raise ConfigError(f"{origin}: " + "; ".join(problems))


def dynamic_sampling_problems(train: TrainConfig, processes: int) -> list[str]:
    """What is wrong with ``train.dynamic_sampling`` for ``processes`` training processes (checked at start and by
    the trainer): the budget must count every round's generation, and each round must hold at least one step's
    prompts and split over the processes in whole prompt groups."""
    config = train.dynamic_sampling
    if not config.enabled:
        return []
    problems = []
    if train.budget.kind not in GENERATION_COUNTING_BUDGET_KINDS:
        problems.append(f"train.dynamic_sampling.enabled=true needs a budget that counts the generation of the groups "
                        f"it discards: train.budget.kind must be one of {list(GENERATION_COUNTING_BUDGET_KINDS)}, got "
                        f"{train.budget.kind!r}")
    round_prompts = config.prompts_per_round or train.prompts_per_step
    if round_prompts < train.prompts_per_step:
        problems.append(f"train.dynamic_sampling.prompts_per_round={config.prompts_per_round} must be 0 or at least "
                        f"train.prompts_per_step={train.prompts_per_step} (a round holds at least one step's prompts)")
    elif round_prompts % processes:
        problems.append(f"train.dynamic_sampling.prompts_per_round={round_prompts} must be a multiple of the "
                        f"{processes} training processes (each process generates whole prompt groups)")
    return problems
