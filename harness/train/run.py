"""Preparing data, warm-starting the policy, and one training run (method x seed) under its budget."""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import torch

from harness.config.paths import SweepPaths, checkpoint_name
from harness.config.provenance import provenance
from harness.config.schema import MethodSpec, Resolved, dump_yaml
from harness.data.files import read_jsonl, verify_checksum, write_json_atomic
from harness.data.prepare import prepare_data, resolve_repo_path  # noqa: F401  (moved there; imported from here too)
from harness.data.prompts import render_prompt
from harness.model.policy import convert_gguf, load_policy, warmstart_char_llama
from harness.train.budget import peak_memory_bytes


def warmstart(resolved: Resolved, paths: SweepPaths) -> dict:
    """Build the starting policy once per sweep: SFT for char_llama, GGUF dequantisation, or a hub/path copy."""
    preset = resolved.preset
    torch.set_num_threads(preset.warmstart.threads)
    out = paths.warmstart_dir
    staging = out.with_name(out.name + ".partial")
    model_cfg = preset.model
    if model_cfg.kind == "char_llama":
        rows = read_jsonl(verify_and_return(paths.data_dir / "train.jsonl"), required=("problem", "solution"))
        summary = warmstart_char_llama(model_cfg, preset.warmstart, rows,
                                       lambda p: render_prompt(preset.prompt_template, p), staging)
    elif model_cfg.kind == "gguf":
        summary = convert_gguf(model_cfg, staging)
    else:
        model, tokenizer = load_policy(model_cfg.name_or_path, model_cfg.dtype)
        from harness.model.policy import save_policy

        save_policy(model, tokenizer, staging)
        summary = {"name_or_path": model_cfg.name_or_path}
    write_json_atomic(staging / "warmstart.json", {**summary, "provenance": provenance()})
    if out.exists():
        import shutil

        shutil.rmtree(out)
    staging.rename(out)
    return summary


def verify_and_return(path: Path) -> Path:
    verify_checksum(path)
    return path


def training_rows(resolved: Resolved, paths: SweepPaths, seed: int) -> list[dict]:
    rows = read_jsonl(verify_and_return(paths.data_dir / "train.jsonl"))
    random.Random(seed).shuffle(rows)  # data order is part of the seed
    return rows


def run_training(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict | None:
    """Train ``spec`` from the warm start until the budget is spent; write the budget checkpoints,
    metrics.jsonl and run.json. With ``train.save_every_steps`` the run resumes from its last trainer
    checkpoint (weights, optimizer, scheduler, RNG, data position, budget ledger) when rerun. Under accelerate
    launch every process calls this; the main process writes the files and gets the run record, the others None."""
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import set_seed

    from harness.train.adapter import TargetedGRPOTrainer, grpo_config, reward_function
    from harness.train.callbacks import BudgetCallback
    from harness.train.rewards import overlong_reward_functions
    from methods.registry import get_method_class

    preset = resolved.preset
    torch.set_num_threads(preset.train.threads)
    run_seed = seed + spec.seed_offset  # the sweep seed names the run; the offset separates A/A labels
    set_seed(run_seed)
    run_dir = paths.run_dir(spec.label, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = preset.train.budget
    run_key = hashlib.sha256(json.dumps([resolved.to_dict()["preset"], spec.name, spec.params.__dict__, run_seed],
                                        sort_keys=True, default=str).encode()).hexdigest()
    metrics_partial = run_dir / "metrics.jsonl.partial"
    # one process, or one per device under accelerate launch / torchrun; cpu as in grpo_config (the state is shared)
    processes = PartialState(cpu=not torch.cuda.is_available())
    with processes.main_process_first():  # the main process cleans up; the others then find the same state
        resume_from = last_complete_checkpoint(run_dir / "trl", run_key)
        if resume_from is None:
            _clear_run_outputs(run_dir, budget.checkpoint_fractions)
            metrics_partial.unlink(missing_ok=True)
    model, tokenizer = load_policy(paths.warmstart_dir, preset.model.dtype)
    rows = training_rows(resolved, paths, run_seed)
    dataset = Dataset.from_list([{"prompt": render_prompt(preset.prompt_template, r["problem"], tokenizer),
                                  "answer": r["answer"]} for r in rows])
    method = get_method_class(spec.name)(spec.params)
    trainer = TargetedGRPOTrainer(
        model=model, processing_class=tokenizer, train_dataset=dataset,
        reward_funcs=[reward_function(preset.train.reward, preset.eval.scoring_timeout_s),
                      *overlong_reward_functions(preset.train)],  # reward = correctness + DAPO overlong term
        args=grpo_config(preset, run_dir, run_seed), method=method, preset=preset, run_seed=run_seed,
        sample_batch_path=run_dir / "sample_batch.json", run_key=run_key)
    checkpoint_dirs = {f: run_dir / checkpoint_name(f) for f in budget.checkpoint_fractions}
    trainer.add_callback(BudgetCallback(trainer, checkpoint_dirs, metrics_partial))
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
    record = {
        "sweep": resolved.sweep.name, "method": {"label": spec.label, "name": spec.name,
                                                  "params": json.loads(json.dumps(spec.params.__dict__, default=str)),
                                                  "deviations": list(method.deviations)},
        "seed": seed, "run_seed": run_seed, "config": resolved.to_dict(), "config_yaml": dump_yaml(resolved.to_dict()),
        "budget": {"kind": budget.kind, "amount": budget.amount, "spent": ledger.spent(budget.kind),
                   "spent_steps": ledger.steps, "clock": trainer.clock.name,
                   "checkpoints": {name: info["step"] for name, info in trainer.saved_checkpoints.items()},
                   "checkpoint_spend": trainer.saved_checkpoints, "ledger": ledger.to_dict(),
                   "peak_memory_bytes": peak_memory, "processes": processes.num_processes,
                   "peak_memory_kind": "cuda_max_allocated" if torch.cuda.is_available() else "cpu_max_rss"},
        "counters": {"generated_tokens": ledger.generated_tokens, "forwarded_tokens": ledger.forwarded_positions,
                     "weighted_tokens": ledger.weighted_tokens, "rollouts_generated": ledger.samples},
        "resumed_from": str(Path(resume_from).name) if resume_from else None,
        "train_seconds": elapsed,
        "provenance": provenance({"train": paths.data_dir / "train.jsonl"}),
    }
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
