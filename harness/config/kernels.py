"""The CPU kernel dispatch of a job (``cpu_kernels`` of the preset): pinned to one ISA level, or the machine's own.

torch (ATen), MKL and oneDNN each pick their code path by the CPU they find: AVX512 on one server, AVX2 on another,
and the two give different bits for the same matmul or softmax. ``pinned`` holds all three to AVX2, which every
current x86-64 server has, and turns on torch's deterministic algorithms; with the thread count fixed per job
(``train.threads``, ``eval.threads``, ``warmstart.threads``) a CPU run is then bit-identical across x86-64
machines. The variables are read once, when each library first dispatches, so they must be in the environment
before torch is imported: the Snakefile exports them for every job (``shell_exports``), and ``harness`` runs itself
again with them when they are missing (harness/cli.py). ``native`` leaves the dispatch to the machine (GPU presets:
no CPU kernel decides their numbers).

This module imports no torch at import time: the Snakefile reads it while it parses.
"""

from __future__ import annotations

import os
import shlex

# MKL_CBWR: AVX2 is the branch, STRICT also makes gemm independent of the data's alignment (oneMKL developer guide,
# "Conditional Numerical Reproducibility"); on non-Intel CPUs MKL runs its AUTO branch whatever this says
PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def kernel_env(cpu_kernels: str) -> dict[str, str]:
    """The environment a job of ``cpu_kernels`` needs before torch is imported."""
    if cpu_kernels not in ("pinned", "native"):
        raise ValueError(f"key 'cpu_kernels': {cpu_kernels!r} is not one of ['pinned', 'native']")
    return dict(PINNED_ENV) if cpu_kernels == "pinned" else {}


def shell_exports(cpu_kernels: str) -> str:
    """Shell ``export`` statements of ``kernel_env`` (empty for native), for a job's command prefix."""
    return "".join(f"export {name}={shlex.quote(value)}; " for name, value in kernel_env(cpu_kernels).items())


def missing_kernel_env(cpu_kernels: str, environ: dict | None = None) -> dict[str, str]:
    """The variables of ``kernel_env`` that ``environ`` (default: this process's) lacks or holds another value of."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in kernel_env(cpu_kernels).items() if environ.get(name) != value}


def apply_cpu_kernels(cpu_kernels: str) -> None:
    """Deterministic algorithms on for pinned kernels (process-wide: torch then refuses an op without a
    deterministic implementation instead of running it). Warns when the pinned variables were not in the
    environment before torch was imported: the run is then not reproducible on another machine."""
    import warnings

    import torch

    missing = missing_kernel_env(cpu_kernels)
    if missing:
        warnings.warn(f"cpu_kernels=pinned but {missing} were not set before torch was imported: this process runs "
                      "the machine's own kernels (export them, or start the job with `harness`, which sets them)",
                      stacklevel=2)
    torch.use_deterministic_algorithms(cpu_kernels == "pinned")


def kernels_in_effect(cpu_kernels: str) -> dict:
    """What a run.json records of its kernels: the setting, the variables as this process saw them, the ISA level
    torch dispatches to, whether deterministic algorithms were on, torch's thread count and the CPU model."""
    import torch

    return {"cpu_kernels": cpu_kernels, "env": {name: os.environ.get(name) for name in PINNED_ENV},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "torch_threads": torch.get_num_threads()}
