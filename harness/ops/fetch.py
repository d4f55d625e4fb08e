"""Released checkpoints as eval-only runs: ``harness fetch`` (the Snakefile's ``fetch`` rule).

A method label whose config names ``checkpoint: <hub id>[@revision]`` (or a local model directory) is not
trained: the checkpoint is loaded once (from the hub where the node has access or a pre-filled HF cache, else a
local path), saved as the run's full-budget checkpoint ``runs/<label>/seed<S>/ckpt-100/`` and described by a
``run.json`` with no budget spent. From there the eval and report rules treat it like any run, so the released
model is scored under exactly our evaluation protocol.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.config.paths import SweepPaths, checkpoint_name
from harness.config.schema import MethodSpec, Resolved, dump_yaml
from harness.data.files import sha256_file, write_json_atomic


def split_checkpoint(checkpoint: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ("org/name", "rev"); a local directory (or a name without @) has no revision."""
    if "@" in checkpoint and not Path(checkpoint).exists():
        name, revision = checkpoint.rsplit("@", 1)
        return name, revision or None
    return checkpoint, None


def fetch_checkpoint(resolved: Resolved, spec: MethodSpec, seed: int, paths: SweepPaths) -> dict:
    """Save ``spec.checkpoint`` as the run's final checkpoint and write its ``run.json``; return the record."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.config.provenance import provenance
    from harness.model.policy import _DTYPES, save_policy
    from harness.train.run import resolve_repo_path

    if not spec.checkpoint:
        raise ValueError(f"method label {spec.label!r} names no checkpoint; it is trained, not fetched")
    name, revision = split_checkpoint(spec.checkpoint)
    local = resolve_repo_path(name)
    source = str(local) if local.is_dir() else name
    run_dir = paths.run_dir(spec.label, seed)
    final = run_dir / checkpoint_name(1.0)
    staging = final.with_name(final.name + ".partial")
    (run_dir / "run.json").unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    model = AutoModelForCausalLM.from_pretrained(source, revision=revision,
                                                 dtype=_DTYPES[resolved.preset.model.dtype])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    save_policy(model, tokenizer, staging)
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    files = {p.name: sha256_file(p) for p in sorted(final.iterdir()) if p.is_file()}
    record = {
        "sweep": resolved.sweep.name,
        "method": {"label": spec.label, "name": spec.name,
                   "params": json.loads(json.dumps(spec.params.__dict__, default=str)),
                   "deviations": [f"released checkpoint {spec.checkpoint}, not trained by this harness: "
                                  "its training protocol and compute are the authors'"]},
        "seed": seed, "run_seed": seed, "config": resolved.to_dict(), "config_yaml": dump_yaml(resolved.to_dict()),
        "external": {"checkpoint": spec.checkpoint, "source": source, "revision": revision,
                     "commit": getattr(model.config, "_commit_hash", None), "files_sha256": files},
        "budget": {"kind": "released", "amount": None, "checkpoints": {checkpoint_name(1.0): None}},
        "counters": {},
        "train_seconds": None,
        "provenance": provenance(),
    }
    write_json_atomic(run_dir / "run.json", record)
    return record
