"""Preparing data, warm-starting the policy, and one training run (method x seed) under its budget."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from harness.config import MethodSpec, Resolved, dump_yaml
from harness.datafiles import read_jsonl, sha256_file, verify_checksum, write_json_atomic, write_jsonl_atomic
from harness.models import convert_gguf, load_policy, warmstart_char_llama
from harness.paths import SweepPaths, checkpoint_name, checkpoint_step
from harness.prompts import render_prompt
from harness.provenance import provenance
from harness.synthetic import generate_split

SYNTHETIC_SPLITS = ("train", "eval", "ood")


def prepare_data(resolved: Resolved, paths: SweepPaths) -> dict:
    """Synthetic preset: generate the splits with their SHA256SUMS. JSONL preset: verify the training file."""
    data = resolved.preset.data
    out = paths.data_dir
    out.mkdir(parents=True, exist_ok=True)
    if data.kind == "synthetic":
        files = {}
        for split in SYNTHETIC_SPLITS:
            files[split] = write_jsonl_atomic(out / f"{split}.jsonl", generate_split(data.synthetic, split))
        sums = "".join(f"{sha256_file(p)}  {p.name}\n" for p in files.values())
        (out / "SHA256SUMS.tmp").write_text(sums)
        (out / "SHA256SUMS.tmp").replace(out / "SHA256SUMS")
        return {split: str(path) for split, path in files.items()}
    source = resolve_repo_path(data.train_file)
    verify_checksum(source)
    rows = read_jsonl(source)
    if data.max_train_rows:
        rows = rows[:data.max_train_rows]
    target = write_jsonl_atomic(out / "train.jsonl", rows)
    (out / "SHA256SUMS.tmp").write_text(f"{sha256_file(target)}  train.jsonl\n")
    (out / "SHA256SUMS.tmp").replace(out / "SHA256SUMS")
    return {"train": str(target), "source": str(source)}


def resolve_repo_path(path: str) -> Path:
    from harness.config import REPO_ROOT

    candidate = Path(path)
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate


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
        from harness.models import save_policy

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


def run_training(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict:
    """Train ``spec`` from the warm start under the budget; write checkpoints, metrics.jsonl and run.json."""
    from datasets import Dataset
    from transformers import set_seed

    from harness.trainer import MetricsWriter, TargetedGRPOTrainer, grpo_config, reward_function
    from methods.registry import get_method_class

    preset = resolved.preset
    torch.set_num_threads(preset.train.threads)
    run_seed = seed + spec.seed_offset  # the sweep seed names the run; the offset separates A/A labels
    set_seed(run_seed)
    run_dir = paths.run_dir(spec.label, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = preset.train.budget
    max_steps = int(budget.amount)
    checkpoints = {checkpoint_step(f, max_steps): run_dir / checkpoint_name(f) for f in budget.checkpoint_fractions}
    for directory in checkpoints.values():
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
    model, tokenizer = load_policy(paths.warmstart_dir, preset.model.dtype)
    rows = training_rows(resolved, paths, run_seed)
    dataset = Dataset.from_list([{"prompt": render_prompt(preset.prompt_template, r["problem"], tokenizer),
                                  "answer": r["answer"]} for r in rows])
    method = get_method_class(spec.name)(spec.params)
    metrics_partial = run_dir / "metrics.jsonl.partial"
    metrics_partial.unlink(missing_ok=True)
    trainer = TargetedGRPOTrainer(
        model=model, processing_class=tokenizer, train_dataset=dataset,
        reward_funcs=[reward_function(preset.train.reward, preset.eval.scoring_timeout_s)],
        args=grpo_config(preset, run_dir, run_seed, max_steps), method=method, preset=preset, run_seed=run_seed,
        sample_batch_path=run_dir / "sample_batch.json")
    trainer.add_callback(MetricsWriter(metrics_partial, checkpoints, tokenizer, trainer.counters))
    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started
    metrics_partial.replace(run_dir / "metrics.jsonl")
    record = {
        "sweep": resolved.sweep.name, "method": {"label": spec.label, "name": spec.name,
                                                  "params": json.loads(json.dumps(spec.params.__dict__, default=str)),
                                                  "deviations": list(method.deviations)},
        "seed": seed, "run_seed": run_seed, "config": resolved.to_dict(), "config_yaml": dump_yaml(resolved.to_dict()),
        "budget": {"kind": budget.kind, "amount": budget.amount, "spent_steps": trainer.state.global_step,
                   "checkpoints": {checkpoint_name(f): checkpoint_step(f, max_steps)
                                   for f in budget.checkpoint_fractions}},
        "counters": {k: v for k, v in vars(trainer.counters).items() if k != "per_step"},
        "train_seconds": elapsed,
        "provenance": provenance({"train": paths.data_dir / "train.jsonl"}),
    }
    write_json_atomic(run_dir / "run.json", record)
    return record
