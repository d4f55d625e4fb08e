"""The rehearsal of a paper sweep (``harness rehearse <sweep>``): the sweep's own Snakemake DAG, launch and protocol
at a scale a 2-core CPU runs in minutes, with checks that would have caught the defects of the GPU-only code path.
What it keeps and what it replaces, and the model and rows it runs: harness/ops/rehearsal_setup.py.

Checked after the run (``check_rehearsal``, ``check_resume``): every job succeeded; each trained run's weights and
AdamW state are in the preset's ``train.master_dtype`` (float32 partitions under ZeRO-3) and the weights moved; its
ledger counts what ``harness plan`` and the fidelity table say the budget is; the leaderboard, claims table, fidelity
table (its data row with the measured 8-gram overlap), training data overlap section and HTML report were written,
and the data job's data/decontamination.json; one label's train job, killed with SIGKILL after its first trainer
checkpoint and rerun, gives the uninterrupted run's metrics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from harness.config.launch import training_processes
from harness.config.loading import load_method, resolve
from harness.config.paths import REPO_ROOT, SweepPaths
from harness.config.schema import PresetConfig
from harness.data.files import write_text_atomic
from harness.ops.rehearsal_setup import Rehearsal, engine, prepare


def snakemake_command(rehearsal: Rehearsal, out_dir: Path, cores: int, gpus: int) -> list[str]:
    """`snakemake --cores N --resources gpu=G --configfile F` on the repository's Snakefile: every rule asks for its
    GPUs as the ``gpu`` resource (harness/ops/resources.py), so G GPUs run at most G GPU-jobs at a time (two eval
    engines at half a GPU's memory each would collide, and a timing would mix jobs): ``gpu_slots``."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile"), "--cores", str(cores),
            "--resources", f"gpu={gpus}", "--configfile", str(out_dir / f"{rehearsal.name}.yaml"), "--printshellcmds"]


def gpu_slots(mode: str) -> int:
    """The ``gpu`` resource Snakemake is given: in ``cuda`` mode the GPUs torch sees; on CPU the processes one
    train job launches as its "GPUs" (``resources.train.gpus`` of the rehearsal), so train jobs run one at a time
    (two ZeRO-3 jobs of 2 processes each on 2 cores took 7x as long: each of their many collectives waits for a
    descheduled peer)."""
    if mode != "cuda":
        where = engine(mode)
        return max(where.train_gpus, where.eval_gpus)
    import torch

    return torch.cuda.device_count()


def run_snakemake(rehearsal: Rehearsal, out_dir: Path, cores: int = 2, gpus: int = 0) -> subprocess.CompletedProcess:
    """The repository's Snakefile on the rehearsal sweep, locally (``snakemake_command``)."""
    command = snakemake_command(rehearsal, out_dir, cores, gpus)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = out_dir / f"{rehearsal.name}.snakemake.log"
    log.unlink(missing_ok=True)
    with open(log, "x", encoding="utf-8") as handle:  # a new file: never through a link
        return subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def check_rehearsal(rehearsal: Rehearsal) -> list[str]:
    """What the finished rehearsal got wrong (empty: every check passed)."""
    from safetensors.torch import load_file

    resolved = resolve(rehearsal.sweep)
    paths = SweepPaths(resolved.results_dir)
    preset = resolved.preset
    problems = []
    warm = load_file(paths.warmstart_dir / "model.safetensors")
    for label in resolved.sweep.methods:
        if load_method(label, search_dirs=resolved.sweep.method_config_dirs).checkpoint:
            continue
        for seed in resolved.sweep.seeds:
            run_dir = paths.run_dir(label, seed)
            record = json.loads((run_dir / "run.json").read_text())
            problems += [f"{label}/seed{seed}: {p}" for p in _run_problems(preset, record)]
            trainer_checkpoints = sorted(run_dir.glob("trl/checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
            if not trainer_checkpoints:
                problems.append(f"{label}/seed{seed}: no trainer checkpoint (train.save_every_steps)")
                continue
            for budget_checkpoint in sorted(run_dir.glob("ckpt-*")):  # gathered whole, even from ZeRO-3 shards
                saved = load_file(budget_checkpoint / "model.safetensors")
                wrong = [k for k in warm if k not in saved or saved[k].shape != warm[k].shape]
                if wrong:
                    problems.append(f"{label}/seed{seed}: {budget_checkpoint.name} lacks or reshapes {wrong[:3]}")
            master = load_file(trainer_checkpoints[-1] / "model.safetensors")
            moved = sum(float((master[k].float() - warm[k].float()).abs().sum()) for k in warm)
            if moved == 0.0:
                flat = all(json.loads(line).get("frac_reward_zero_std") == 1.0
                           for line in paths.metrics_file(label, seed).read_text().splitlines())
                problems.append(f"{label}/seed{seed}: the weights did not move"
                                + (" (no group had a reward signal in any step)" if flat else ""))
    for name in ("leaderboard.md", "report.html", "leaderboard.csv", "leaderboard.json"):
        if not (paths.root / name).is_file():
            problems.append(f"{name} was not written")
    if not (paths.data_dir / "decontamination.json").is_file():
        problems.append("the data job wrote no data/decontamination.json (harness/data/decontamination.py)")
    if (paths.root / "leaderboard.md").is_file():
        text = (paths.root / "leaderboard.md").read_text()
        for heading in ("## Protocol fidelity", "## Claims", "## Training data overlap with the benchmarks"):
            if heading not in text:
                problems.append(f"leaderboard.md has no '{heading}' section")
        if "derived.ngram_overlap=8-gram overlap of the training rows" not in text:
            problems.append("the fidelity table's data row does not show the measured 8-gram overlap")
    return problems


def _run_problems(preset: PresetConfig, record: dict) -> list[str]:
    """A trained run's precision and its ledger against the budget's arithmetic."""
    problems = []
    precision = record.get("precision", {})
    master = "float32" if preset.train.distributed == "deepspeed_zero3" else preset.train.master_dtype
    if preset.train.distributed == "deepspeed_zero3":
        problems += _zero3_problems(precision, record["budget"]["processes"])
    elif precision.get("trainable_dtypes") != [f"torch.{master}"]:
        problems.append(f"trainable weights are {precision.get('trainable_dtypes')}, not {master} "
                        f"(train.master_dtype)")
    states = precision.get("optimizer_state_dtypes") or []
    if not states or not all(s.startswith(f"torch.{master}") for s in states):
        problems.append(f"optimizer state is {states}, not {master}")
    compute = {"bfloat16": "bf16", "float16": "fp16"}.get(preset.model.dtype, "no")
    if precision.get("mixed_precision") != compute:
        problems.append(f"mixed precision {precision.get('mixed_precision')!r}, the preset computes in {compute!r}")
    budget = record["budget"]
    processes = training_processes(preset)
    if budget["processes"] != processes:
        problems.append(f"{budget['processes']} training processes, harness plan counts {processes}")
    if budget["spent"] < budget["amount"] * (1 - 1e-9):
        problems.append(f"spent {budget['spent']:g} of a {budget['amount']:g} {budget['kind']} budget")
    ledger = budget["ledger"]
    train = preset.train
    if budget["kind"] == "samples":
        ds = train.dynamic_sampling
        per_round = ((ds.prompts_per_round or train.prompts_per_step) if ds.enabled else train.prompts_per_step
                     ) * train.num_generations
        if ledger["samples"] % per_round:  # every rollout of every process, in whole rounds (batches)
            problems.append(f"the ledger counts {ledger['samples']} rollouts, not whole rounds of {per_round}")
        if budget["spent"] - budget["amount"] >= per_round * (ds.max_generation_rounds if ds.enabled else 1):
            problems.append(f"spent {budget['spent']:g} rollouts: more than one step past the budget")
    if budget["kind"] == "steps" and ledger["steps"] % (train.mini_batches * train.ppo_epochs):
        problems.append(f"{ledger['steps']} optimizer steps: not whole generation batches")
    return problems


def _zero3_problems(precision: dict, processes: int) -> list[str]:
    """What a ZeRO-3 run must have trained with (run.json ``precision``, read from the live engine): DeepSpeed at
    stage 3 with parameters partitioned over the ``processes`` (one process, ``--mode cuda`` on one GPU, keeps them
    whole), float32 master partitions, and gradients accumulated and reduced in float32 (DeepSpeed's default under
    bf16 is bf16 for both)."""
    engine = precision.get("deepspeed") or {}
    problems = []
    if precision.get("distributed") != "DEEPSPEED" or engine.get("zero_stage") != 3:
        problems.append(f"trained under {precision.get('distributed')} at ZeRO stage {engine.get('zero_stage')}, "
                        "not DeepSpeed ZeRO-3")
    if processes > 1 and not engine.get("partitioned_parameters"):
        problems.append("no parameter was partitioned over the processes")
    if not any(s.endswith("(deepspeed master partition)") for s in precision.get("optimizer_state_dtypes") or []):
        problems.append("no DeepSpeed float32 master partition")
    for key in ("grad_accum_dtype", "communication_dtype"):
        if engine.get(key) != "torch.float32":
            problems.append(f"DeepSpeed {key} is {engine.get(key)}, not float32")
    return problems


TIMING_KEYS = ("seconds/", "budget/accel_seconds", "step_time", "time/", "train_runtime", "_per_second", "epoch")


def comparable(metrics_file: Path) -> list[dict]:
    """metrics.jsonl without what a clock measured (what a resumed run cannot repeat)."""
    return [{k: v for k, v in json.loads(line).items() if not any(t in k for t in TIMING_KEYS)}
            for line in metrics_file.read_text().splitlines()]


def check_resume(rehearsal: Rehearsal, out_dir: Path) -> list[str]:
    """One label's train job again, killed (SIGKILL to its process group) once its first trainer checkpoint is
    complete, then rerun: its metrics must equal the sweep's uninterrupted run step by step. The label is the
    sweep's last trained one (a method), or uniform under a budget in seconds, where progress-driven schedules (D3S)
    follow the clock and no two runs take the same steps (only the steps both took are compared then)."""
    import signal

    from harness.ops.resources import train_command

    resolved = resolve(rehearsal.sweep)
    preset, paths = resolved.preset, SweepPaths(resolved.results_dir)
    trained = [label for label in resolved.sweep.methods
               if not load_method(label, search_dirs=resolved.sweep.method_config_dirs).checkpoint]
    timed = preset.train.budget.kind == "accel_seconds"
    label, seed = ("uniform" if timed and "uniform" in trained else trained[-1]), resolved.sweep.seeds[0]
    root = out_dir / "_resume"
    mine = SweepPaths(root / rehearsal.name)
    for source, target in ((paths.data_dir, mine.data_dir), (paths.warmstart_dir.parent, mine.warmstart_dir.parent)):
        if not target.exists():
            shutil.copytree(source, target)
    sweep_file = root / f"{rehearsal.name}.yaml"
    write_text_atomic(sweep_file, yaml.safe_dump({**rehearsal.sweep, "results_dir": str(root)}, sort_keys=False))
    log = root / f"{rehearsal.name}_{label}_seed{seed}.log"
    command = train_command(preset, f"train --sweep {sweep_file} --method {label} --seed {seed}", mine.warmstart_dir,
                            log=str(log))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run_dir = mine.run_dir(label, seed)
    job = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=env, start_new_session=True)
    while job.poll() is None and not list(run_dir.glob("trl/checkpoint-*/harness_budget.json")):
        time.sleep(0.2)
    if job.poll() is not None:
        return [f"resume: {label}/seed{seed} finished (exit {job.returncode}) before its first trainer checkpoint"]
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    killed_at = sorted(run_dir.glob("trl/checkpoint-*/harness_budget.json"))[0].parent.name
    final_step = json.loads(paths.run_file(label, seed).read_text())["budget"]["spent_steps"]
    if int(killed_at.split("-")[1]) >= final_step:
        return [f"resume: {label}/seed{seed} ends at its first trainer checkpoint ({killed_at}): no step is left to "
                "resume (the rehearsal budget is too small)"]
    if subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env).returncode:
        return [f"resume: the rerun of {label}/seed{seed} after the kill failed (log: {log})"]
    resumed, reference = comparable(run_dir / "metrics.jsonl"), comparable(paths.metrics_file(label, seed))
    steps = min(len(resumed), len(reference)) if timed else max(len(resumed), len(reference))
    if resumed[:steps] != reference[:steps]:
        first = next(i for i, (a, b) in enumerate(zip(resumed, reference, strict=False)) if a != b)
        return [f"resume: {label}/seed{seed} killed at {killed_at} and rerun differs from the uninterrupted run from "
                f"step {first + 1}"]
    print(f"  resume: {label}/seed{seed} killed at {killed_at} and rerun: the same metrics in {steps} steps")
    return []


def rehearse(sweep_file: Path, out_dir: Path, mode: str = "cpu", cores: int = 2, resume: bool = True,
             labels: list[str] | None = None) -> int:
    """Prepare, run and check one paper sweep's rehearsal; print what was replaced and the outcome; 0 = passed.
    ``resume``: also kill one train job after its first trainer checkpoint and check its rerun (``check_resume``).
    ``labels``: rehearse only these of the sweep's methods (None: all of them)."""
    started = time.monotonic()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    rehearsal = prepare(Path(sweep_file), out_dir, mode, labels)
    print(f"rehearsal of {sweep_file} in {out_dir / rehearsal.name}")
    for line in rehearsal.replaced:
        print(f"  replaced: {line}")
    done = run_snakemake(rehearsal, out_dir, cores, gpu_slots(mode))
    if done.returncode:
        print(f"FAILED: snakemake exited {done.returncode} (log: {out_dir / rehearsal.name}.snakemake.log)")
        return 1
    problems = check_rehearsal(rehearsal) + (check_resume(rehearsal, out_dir) if resume else [])
    for problem in problems:
        print(f"FAILED: {problem}")
    print(f"{'FAILED' if problems else 'passed'}: {rehearsal.name} in {time.monotonic() - started:.0f} s")
    return 1 if problems else 0
