"""The starting policy of a sweep, built once: supervised warm start of the char Llama, GGUF dequantisation, or a
copy of a hub model or local directory; written to ``<sweep>/warmstart/model`` with a ``warmstart.json``."""

from __future__ import annotations

import shutil

import torch

from harness.config.paths import SweepPaths
from harness.config.provenance import provenance
from harness.config.schema import Resolved
from harness.data.files import write_json_atomic
from harness.data.prepare import read_train_split
from harness.data.prompts import render_prompt
from harness.model.char_llama import warmstart_char_llama
from harness.model.checkpoints import convert_gguf, load_policy, save_policy


def warmstart(resolved: Resolved, paths: SweepPaths) -> dict:
    """Build the starting policy once per sweep: SFT for char_llama, GGUF dequantisation, or a hub/path copy."""
    preset = resolved.preset
    torch.set_num_threads(preset.warmstart.threads)
    out = paths.warmstart_dir
    staging = out.with_name(out.name + ".partial")
    model_cfg = preset.model
    if model_cfg.kind == "char_llama":
        rows = read_train_split(paths, required=("problem", "solution"))
        summary = warmstart_char_llama(model_cfg, preset.warmstart, rows,
                                       lambda p: render_prompt(preset.prompt_template, p), staging)
    elif model_cfg.kind == "gguf":
        summary = convert_gguf(model_cfg, staging)
    else:
        model, tokenizer = load_policy(model_cfg.name_or_path, model_cfg.dtype)
        save_policy(model, tokenizer, staging)
        summary = {"name_or_path": model_cfg.name_or_path}
    write_json_atomic(staging / "warmstart.json", {**summary, "provenance": provenance()})
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return summary
