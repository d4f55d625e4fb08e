"""Released checkpoints as eval-only runs: ``harness fetch`` (the Snakefile's ``fetch`` rule).

A method label whose config names ``checkpoint: <hub id>[@revision]`` (or a local model directory) is not
trained: the checkpoint is loaded once (a hub id from the hub cache at its revision, harness/model/hub.py: offline
in a job, after `harness prefetch`; else a local path), saved as the run's full-budget checkpoint
``runs/<label>/seed<S>/ckpt-100/`` and described by a ``run.json`` with no budget spent (the commit read and the
sha256 of the files loaded and saved). From there the eval and report rules treat it like any run, so the released
model is scored under exactly our evaluation protocol.
"""

from __future__ import annotations

import shutil

from harness.config.paths import SweepPaths, checkpoint_name, resolve_repo_path
from harness.config.provenance import run_record
from harness.config.schema import MethodSpec, Resolved
from harness.data.files import sha256_file, write_json_atomic
from harness.model.checkpoints import load_policy, save_policy
from harness.model.hub import hub_model, split_checkpoint

__all__ = ["fetch_checkpoint", "split_checkpoint"]


def fetch_checkpoint(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict:
    """Save ``spec.checkpoint`` as the run's final checkpoint and write its ``run.json``; return the record."""
    if not spec.checkpoint:
        raise ValueError(f"method label {spec.label!r} names no checkpoint; it is trained, not fetched")
    name, revision = split_checkpoint(spec.checkpoint)
    local = resolve_repo_path(name)
    source = str(local) if local.is_dir() else name
    folder, origin = (local, None) if local.is_dir() else hub_model(name, revision)
    run_dir = paths.run_dir(spec.label, seed)
    final = run_dir / checkpoint_name(1.0)
    staging = final.with_name(final.name + ".partial")
    (run_dir / "run.json").unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    model, tokenizer = load_policy(folder, resolved.preset.model.dtype)
    save_policy(model, tokenizer, staging)
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    files = {p.name: sha256_file(p) for p in sorted(final.iterdir()) if p.is_file()}
    deviations = [f"released checkpoint {spec.checkpoint}, not trained by this harness: "
                  "its training protocol and compute are the authors'"]
    record = run_record(resolved, spec, seed, seed, deviations,
                        budget={"kind": "released", "amount": None, "checkpoints": {checkpoint_name(1.0): None}},
                        counters={}, train_seconds=None,
                        external={"checkpoint": spec.checkpoint, "source": source, "revision": revision,
                                  "commit": origin["commit"] if origin else None, "files_sha256": files,
                                  "source_files_sha256": origin["files_sha256"] if origin else None})
    write_json_atomic(run_dir / "run.json", record)
    return record
