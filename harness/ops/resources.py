"""Cluster jobs: each rule's Snakemake resources, the train job's launch command, job counts and GPU-hours.

The Snakefile calls these small pure functions of the resolved configuration (tests/test_cluster.py checks them
and the DAG they give); ``harness plan`` prints the cost of a sweep from them.

- ``snakemake_resources(job, gpu_request)``: a rule's ``resources:`` from ``resources.<rule>`` of the preset. Keys
  are the ones the SLURM executor plugin reads (``gpu``, ``gpu_model``, ``cpus_per_gpu``, ``gres``,
  ``cpus_per_task``, ``nodes``, ``mem_mb``, ``runtime``, ``slurm_partition``, ``slurm_account``, ``slurm_extra``);
  the profile (profiles/slurm/profile.yaml) only sets executor options. ``sbatch_command`` asks the installed plugin
  which sbatch command line a rule's resources become.
- ``train_retries(preset)``: rule train's ``retries:``, so that its time limit x (retries + 1) covers the training
  time ``harness plan`` budgets (a resubmitted job resumes from its last trainer checkpoint).
- ``train_command(preset, ...)``: ``harness train`` directly (``train.launcher=python``: one process, CPU or one
  GPU), or through ``accelerate launch`` (on loopback: harness/ops/loopback_launch.py) with the shipped config of
  ``train.distributed`` (configs/accelerate/<ddp|deepspeed_zero3|fsdp>.yaml) and one process per GPU; with
  ``train.vllm_mode=server`` wrapped in scripts/train-with-vllm-server.sh, which starts TRL's vLLM server on the
  job's last ``train.vllm_tensor_parallel_size`` GPUs and trains on the others.
- ``job_counts`` / ``plan``: how many jobs of each rule a sweep has and what they cost in GPU-hours; ``format_plan``
  adds the train rule's retries, the disk its checkpoints take (``checkpoint_disk``) and each GPU rule's peak memory
  per device (harness/config/memory.py).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.config.launch import training_processes, vllm_server_gpus
from harness.config.loading import load_method
from harness.config.memory import DTYPE_BYTES, GIB, architecture, format_memory, memory_problems
from harness.config.paths import REPO_ROOT
from harness.config.schema import JobResources, PresetConfig, Resolved

ACCELERATE_DIR = REPO_ROOT / "configs" / "accelerate"
VLLM_SERVER_SCRIPT = REPO_ROOT / "scripts" / "train-with-vllm-server.sh"
LOOPBACK_LAUNCH = "python -m harness.ops.loopback_launch"  # accelerate launch on 127.0.0.1
RULE_RESOURCES = {"data": "data", "warmstart": "warmstart", "fetch": "warmstart", "train": "train", "eval": "eval",
                  "eval_warmstart": "eval", "report": "report"}  # rule -> section of ``resources`` it takes
# (eval_warmstart: the warm start's evaluation when eval.job_scope=run; with job_scope=checkpoint the eval rule
# evaluates it like any checkpoint. A run-scope eval job evaluates all checkpoints of a run: resources.eval is per
# job, so its runtime and estimate_minutes must cover them all.)


def snakemake_resources(job: JobResources, gpu_request: str = "gpus") -> dict[str, int | str]:
    """A rule's ``resources:`` mapping; empty strings are left out, so the cluster's defaults apply.

    A GPU job asks for one node (``nodes`` -> ``--nodes=1``: a train job is one ``accelerate launch`` on one
    machine, an eval job one vLLM engine) and for its GPUs in the form of ``gpu_request``: ``gpus``, the plugin's
    ``gpu`` (and ``gpu_model``) -> ``--gpus=[<model>:]N`` with ``cpus_per_gpu`` -> ``--cpus-per-gpu``; or ``gres``,
    the plugin's ``gres`` -> ``--gres=gpu:[<model>:]N`` with ``cpus_per_task`` -> ``--cpus-per-task`` = GPUs x
    cpus_per_gpu (the one form every Slurm takes with --gres), and no ``gpu`` key: the plugin would add ``--gpus``
    for it. ``gpu`` is otherwise always present (0 for CPU jobs), so a local run can cap GPUs with
    ``--resources gpu=N``. CPU jobs are the same in both forms (``--cpus-per-task`` from the rule's threads)."""
    if not job.gpus:
        out: dict[str, int | str] = {"gpu": 0, "mem_mb": job.mem_mb, "runtime": job.runtime}
    elif gpu_request == "gres":
        model = f"{job.gpu_model}:" if job.gpu_model else ""
        out = {"gres": f"gpu:{model}{job.gpus}", "cpus_per_task": job.gpus * job.cpus_per_gpu, "nodes": 1,
               "mem_mb": job.mem_mb, "runtime": job.runtime}
    else:
        out = {"gpu": job.gpus, "mem_mb": job.mem_mb, "runtime": job.runtime, "cpus_per_gpu": job.cpus_per_gpu,
               "nodes": 1}
        if job.gpu_model:
            out["gpu_model"] = job.gpu_model
    for key, value in (("slurm_partition", job.partition), ("slurm_account", job.account),
                       ("slurm_extra", job.extra)):
        if value:
            out[key] = value
    return out


def rule_resources(preset: PresetConfig) -> dict[str, dict[str, int | str]]:
    """``snakemake_resources`` for every rule of the Snakefile."""
    gpu_request = preset.resources.gpu_request
    return {rule: snakemake_resources(getattr(preset.resources, section), gpu_request)
            for rule, section in RULE_RESOURCES.items()}


def sbatch_command(resources: dict[str, int | str], threads: int = 1, workdir: str = ".",
                   log: str = "slurm-%j.log") -> str:
    """The sbatch command line (without the job script) that the installed SLURM executor plugin builds for a job
    with these ``resources`` and ``threads``: its own ``get_submit_command`` and ``set_gres_string``, which it runs
    inside every submission of a live Snakemake run. Account and partition are passed as given (the plugin would
    check them with sacctmgr/sinfo first), no executor settings (qos, requeue) apply. Needs the `cluster` extra."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(dict):  # Snakemake's job.resources: .get() and attribute access
        def __getattr__(self, name):
            try:
                return self[name]
            except KeyError:
                raise AttributeError(name) from None

    class Job:
        def __init__(self):
            self.resources, self.threads = Resources(resources), threads

    job = Job()
    account = f" -A {shlex.quote(str(resources['slurm_account']))}" if resources.get("slurm_account") else ""
    partition = f" -p {shlex.quote(str(resources['slurm_partition']))}" if resources.get("slurm_partition") else ""
    params = {"run_uuid": "harness-sbatch-check", "slurm_logfile": log, "comment_str": "harness_sbatch_check",
              "account": account, "partition": partition, "workdir": workdir}
    return get_submit_command(job, params) + set_gres_string(job)


def mixed_precision(dtype: str) -> str:
    """accelerate's --mixed_precision for ``model.dtype``."""
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "no")


def accelerate_config(distributed: str) -> Path:
    return ACCELERATE_DIR / f"{distributed}.yaml"


def deepspeed_config_arguments(distributed: str) -> list[str]:
    """``--deepspeed_config_file`` for DeepSpeed backends: the JSON beside the accelerate config (an absolute path on
    the command line, as the job's working directory may differ)."""
    json_config = ACCELERATE_DIR / f"{distributed}.json"
    return ["--deepspeed_config_file", shlex.quote(str(json_config))] if distributed.startswith("deepspeed") else []


def train_command(preset: PresetConfig, harness_args: str, model_dir: Path | str, log: str = "{log}") -> str:
    """The train rule's shell command (Snakemake placeholders in ``harness_args`` and ``log`` pass through).

    ``harness_args``: the arguments after ``harness``, e.g. ``train --sweep F --method {wildcards.method} ...``;
    ``model_dir``: the starting policy, which a vLLM server loads before the first weight sync.
    """
    train = preset.train
    if train.launcher == "python":
        command = f"harness {harness_args}"
    else:
        # accelerate launch with its rendezvous on 127.0.0.1 and a port the kernel assigns and the launcher holds
        # (several train jobs may share a node): harness/ops/loopback_launch.py
        command = " ".join([
            LOOPBACK_LAUNCH, "--config_file", shlex.quote(str(accelerate_config(train.distributed))),
            *deepspeed_config_arguments(train.distributed),
            "--num_processes", str(training_processes(preset)), "--num_machines 1",
            "--mixed_precision", mixed_precision(preset.model.dtype), "-m harness.cli", harness_args])
    server = vllm_server_gpus(train)
    if server:
        command = " ".join(["bash", shlex.quote(str(VLLM_SERVER_SCRIPT)), shlex.quote(str(model_dir)), str(server),
                            str(train.vllm_gpu_memory_utilization), str(train.vllm_max_model_length),
                            f"{log}.vllm", "--", command])
    return f"{command} > {log} 2>&1"


# --- job counts and cost ------------------------------------------------------------------------------------------


def released_checkpoints(resolved: Resolved) -> dict[str, str]:
    """Eval-only labels of the sweep (their method config names a ``checkpoint``) -> that checkpoint."""
    search_dirs = resolved.sweep.method_config_dirs
    specs = [load_method(label, search_dirs=search_dirs) for label in resolved.sweep.methods]
    return {spec.label: spec.checkpoint for spec in specs if spec.checkpoint}


def job_counts(resolved: Resolved) -> dict[str, int]:
    """Jobs per rule of the full DAG (what ``snakemake -n`` lists on a fresh results folder)."""
    sweep = resolved.sweep
    released = released_checkpoints(resolved)
    trained = [label for label in sweep.methods if label not in released]
    n_ckpts = len(resolved.preset.train.budget.checkpoint_fractions)
    counts = {"data": 1, "warmstart": 1, "train": len(trained) * len(sweep.seeds),
              "fetch": len(released) * len(sweep.seeds)}
    if resolved.preset.eval.job_scope == "run":  # one job per run, the warm start (reference row) in its own rule
        counts.update(eval=len(sweep.methods) * len(sweep.seeds), eval_warmstart=1)
    else:  # one job per checkpoint, the warm start's among them
        counts["eval"] = len(sweep.methods) * len(sweep.seeds) * n_ckpts + 1
    counts.update(report=1, all=1)
    return {rule: n for rule, n in counts.items() if n}


@dataclass
class PlanRow:
    rule: str
    jobs: int
    gpus: int  # per job
    hours: float  # per job
    basis: str  # where ``hours`` comes from

    @property
    def gpu_hours(self) -> float:
        return self.jobs * self.gpus * self.hours


def _estimate_hours(job: JobResources) -> tuple[float, str]:
    if job.estimate_minutes > 0:
        return job.estimate_minutes / 60.0, "resources estimate_minutes"
    return job.runtime / 60.0, "resources runtime limit (upper bound)"


def train_wall_seconds(preset: PresetConfig) -> float | None:
    """Wall seconds of one train job's budget when it is counted in ``accel_seconds``, else None.

    ``accel_seconds`` are device-seconds: every training process's step seconds, summed over the processes
    (harness/train/budget.py), so a job of P training processes spends its amount in amount / P seconds of wall
    time; the GPUs of a vLLM server are held that long too but not counted."""
    budget = preset.train.budget
    if budget.kind != "accel_seconds":
        return None
    return budget.amount / max(training_processes(preset), 1)


def plan(resolved: Resolved) -> list[PlanRow]:
    """Cost of every rule: train from an ``accel_seconds`` budget (device-seconds summed over the training GPUs:
    a job holds its GPUs for amount / training processes seconds), everything else, and a train budget in other
    units, from ``resources.<rule>.estimate_minutes`` (or its runtime limit)."""
    preset, counts = resolved.preset, job_counts(resolved)
    res = preset.resources
    wall = train_wall_seconds(preset)
    rows = []
    for rule, section in RULE_RESOURCES.items():
        if rule not in counts:
            continue
        job = getattr(res, section)
        hours, basis = _estimate_hours(job)
        budget = preset.train.budget
        if rule == "train" and wall is not None:
            hours, basis = wall / 3600.0, (f"budget {budget.amount:g} accel_seconds (device-seconds) "
                                           f"over {training_processes(preset)} training process(es)")
        elif rule == "train":  # a budget in samples, tokens, steps or FLOPs takes a time only a run measures
            basis += f"; budget {budget.amount:g} {budget.kind}, time not known before a run"
        rows.append(PlanRow(rule, counts[rule], job.gpus, hours, basis))
    return rows


# --- retries of a train job that outlives its time limit ----------------------------------------------------------

PROFILE_RETRIES = 1  # profiles/slurm/profile.yaml's `retries` (tests/test_cluster.py checks that they agree)


def train_budget_minutes(preset: PresetConfig) -> float | None:
    """Minutes one train job is budgeted to train, as ``harness plan`` counts them: an ``accel_seconds`` budget's
    wall time, else ``resources.train.estimate_minutes``; None when neither gives one (a budget in samples, tokens,
    steps or FLOPs without an estimate: the time limit is then the only bound)."""
    wall = train_wall_seconds(preset)
    if wall is not None:
        return wall / 60.0
    estimate = preset.resources.train.estimate_minutes
    return estimate if estimate > 0 else None


def train_attempts_needed(preset: PresetConfig) -> int:
    """Time limits one train job needs to spend its budget: ceil(budgeted minutes / ``resources.train.runtime``)."""
    minutes = train_budget_minutes(preset)
    if minutes is None:
        return 1
    return max(1, math.ceil(minutes / preset.resources.train.runtime - 1e-9))


def train_retries(preset: PresetConfig) -> int | None:
    """Rule train's ``retries:`` (the Snakefile), or None to keep the profile's ``retries: 1`` (and none locally).

    A train job that hits its time limit is resubmitted and resumes from its last trainer checkpoint, so it needs
    ``train_attempts_needed`` attempts, and one spare (the profile's one retry: a node failure, and the loading,
    checkpoint saving and reward scoring that come on top of the budget and the steps redone after each resume):
    retries = attempts needed - 1 + PROFILE_RETRIES, so that runtime x (retries + 1) >= budgeted time + one time
    limit. None when one time limit holds the budget (the profile's retry is that spare), and when the preset saves
    no trainer checkpoints (a resubmission would start over: ``plan_warnings`` says so)."""
    needed = train_attempts_needed(preset)
    if needed == 1 or not preset.train.save_every_steps:
        return None
    return needed - 1 + PROFILE_RETRIES


def format_train_retries(preset: PresetConfig) -> str:
    runtime, minutes = preset.resources.train.runtime, train_budget_minutes(preset)
    retries = train_retries(preset)
    attempts = (retries if retries is not None else PROFILE_RETRIES) + 1
    source = (f"rule train's retries: {retries}" if retries is not None
              else f"the profile's retries: {PROFILE_RETRIES}")
    limit = f"train time limit: {runtime} min x {attempts} attempts ({source}) = {runtime * attempts / 60:.1f} h"
    if minutes is None:
        return (f"{limit}; the budget's time is not known before a run: set resources.train.estimate_minutes to "
                "size the retries")
    needed = train_attempts_needed(preset)
    if retries is None and needed > 1:
        return f"{limit}, but {minutes / 60:.2f} h budgeted needs {needed} and a resubmission would start over"
    return (f"{limit} for {minutes / 60:.2f} h budgeted: {needed} attempt(s) hold the budget, one is spare; each "
            "resubmission resumes from the last trainer checkpoint")


# --- disk of the checkpoints ----------------------------------------------------------------------------------------

# harness/train/trl/trainer.py's KEPT_TRAINER_CHECKPOINTS (importing it loads TRL; tests/test_cluster.py checks that
# they agree): rotation keeps the newest complete trainer checkpoints, and one more exists while the next is written
KEPT_TRAINER_CHECKPOINTS = 2
OPTIMIZER_BYTES_ZERO3 = 12  # DeepSpeed ZeRO-3's checkpoint: float32 master + AdamW's two float32 moments per parameter


@dataclass
class CheckpointDisk:
    """Disk of one train job's checkpoints (``checkpoint_disk``), in bytes."""

    parameters: int
    trainer_parts: list[tuple[str, float]]  # what one trainer checkpoint holds; empty without save_every_steps
    budget_checkpoints: int  # one per checkpoint fraction, the policy in model.dtype (what eval reads)
    budget_bytes: float  # one budget checkpoint
    runs: int  # train jobs of the sweep

    @property
    def trainer_bytes(self) -> float:
        return sum(size for _, size in self.trainer_parts)

    @property
    def run_peak(self) -> float:
        """A run at its largest: the kept trainer checkpoints, one more being written, every budget checkpoint."""
        trainer = (KEPT_TRAINER_CHECKPOINTS + 1) * self.trainer_bytes if self.trainer_parts else 0.0
        return trainer + self.budget_checkpoints * self.budget_bytes

    @property
    def run_final(self) -> float:
        """A finished run: the kept trainer checkpoints and the budget checkpoints."""
        return KEPT_TRAINER_CHECKPOINTS * self.trainer_bytes + self.budget_checkpoints * self.budget_bytes


def checkpoint_disk(resolved: Resolved) -> CheckpointDisk | None:
    """The checkpoints a GPU preset's train jobs write, from the model's parameter count (harness/config/memory.py):
    each trainer checkpoint (``train.save_every_steps``) holds the weights and AdamW's state, ddp: the master weights
    and two moments in ``train.master_dtype`` (transformers' model file and optimizer.pt); deepspeed_zero3: the
    weights gathered in ``model.dtype`` (stage3_gather_16bit_weights_on_model_save) and DeepSpeed's float32 masters
    and moments, sharded over the processes. Scheduler, RNG, trainer state and the ledger are small and not counted.
    None for CPU presets and models of unknown size."""
    preset = resolved.preset
    arch, runs = architecture(preset.model), job_counts(resolved).get("train", 0)
    if not preset.resources.train.gpus or arch is None or not runs:
        return None
    n, train, compute = arch.parameters, preset.train, DTYPE_BYTES[preset.model.dtype]
    if not train.save_every_steps:
        parts: list[tuple[str, float]] = []
    elif train.distributed == "deepspeed_zero3":
        parts = [(f"weights ({preset.model.dtype}, gathered)", float(n * compute)),
                 ("float32 masters + AdamW moments (sharded)", float(n * OPTIMIZER_BYTES_ZERO3))]
    else:
        master = DTYPE_BYTES[train.master_dtype]
        parts = [(f"weights ({train.master_dtype} masters)", float(n * master)),
                 (f"AdamW moments (2 x {train.master_dtype})", float(2 * n * master))]
    return CheckpointDisk(n, parts, len(train.budget.checkpoint_fractions), float(n * compute), runs)


def format_disk(resolved: Resolved) -> list[str]:
    disk = checkpoint_disk(resolved)
    if disk is None:
        return []
    preset = resolved.preset

    def gib(size: float) -> str:
        return f"{size / GIB:.1f} GiB"

    lines = [f"disk of the train jobs' checkpoints ({preset.model.name_or_path}, {disk.parameters / 1e9:.2f}B "
             "parameters), under results/<sweep>/runs/:"]
    if disk.trainer_parts:
        lines.append(f"  trainer checkpoint (every {preset.train.save_every_steps} steps): "
                     f"{gib(disk.trainer_bytes)} = " + " + ".join(f"{what} {gib(size)}"
                                                                   for what, size in disk.trainer_parts))
        lines.append(f"  {KEPT_TRAINER_CHECKPOINTS} kept per run (harness/train/trl/trainer.py rotates), one more while"
                     f" the next is written: {gib((KEPT_TRAINER_CHECKPOINTS + 1) * disk.trainer_bytes)} at most")
    else:
        lines.append("  no trainer checkpoints (train.save_every_steps=0)")
    lines.append(f"  budget checkpoints: {disk.budget_checkpoints} x {gib(disk.budget_bytes)} "
                 f"({preset.model.dtype}) = {gib(disk.budget_checkpoints * disk.budget_bytes)}")
    lines.append(f"  sweep: {disk.runs} runs x {gib(disk.run_peak)} = {gib(disk.runs * disk.run_peak)} at most, "
                 f"{gib(disk.runs * disk.run_final)} when training is done")
    return lines


def plan_warnings(resolved: Resolved) -> list[str]:
    """Settings that would make jobs fail on a cluster, found before submitting anything."""
    preset = resolved.preset
    train_job = preset.resources.train
    wall = train_wall_seconds(preset)
    warnings = []
    if wall is not None and train_job.runtime * 60 < wall:
        resume = ("it resumes from its last trainer checkpoint when rerun (train.save_every_steps="
                  f"{preset.train.save_every_steps}; rule train's retries: {train_retries(preset)} resubmit it)"
                  if preset.train.save_every_steps else
                  "set train.save_every_steps > 0 so that a rerun resumes instead of starting over")
        warnings.append(f"a train job needs at least {wall / 60:.0f} min of wall time (its accel_seconds budget over "
                        f"{training_processes(preset)} training GPUs) but resources.train.runtime is "
                        f"{train_job.runtime} min: SLURM stops it early; {resume}")
    if any(getattr(preset.resources, s).gpus for s in ("data", "warmstart", "report")):
        warnings.append("data, warmstart and report are CPU jobs; their resources ask for GPUs")
    return warnings


def format_plan(resolved: Resolved) -> str:
    rows = plan(resolved)
    total = sum(r.gpu_hours for r in rows)
    lines = [f"sweep {resolved.sweep.name!r} (preset {resolved.preset.name!r}): {len(resolved.sweep.methods)} "
             f"labels x {len(resolved.sweep.seeds)} seeds, {len(resolved.preset.train.budget.checkpoint_fractions)} "
             f"checkpoint(s) per run, {len(resolved.preset.eval.benchmarks)} benchmarks per eval job", "",
             f"{'rule':<10} {'jobs':>5} {'GPUs/job':>9} {'h/job':>8} {'GPU-h':>10}  basis"]
    for r in rows:
        lines.append(f"{r.rule:<10} {r.jobs:>5} {r.gpus:>9} {r.hours:>8.2f} {r.gpu_hours:>10.1f}  {r.basis}")
    lines += [f"{'total':<10} {sum(r.jobs for r in rows):>5} {'':>9} {'':>8} {total:>10.1f}  GPU-hours", ""]
    train = next((r for r in rows if r.rule == "train"), None)
    if train and train.jobs:
        lines.append(f"train: {train.jobs} runs x {train.gpus} GPUs x {train.hours:.2f} h; loading, checkpoint "
                     "saving and reward scoring come on top of the budget")
        if train.gpus:  # CPU presets run locally, where no time limit stops a job
            lines.append(format_train_retries(resolved.preset))
    lines += [f"warning: {w}" for w in plan_warnings(resolved)]
    disk = format_disk(resolved)
    lines += ["", *disk] if disk else []
    memory = format_memory(resolved.preset, needs_reference(resolved))
    lines += ["", *memory] if memory else []
    return "\n".join(lines)


def needs_reference(resolved: Resolved) -> bool:
    """Whether a train job holds a reference model: a trained label's step reads ``ref_logp`` (the trainer's rule,
    ``harness.train.hooks.statistics_read``: ``train.beta`` > 0, or a method reading it)."""
    from harness.train.hooks import statistics_read
    from methods.registry import get_method_class

    released = released_checkpoints(resolved)
    beta = resolved.preset.train.beta
    return any("ref_logp" in statistics_read(get_method_class(spec.name)(spec.params), beta)
               for label, spec in resolved.methods.items() if label in resolved.sweep.methods and label not in released)


def plan_memory_problems(resolved: Resolved) -> list[str]:
    """GPU rules that do not fit the device (``harness plan`` fails on them after printing the plan)."""
    return memory_problems(resolved.preset, needs_reference(resolved))
