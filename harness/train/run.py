"""One training run (method x seed) under its budget, and the trainer factory it is built with (bench/ builds its
trainers with the same functions)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from harness.config.paths import SweepPaths, checkpoint_name
from harness.config.provenance import run_record
from harness.config.schema import MethodSpec, Resolved
from harness.data.files import sha256_file, write_json_atomic
from harness.data.hub import source_checksums
from harness.data.prepare import training_rows
from harness.data.prompts import render_prompt
from harness.model.checkpoints import load_policy
from harness.train.budget import peak_memory_bytes


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
    from harness.train.adapter import reward_function
    from harness.train.rewards import overlong_reward_functions

    values = preset.train.reward_values
    return [reward_function(preset.train.reward, preset.eval.scoring_timeout_s, values.correct, values.wrong),
            *overlong_reward_functions(preset.train)]  # reward = correctness + DAPO overlong term


def build_trainer(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths, run_dir: Path, *,
                  checkpoint_dirs: dict[float, Path] | None = None, metrics_path: Path | None = None,
                  run_key: str = "", sample_batch_path: Path | None = None):
    """The ``TargetedGRPOTrainer`` of one run: seeds every RNG with the run seed (``seed + spec.seed_offset``), loads
    the sweep's warm start, the training prompts in the order of the run seed, the method of ``spec`` and TRL's
    settings from the preset (``grpo_config``; TRL's own output under ``run_dir/trl``). Its ``BudgetCallback``
    saves the model at each budget fraction of ``checkpoint_dirs`` (fraction -> directory; none: never) and
    appends every step's log to ``metrics_path`` (default ``run_dir/metrics.jsonl``). ``run_key`` identifies the
    configuration in resumable checkpoints; ``sample_batch_path`` receives the first generation batch."""
    from transformers import set_seed

    from harness.train.adapter import TargetedGRPOTrainer, grpo_config
    from harness.train.callbacks import BudgetCallback
    from methods.registry import get_method_class

    preset = resolved.preset
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
    trainer.add_callback(BudgetCallback(trainer, checkpoint_dirs or {}, metrics_path))
    return trainer


def build_plain_trainer(resolved: Resolved, paths: SweepPaths, seed: int, run_dir: Path):
    """TRL's own ``GRPOTrainer`` on what ``build_trainer`` gives a run of seed ``seed``: the warm start, the prompts
    in the same order, the reward and TRL's settings (``harness.train.adapter.plain_grpo_trainer``: DAPO loss, no
    KL). No budget: it stops at ``args.max_steps``. The reference a harness step is timed against in bench/."""
    from transformers import set_seed

    from harness.train.adapter import plain_grpo_trainer

    preset = resolved.preset
    torch.set_num_threads(preset.train.threads)
    set_seed(seed)
    model, tokenizer = load_policy(paths.warmstart_dir, preset.train.master_dtype)
    dataset = training_dataset(resolved, paths, tokenizer, seed)
    return plain_grpo_trainer(model, tokenizer, dataset, reward_functions(preset), preset, run_dir, seed)


def train_steps(trainer, steps: int, data_seed: int) -> None:
    """``steps`` more optimizer steps of ``trainer`` from its current weights and optimizer state, on the prompts
    that ``data_seed`` draws: ``Trainer.train()`` again with a fresh step count (``max_steps = steps``) and a fresh
    learning-rate schedule. For benchmarks; a run trains once, in ``run_training``."""
    trainer.args.seed = trainer.args.data_seed = data_seed
    trainer.args.max_steps = steps
    trainer.train()


def set_budget_progress(trainer, fraction: float) -> None:
    """Put a trainer whose budget counts steps at ``fraction`` of its budget: the ``StepContext.progress`` that
    schedules read (D3S) is then ``fraction`` (plus one step per step taken), as at that point of a run."""
    budget = trainer.preset.train.budget
    if budget.kind != "steps":
        raise ValueError(f"set_budget_progress needs train.budget.kind=steps, not {budget.kind!r}")
    trainer.ledger.steps = round(fraction * budget.amount)


def run_training(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict | None:
    """Train ``spec`` from the warm start until the budget is spent; write the budget checkpoints,
    metrics.jsonl and run.json. With ``train.save_every_steps`` the run resumes from its last trainer
    checkpoint (weights, optimizer, scheduler, RNG, data position, budget ledger) when rerun. Under accelerate
    launch every process calls this; the main process writes the files and gets the run record, the others None."""
    from accelerate import PartialState

    preset = resolved.preset
    run_seed = seed + spec.seed_offset
    run_dir = paths.run_dir(spec.label, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = preset.train.budget
    preset_dict = resolved.to_dict()["preset"]
    for section in ("train", "eval"):  # fast_decode gives the same tokens: a run resumes across it (and from before it)
        preset_dict[section].pop("fast_decode", None)
    run_key = hashlib.sha256(json.dumps([preset_dict, spec.name, spec.params.__dict__, run_seed],
                                        sort_keys=True, default=str).encode()).hexdigest()
    metrics_partial = run_dir / "metrics.jsonl.partial"
    # one process, or one per device under accelerate launch / torchrun; cpu as in grpo_config (the state is shared)
    processes = PartialState(cpu=not torch.cuda.is_available())
    with processes.main_process_first():  # the main process cleans up; the others then find the same state
        resume_from = last_complete_checkpoint(run_dir / "trl", run_key)
        if resume_from is None:
            _clear_run_outputs(run_dir, budget.checkpoint_fractions)
            metrics_partial.unlink(missing_ok=True)
    checkpoint_dirs = {f: run_dir / checkpoint_name(f) for f in budget.checkpoint_fractions}
    trainer = build_trainer(resolved, spec, seed, paths, run_dir, checkpoint_dirs=checkpoint_dirs,
                            metrics_path=metrics_partial, run_key=run_key,
                            sample_batch_path=run_dir / "sample_batch.json")
    finished = False
    if resume_from is not None:
        trainer.restore_ledger(Path(resume_from))
        # killed after its last step but before run.json: nothing is left to train, and the metrics may already
        # have been moved into place
        finished = trainer.ledger.spent(budget.kind) >= budget.amount * (1 - 1e-9)
        if processes.is_main_process:
            if (run_dir / "metrics.jsonl").is_file() and not metrics_partial.is_file():
                (run_dir / "metrics.jsonl").replace(metrics_partial)
            _drop_metrics_after(metrics_partial, trainer.ledger.steps)
    started = time.perf_counter()
    if not finished:
        trainer.train(resume_from_checkpoint=resume_from)
    elapsed = time.perf_counter() - started
    missing = [d.name for d in checkpoint_dirs.values() if not d.is_dir()]
    if missing:
        raise RuntimeError(f"training stopped before the budget was spent (max_steps cap "
                           f"{budget.max_steps}?): checkpoints {missing} were not written")
    peak_memory = trainer.max_over_processes(peak_memory_bytes(trainer.accelerator.device))
    if not processes.is_main_process:
        return None
    metrics_partial.replace(run_dir / "metrics.jsonl")
    ledger = trainer.ledger
    record = run_record(
        resolved, spec, seed, run_seed, trainer.method.deviations,
        budget={"kind": budget.kind, "amount": budget.amount, "spent": ledger.spent(budget.kind),
                "spent_steps": ledger.steps, "clock": trainer.clock.name,
                "checkpoints": {name: info["step"] for name, info in trainer.saved_checkpoints.items()},
                "checkpoint_spend": trainer.saved_checkpoints, "ledger": ledger.to_dict(),
                "peak_memory_bytes": peak_memory, "processes": processes.num_processes,
                "peak_memory_kind": "cuda_max_allocated" if torch.cuda.is_available() else "cpu_max_rss"},
        counters={"generated_tokens": ledger.generated_tokens, "forwarded_tokens": ledger.forwarded_positions,
                  "weighted_tokens": ledger.weighted_tokens, "rollouts_generated": ledger.samples},
        train_seconds=elapsed, resumed_from=str(Path(resume_from).name) if resume_from else None,
        data_sha256={"train": sha256_file(paths.data_dir / "train.jsonl"), **source_checksums(paths.data_dir)})
    record["precision"] = trainer.precision_in_use()
    write_json_atomic(run_dir / "run.json", record)
    return record


def last_complete_checkpoint(trl_dir: Path, run_key: str) -> str | None:
    """The newest trainer checkpoint of this configuration (``run_key``) that was completely written.

    transformers writes checkpoint-N in place, so a job killed while saving leaves a partial folder: the budget
    ledger, written last, marks a complete one; partial folders are removed so that no rerun picks them up.
    Checkpoints of another configuration (the config changed since) are removed too: the run starts afresh."""
    import shutil

    from harness.train.adapter import LEDGER_FILE

    if not trl_dir.is_dir():
        return None
    folders = sorted((p for p in trl_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
                     key=lambda p: int(p.name.split("-")[-1]))
    for folder in reversed(folders):
        ledger = folder / LEDGER_FILE
        if ledger.is_file() and json.loads(ledger.read_text()).get("run_key") == run_key:
            return str(folder)
        shutil.rmtree(folder)
    return None


def _clear_run_outputs(run_dir: Path, fractions: list[float]) -> None:
    """A fresh run removes what an earlier, unfinished one left (checkpoints, run.json)."""
    import shutil

    (run_dir / "run.json").unlink(missing_ok=True)
    for fraction in fractions:
        for leftover in (run_dir / checkpoint_name(fraction), run_dir / (checkpoint_name(fraction) + ".partial")):
            if leftover.exists():
                shutil.rmtree(leftover)


def _drop_metrics_after(metrics_file: Path, step: int) -> None:
    """Lines logged after the checkpoint being resumed from would be logged again: drop them."""
    if not metrics_file.is_file():
        return
    kept = [line for line in metrics_file.read_text().splitlines() if json.loads(line)["step"] <= step]
    metrics_file.write_text("".join(line + "\n" for line in kept))
