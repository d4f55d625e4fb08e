"""The machine a measurement ran on: versions, hardware, date, how busy it was (it may be shared), and a timer of
wall and process CPU seconds. bench/cpu_quota.sh emulates a slower machine for a whole command."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def environment(cpu_free_flag: Path | None = None) -> dict:
    """Versions, hardware, date, and how busy the machine was (it may be shared)."""
    import torch

    from harness.config.provenance import git_state, package_versions

    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "git_commit": git_state()["commit"],
        "hardware": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "memory_bytes": memory_total_bytes(),
                     "platform": platform.platform(), "cuda": torch.cuda.is_available(),
                     "torch_threads": torch.get_num_threads()},
        "load_average": os.getloadavg(),
        # True / False: the flag file existed / did not (False: measured while something else ran); None: no flag
        "cpu_free_flag": cpu_free_flag.exists() if cpu_free_flag is not None else None,
        "argv": sys.argv,
    }


def machine_state(env: dict) -> str:
    """How the summaries describe the machine during a measurement."""
    if env.get("cpu_free_flag") is None:
        return f"load average {env['load_average'][0]:.1f} on {env['hardware']['cpu_count']} CPUs at the start"
    return "free" if env["cpu_free_flag"] else "SHARED with a sweep"


class Timer:
    """Wall (perf_counter) and process CPU (process_time) seconds of a block."""

    def __enter__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        return False
