"""One training run (method x seed) under its budget, and the trainer factory it is built with (bench/ builds its
trainers with the same functions)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch

from harness.config.kernels import apply_cpu_kernels
from harness.config.loading import dump_yaml
from harness.config.paths import SweepPaths, checkpoint_name
from harness.config.provenance import run_record
from harness.config.schema import MethodSpec, Resolved
from harness.config.snapshot import train_job_config
from harness.data.files import sha256_file, write_json_atomic, write_text_atomic
from harness.data.hub import source_checksums
from harness.data.prepare import training_rows
from harness.data.prompts import render_prompt
from harness.model.checkpoints import load_policy
from harness.train.budget import last_complete_checkpoint, peak_memory_bytes
from harness.train.progress import PROGRESS_FILE, ProgressLog
from harness.train.trackers import TRACKER_FOLDERS, open_trackers, tracker_run_name


def training_dataset(resolved: Resolved, paths: SweepPaths, tokenizer, seed: int):
    """The training prompts (rendered with the preset's template and ``tokenizer``) and their answers, in the order
    of ``seed``: a ``datasets.Dataset`` with columns ``prompt`` and ``answer``."""
    from datasets import Dataset

    template = resolved.preset.prompt_template
    return Dataset.from_list([{"prompt": render_prompt(template, r["problem"], tokenizer), "answer": r["answer"]}
                              for r in training_rows(paths, seed)])


def reward_functions(preset) -> list:
    """TRL reward functions of a run, summed into each rollout's reward: correctness, plus DAPO's soft overlong
    punishment when ``train.overlong`` turns it on."""
    from harness.train.rewards import overlong_reward_functions
    from harness.train.trl.settings import reward_function, reward_scoring_workers

    values = preset.train.reward_values
    return [reward_function(preset.train.reward, preset.eval.scoring_timeout_s, values.correct, values.wrong,
                            reward_scoring_workers(preset.train)),
            *overlong_reward_functions(preset.train)]  # reward = correctness + DAPO overlong term


def build_trainer(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths, run_dir: Path, *,
                  checkpoint_dirs: dict[float, Path] | None = None, metrics_path: Path | None = None,
                  run_key: str = "", sample_batch_path: Path | None = None, trackers: list | None = None,
                  progress: ProgressLog | None = None):
    """The ``TargetedGRPOTrainer`` of one run: seeds every RNG with the run seed (``seed + spec.seed_offset``), loads
    the sweep's warm start, the training prompts in the order of the run seed, the method of ``spec`` and TRL's
    settings from the preset (``grpo_config``; TRL's own output under ``run_dir/trl``). Its ``BudgetCallback``
    saves the model at each budget fraction of ``checkpoint_dirs`` (fraction -> directory; none: never) and
    appends every step's log to ``metrics_path`` (default ``run_dir/metrics.jsonl``) and to ``trackers``
    (harness/train/trackers.py), and hands the spend after every step to ``progress``. ``run_key`` identifies the
    configuration in resumable checkpoints; ``sample_batch_path`` receives the first generation batch. The preset's
    ``cpu_kernels`` decide deterministic algorithms (harness/config/kernels.py)."""
    from transformers import set_seed

    from harness.train.callbacks import BudgetCallback
    from harness.train.trl.settings import grpo_config
    from harness.train.trl.trainer import TargetedGRPOTrainer
    from methods.registry import get_method_class

    preset = resolved.preset
    apply_cpu_kernels(preset.cpu_kernels)
    torch.set_num_threads(preset.train.threads)
    run_seed = seed + spec.seed_offset  # the sweep seed names the run; the offset separates A/A labels
    set_seed(run_seed)
    # the trainable weights in train.master_dtype (float32 masters); forward passes compute in model.dtype (autocast)
    model, tokenizer = load_policy(paths.warmstart_dir, preset.train.master_dtype)
    dataset = training_dataset(resolved, paths, tokenizer, run_seed)
    method = get_method_class(spec.name)(spec.params)
    trainer = TargetedGRPOTrainer(
        model=model, processing_class=tokenizer, train_dataset=dataset,
        reward_funcs=reward_functions(preset), args=grpo_config(preset, run_dir, run_seed), method=method,
        preset=preset, run_seed=run_seed,
        sample_batch_path=sample_batch_path, run_key=run_key)
    metrics_path = metrics_path if metrics_path is not None else run_dir / "metrics.jsonl"
    trainer.add_callback(BudgetCallback(trainer, checkpoint_dirs or {}, metrics_path, trackers, progress))
    return trainer


def run_training(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict | None:
    """Train ``spec`` from the warm start until the budget is spent; write the budget checkpoints,
    metrics.jsonl and run.json. With ``train.save_every_steps`` the run resumes from its last trainer
    checkpoint (weights, optimizer, scheduler, RNG, data position, budget ledger) when rerun (``RunFolder``). Under
    accelerate launch every process calls this; the main process writes the files and gets the run record, the
    others None."""
    from accelerate import PartialState

    preset = resolved.preset
    budget = preset.train.budget
    folder = RunFolder(paths.run_dir(spec.label, seed), budget.checkpoint_fractions)
    warmstart_digest = warmstart_sha256(paths.warmstart_dir)
    key = run_key(resolved, spec, seed + spec.seed_offset, paths, warmstart_digest)
    # one process, or one per device under accelerate launch / torchrun; cpu as in grpo_config (the state is shared).
    # The process group is created here, before GRPOConfig: its ddp_timeout would come too late to apply
    processes = PartialState(cpu=not torch.cuda.is_available(),
                             timeout=timedelta(seconds=preset.train.collective_timeout_s))
    with processes.main_process_first():  # the main process cleans up; the others then find the same state
        resume_from = folder.start(key)
    main = processes.is_main_process
    config = resolved.to_dict()
    trackers = open_trackers(preset.train.report_to, folder.path,
                             tracker_run_name(resolved.sweep.name, spec.label, seed), config, dump_yaml(config),
                             int(resume_from.rsplit("-", 1)[1]) if resume_from else 0,
                             preset.train.wandb_mode) if main else []
    progress = ProgressLog(folder.path, budget.kind, budget.amount, spent_at_start=0.0) if main else None
    trainer = build_trainer(resolved, spec, seed, paths, folder.path, checkpoint_dirs=folder.checkpoint_dirs,
                            metrics_path=folder.metrics_partial, run_key=key,
                            sample_batch_path=folder.path / "sample_batch.json", trackers=trackers, progress=progress)
    finished = resume_from is not None and folder.resume(trainer, Path(resume_from), progress, main)
    started = time.perf_counter()
    try:
        if not finished:
            trainer.train(resume_from_checkpoint=resume_from)
    finally:
        for tracker in trackers:
            tracker.close()
    elapsed = time.perf_counter() - started
    missing = [d.name for d in folder.checkpoint_dirs.values() if not d.is_dir()]
    if missing:
        raise RuntimeError(f"training stopped before the budget was spent (max_steps cap "
                           f"{budget.max_steps}?): checkpoints {missing} were not written")
    peak_memory = trainer.max_over_processes(peak_memory_bytes(trainer.accelerator.device))
    if not main:
        return None
    folder.metrics_partial.replace(folder.path / "metrics.jsonl")
    record = training_record(resolved, spec, seed, paths, trainer, elapsed, resume_from, peak_memory,
                             processes.num_processes)
    record["warmstart_sha256"] = warmstart_digest
    record["digests"] = asdict(trainer.accounting.digests)  # `harness verify` replays against these
    write_json_atomic(folder.path / "run.json", record)
    return record


@dataclass(frozen=True)
class RunFolder:
    """A run's folder across kills and reruns: the budget checkpoints of ``fractions``, metrics.jsonl (written as
    metrics.jsonl.partial until the run ends) and the trainer checkpoints under trl/."""

    path: Path
    fractions: list[float]

    @property
    def metrics_partial(self) -> Path:
        return self.path / "metrics.jsonl.partial"

    @property
    def checkpoint_dirs(self) -> dict[float, Path]:
        return {f: self.path / checkpoint_name(f) for f in self.fractions}

    def start(self, key: str) -> str | None:
        """The newest complete trainer checkpoint made under ``key`` (``run_key``) to resume from, or None: then
        what an earlier attempt left (run.json, budget checkpoints, progress, trackers, metrics) is cleared."""
        self.path.mkdir(parents=True, exist_ok=True)
        resume_from = last_complete_checkpoint(self.path / "trl", key)
        if resume_from is None:
            _clear_run_outputs(self.path, self.fractions)
            _clear_progress_and_trackers(self.path)
            self.metrics_partial.unlink(missing_ok=True)
        return resume_from

    def resume(self, trainer, checkpoint: Path, progress: ProgressLog | None, main: bool) -> bool:
        """Continue from ``checkpoint``: its budget ledger into ``trainer``; on the main process, the budget
        checkpoints saved after it cleared (the run saves them again) and metrics.jsonl cut back to its step.
        Returns whether nothing is left to train (killed after the last step but before run.json)."""
        budget = trainer.preset.train.budget
        trainer.restore_ledger(checkpoint)
        if progress is not None:  # the ETA extrapolates this job's own rate
            progress.spent_at_start = trainer.ledger.spent(budget.kind)
        finished = trainer.ledger.spent(budget.kind) >= budget.amount * (1 - 1e-9)
        if main:
            _clear_run_outputs(self.path, [f for f in self.fractions
                                           if checkpoint_name(f) not in trainer.saved_checkpoints])
            metrics = self.path / "metrics.jsonl"
            if metrics.is_file() and not self.metrics_partial.is_file():  # moved into place before the kill
                metrics.replace(self.metrics_partial)
            _drop_metrics_after(self.metrics_partial, trainer.ledger.steps)
        return finished


def training_record(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths, trainer, elapsed: float,
                    resume_from: str | None, peak_memory: int, processes: int) -> dict:
    """run.json's record of a finished run: the configuration and provenance (``run_record``), the budget as the
    ledger counted it, the counters, the precision and engine facts read from the live trainer."""
    from harness.train.trl.settings import reward_scoring_workers
    from harness.train.trl.vllm import colocated_kv_cache

    budget, ledger = resolved.preset.train.budget, trainer.ledger
    record = run_record(
        resolved, spec, seed, seed + spec.seed_offset, trainer.method.deviations,
        budget={"kind": budget.kind, "amount": budget.amount, "spent": ledger.spent(budget.kind),
                "spent_steps": ledger.steps, "clock": trainer.clock.name,
                "checkpoints": {name: info["step"] for name, info in trainer.saved_checkpoints.items()},
                "checkpoint_spend": trainer.saved_checkpoints, "ledger": ledger.to_dict(),
                "peak_memory_bytes": peak_memory, "processes": processes,
                "peak_memory_kind": "cuda_max_allocated" if torch.cuda.is_available() else "cpu_max_rss"},
        counters={"generated_tokens": ledger.generated_tokens, "forwarded_tokens": ledger.forwarded_positions,
                  "weighted_tokens": ledger.weighted_tokens, "rollouts_generated": ledger.samples},
        train_seconds=elapsed, resumed_from=str(Path(resume_from).name) if resume_from else None,
        data_sha256={"train": sha256_file(paths.data_dir / "train.jsonl"), **source_checksums(paths.data_dir)})
    record["precision"] = trainer.precision_in_use()
    record["collective_timeout_s"] = live_collective_timeout_s()
    record["vllm_kv_cache"] = colocated_kv_cache(trainer)
    record["reward_scoring_workers"] = (reward_scoring_workers(resolved.preset.train)
                                        if resolved.preset.train.reward == "math_verify" else None)
    return record


def live_collective_timeout_s() -> float | None:
    """The timeout of the live default process group's backend, in seconds (None in a one-process run without one):
    what collectives actually wait, read back rather than the configured value."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return distributed.group.WORLD._get_backend(device).options._timeout.total_seconds()


def run_key(resolved: Resolved, spec: MethodSpec, run_seed: int, paths: SweepPaths,
            warmstart_digest: str | None = None) -> str:
    """What a trainer checkpoint is resumed under: the sweep's training configuration and the method
    (``train_job_config``: not the eval settings nor the cluster resources, so a run killed at its time limit resumes
    after the limit is raised), the run seed, and the contents of the warm start and of the training data (a warm
    start or data regenerated since makes the run start afresh). ``warmstart_digest``: ``warmstart_sha256`` of the
    warm start when the caller has it already."""
    warmstart_digest = warmstart_digest or warmstart_sha256(paths.warmstart_dir)
    identity = [train_job_config(resolved, spec), run_seed, warmstart_digest,
                sha256_file(paths.data_dir / "train.jsonl")]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def warmstart_sha256(model_dir: Path) -> str:
    """One sha256 over the warm start's files (weights, tokenizer, config), but warmstart.json (its build record)."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and p.name != "warmstart.json")
    return hashlib.sha256(json.dumps([[p.name, sha256_file(p)] for p in files]).encode()).hexdigest()


def _clear_run_outputs(run_dir: Path, fractions: list[float]) -> None:
    """Remove run.json and the budget checkpoints of ``fractions`` (whole or partial) that an earlier, unfinished
    run left: all of them for a fresh run, those it saves again for a resumed one."""
    import shutil

    (run_dir / "run.json").unlink(missing_ok=True)
    for fraction in fractions:
        for leftover in (run_dir / checkpoint_name(fraction), run_dir / (checkpoint_name(fraction) + ".partial")):
            if leftover.exists():
                shutil.rmtree(leftover)


def _clear_progress_and_trackers(run_dir: Path) -> None:
    """A fresh run's progress file and tracker folders start empty (a resumed run keeps and continues them)."""
    import shutil

    (run_dir / PROGRESS_FILE).unlink(missing_ok=True)
    for folder in TRACKER_FOLDERS.values():
        if (run_dir / folder).exists():
            shutil.rmtree(run_dir / folder)


def _drop_metrics_after(metrics_file: Path, step: int) -> None:
    """Lines logged after the checkpoint being resumed from would be logged again: drop them, and a last line that a
    kill cut short (its step is logged again too: a step is logged before its trainer checkpoint is saved)."""
    if not metrics_file.is_file():
        return
    lines = metrics_file.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{metrics_file}:{number}: not a JSON line ({exc}), and not the last line a kill could "
                             "have cut short: the file is corrupt") from None
        if record["step"] <= step:
            kept.append(line)
    write_text_atomic(metrics_file, "".join(line + "\n" for line in kept))
