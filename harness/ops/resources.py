"""Cluster jobs: each rule's Snakemake resources, the train job's launch command, job counts and GPU-hours.

The Snakefile calls these small pure functions of the resolved configuration (tests/test_cluster.py checks them
and the DAG they give); ``harness plan`` prints the cost of a sweep from them.

- ``snakemake_resources(job)``: a rule's ``resources:`` from ``resources.<rule>`` of the preset. Keys are the
  ones the SLURM executor plugin reads (``gpu``, ``gpu_model``, ``cpus_per_gpu``, ``mem_mb``, ``runtime``,
  ``slurm_partition``, ``slurm_account``, ``slurm_extra``); the profile (profiles/slurm/profile.yaml) only sets
  executor options.
- ``train_command(preset, ...)``: ``harness train`` directly (``train.launcher=python``: one process, CPU or one
  GPU), or through ``accelerate launch`` with the shipped config of ``train.distributed``
  (configs/accelerate/<ddp|deepspeed_zero3|fsdp>.yaml) and one process per GPU; with ``train.vllm_mode=server``
  wrapped in scripts/train-with-vllm-server.sh, which starts TRL's vLLM server on the job's last
  ``train.vllm_tensor_parallel_size`` GPUs and trains on the others.
- ``job_counts`` / ``plan``: how many jobs of each rule a sweep has and what they cost in GPU-hours; ``format_plan``
  adds each GPU rule's peak memory per device (harness/config/memory.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.config.launch import training_processes, vllm_server_gpus
from harness.config.loading import load_method
from harness.config.memory import format_memory, memory_problems
from harness.config.paths import REPO_ROOT
from harness.config.schema import JobResources, PresetConfig, Resolved

ACCELERATE_DIR = REPO_ROOT / "configs" / "accelerate"
VLLM_SERVER_SCRIPT = REPO_ROOT / "scripts" / "train-with-vllm-server.sh"
RULE_RESOURCES = {"data": "data", "warmstart": "warmstart", "fetch": "warmstart", "train": "train", "eval": "eval",
                  "eval_warmstart": "eval", "report": "report"}  # rule -> section of ``resources`` it takes
# (eval_warmstart: the warm start's evaluation when eval.job_scope=run; with job_scope=checkpoint the eval rule
# evaluates it like any checkpoint. A run-scope eval job evaluates all checkpoints of a run: resources.eval is per
# job, so its runtime and estimate_minutes must cover them all.)


def snakemake_resources(job: JobResources) -> dict[str, int | str]:
    """A rule's ``resources:`` mapping. ``gpu`` is always present (0 for CPU jobs), so a local run can cap GPUs
    with ``--resources gpu=N``; empty strings are left out, so the cluster's defaults apply."""
    out: dict[str, int | str] = {"gpu": job.gpus, "mem_mb": job.mem_mb, "runtime": job.runtime}
    if job.gpus:
        out["cpus_per_gpu"] = job.cpus_per_gpu
        if job.gpu_model:
            out["gpu_model"] = job.gpu_model
    for key, value in (("slurm_partition", job.partition), ("slurm_account", job.account),
                       ("slurm_extra", job.extra)):
        if value:
            out[key] = value
    return out


def rule_resources(preset: PresetConfig) -> dict[str, dict[str, int | str]]:
    """``snakemake_resources`` for every rule of the Snakefile."""
    return {rule: snakemake_resources(getattr(preset.resources, section)) for rule, section in RULE_RESOURCES.items()}


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
        command = " ".join([
            "accelerate launch", "--config_file", shlex.quote(str(accelerate_config(train.distributed))),
            *deepspeed_config_arguments(train.distributed),
            "--num_processes", str(training_processes(preset)), "--num_machines 1",
            "--main_process_port 0",  # a free port: several train jobs may share a node
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


def plan_warnings(resolved: Resolved) -> list[str]:
    """Settings that would make jobs fail on a cluster, found before submitting anything."""
    preset = resolved.preset
    train_job = preset.resources.train
    wall = train_wall_seconds(preset)
    warnings = []
    if wall is not None and train_job.runtime * 60 < wall:
        resume = ("it resumes from its last trainer checkpoint when rerun (train.save_every_steps="
                  f"{preset.train.save_every_steps})" if preset.train.save_every_steps else
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
    lines += [f"warning: {w}" for w in plan_warnings(resolved)]
    memory = format_memory(resolved.preset, needs_reference(resolved))
    lines += ["", *memory] if memory else []
    return "\n".join(lines)


def needs_reference(resolved: Resolved) -> bool:
    """Whether a train job holds a reference model: ``train.beta`` > 0 or a trained label's method reads
    ``ref_logp`` (the trainer's rule, harness/train/trl/trainer.py)."""
    from methods.registry import get_method_class

    released = released_checkpoints(resolved)
    return resolved.preset.train.beta > 0 or any(
        "ref_logp" in get_method_class(resolved.methods[label].name).needs
        for label in resolved.sweep.methods if label not in released and label in resolved.methods)


def plan_memory_problems(resolved: Resolved) -> list[str]:
    """GPU rules that do not fit the device (``harness plan`` fails on them after printing the plan)."""
    return memory_problems(resolved.preset, needs_reference(resolved))
