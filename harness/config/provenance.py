"""What every run records so it can be reproduced: versions, git commit, hardware, data checksums."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from harness.config.paths import REPO_ROOT

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


def hardware() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def provenance(data_files: dict[str, Path] | None = None) -> dict:
    """Versions, git, hardware and the sha256 of each named data file."""
    from harness.data.files import sha256_file

    record = {"versions": package_versions(), "git": git_state(), "hardware": hardware()}
    if data_files:
        record["data_sha256"] = {name: sha256_file(path) for name, path in data_files.items()}
    return record
