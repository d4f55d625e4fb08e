"""The starting policy of a sweep, built once: supervised warm start of the char Llama, GGUF dequantisation, or a
copy of a hub model or local directory; written to ``<sweep>/warmstart/model`` with a ``warmstart.json``.

``warmstart.json`` records where the model came from (``source``: for a hub model its id, the revision asked for,
the commit it resolved to and the sha256 of every file loaded, harness/model/hub.py; for a local directory its path
and files) and the sha256 of every file of the warm start written (``files_sha256``). Every later load of the warm
start (the train jobs, the evaluation of the warm start) refuses files that differ from those digests
(harness/model/checkpoints.py ``check_recorded_files``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from harness.config.paths import SweepPaths, resolve_repo_path
from harness.config.provenance import provenance
from harness.config.schema import Resolved, is_local_model
from harness.data.files import write_json_atomic
from harness.data.prepare import read_train_split
from harness.data.prompts import render_prompt
from harness.model.char_llama import warmstart_char_llama
from harness.model.checkpoints import BUILD_RECORD, convert_gguf, load_policy, model_files_sha256, save_policy
from harness.model.hub import hub_model, local_model


def warmstart(resolved: Resolved, paths: SweepPaths) -> dict:
    """Build the starting policy once per sweep: SFT for char_llama, GGUF dequantisation, or a hub/path copy."""
    preset = resolved.preset
    torch.set_num_threads(preset.warmstart.threads)
    out = paths.warmstart_dir
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted build's files would be recorded as the warm start's
    model_cfg = preset.model
    if model_cfg.kind == "char_llama":
        rows = read_train_split(paths, required=("problem", "solution"))
        summary = warmstart_char_llama(model_cfg, preset.warmstart, rows,
                                       lambda p: render_prompt(preset.prompt_template, p), staging)
    elif model_cfg.kind == "gguf":
        summary = convert_gguf(model_cfg, staging)
    else:
        if is_local_model(model_cfg.name_or_path):
            folder = Path(model_cfg.name_or_path)
            folder = folder if folder.is_dir() else resolve_repo_path(model_cfg.name_or_path)
            source = local_model(folder)
        else:  # the hub cache at model.revision (offline in a job: prefetched by `harness prefetch`)
            folder, source = hub_model(model_cfg.name_or_path, model_cfg.revision, model_cfg.allow_unpinned)
        model, tokenizer = load_policy(folder, model_cfg.dtype)
        save_policy(model, tokenizer, staging)
        summary = {"name_or_path": model_cfg.name_or_path, "revision": source.get("revision"),
                   "commit": source.get("commit")}
    record = {**summary, "files_sha256": model_files_sha256(staging), "provenance": provenance()}
    if model_cfg.kind == "pretrained":
        record["source"] = source
    write_json_atomic(staging / BUILD_RECORD, record)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return summary
