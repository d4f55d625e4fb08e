"""What every run records so it can be reproduced: versions, git commit, hardware, data checksums; and the run
record itself (``run.json``), written by training and by ``harness fetch``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess

import torch

from harness.config.code_digests import code_record
from harness.config.kernels import kernels_in_effect
from harness.config.loading import dump_yaml
from harness.config.package_lock import lock_provenance
from harness.config.paths import REPO_ROOT
from harness.config.schema import MethodSpec, Resolved

PACKAGES = ("torch", "transformers", "trl", "accelerate", "lm-eval", "math-verify", "snakemake", "omegaconf",
            "vllm", "tokenizers", "datasets")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


def git_state() -> dict[str, str | bool | None]:
    def run(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what the platform module says."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def provenance(data_sha256: dict[str, str] | None = None) -> dict:
    """Versions, git, hardware, the lock file the installed packages match (``lock``: its path and sha256, or None
    with ``lock_closest``; harness/config/package_lock.py) and ``data_sha256`` (data file name -> sha256, computed by
    the caller)."""
    record = {"versions": package_versions(), "git": git_state(), "hardware": hardware(), **lock_provenance()}
    if data_sha256:
        record["data_sha256"] = dict(data_sha256)
    return record


def run_record(resolved: Resolved, spec: MethodSpec, seed: int, run_seed: int, deviations: list[str], budget: dict,
               counters: dict, train_seconds: float | None, *, resumed_from: str | None = None,
               external: dict | None = None, data_sha256: dict[str, str] | None = None) -> dict:
    """The content of a run's ``run.json``: the sweep, the method label with its parameters and deviations, the seeds,
    the resolved configuration (as a dict and as YAML), the budget and counters, and provenance.

    A trained run records ``resumed_from`` (the trainer checkpoint it resumed from, or None); a released checkpoint
    (``external``: where it came from) was not trained here and records no ``resumed_from``. The report reads
    these files. ``data_sha256``: the sha256 of each data file the run read, by name."""
    config = resolved.to_dict()
    record = {
        "sweep": resolved.sweep.name,
        "method": {"label": spec.label, "name": spec.name,
                   "params": json.loads(json.dumps(spec.params.__dict__, default=str)),
                   "deviations": list(deviations)},
        "seed": seed, "run_seed": run_seed, "config": config, "config_yaml": dump_yaml(config),
    }
    if external is not None:
        record["external"] = external
    record.update(budget=budget, counters=counters)
    if external is None:
        record["resumed_from"] = resumed_from
    record.update(train_seconds=train_seconds, provenance=provenance(data_sha256))
    record["provenance"]["kernels"] = kernels_in_effect(resolved.preset.cpu_kernels)
    # which code: a released checkpoint was trained elsewhere, no method module of ours trained it
    record["provenance"]["code"] = code_record(spec.name if external is None else None)
    return record
