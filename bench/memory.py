"""Resident-set probes of this process on Linux (CPU memory): the peak since start or since the last reset, the
current size, and the environment of a measuring subprocess whose resident set follows its live tensors."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def ru_maxrss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB). Cannot be reset."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _status_field(name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int | None:
    return _status_field("VmRSS")


def hwm_bytes() -> int | None:
    """VmHWM: the peak RSS since the process started or since the last ``reset_peak_rss``."""
    return _status_field("VmHWM")


def child_env() -> dict:
    """Environment of a memory-measuring subprocess: glibc's malloc with a fixed mmap threshold (64 kB) returns
    every freed block of 64 kB or more to the OS at once, so the resident set follows the live tensors. (By default
    the threshold grows after the first large free, freed memory then stays resident and a pre-run baseline
    overstates what is in use.)"""
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs). False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
