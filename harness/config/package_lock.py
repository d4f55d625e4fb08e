"""Which lock file the installed packages are: requirements/*.lock (scripts/lock.sh writes them, scripts/setup.sh
installs from them) hold the exact version of every package of an install. A run records the lock whose packages
are exactly the installed ones, by path and sha256 (run.json ``provenance.lock``, results.json ``lock``), or null when
no lock matches, with how the installed packages differ from the closest lock (``lock_closest``).

Installed means the distributions of this interpreter's site-packages, less those installed from a folder of this
checkout (the harness itself, editable, and scripts/vllm-cpu's alias): they are this code, not locked packages.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sysconfig
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlparse

from harness.config.paths import REPO_ROOT

LOCK_DIR = REPO_ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Jinja2`` and ``jinja2``, ``lm_eval`` and ``lm-eval`` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{canonical name: version} of the ``name==version`` lines of a lock file (comments and annotations skipped)."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            pins[canonical_name(match[1])] = match[2]
    return pins


def lock_files(lock_dir: Path = LOCK_DIR) -> list[Path]:
    return sorted(lock_dir.glob("*.lock"))


def _from_checkout(dist: importlib.metadata.Distribution, root: Path) -> bool:
    """Whether ``dist`` was installed from a folder inside ``root`` (PEP 610 direct_url.json)."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        return False
    url = urlparse(direct.get("url", ""))
    return url.scheme == "file" and Path(unquote(url.path)).resolve().is_relative_to(root.resolve())


@cache
def installed_packages(root: Path = REPO_ROOT) -> dict[str, str]:
    """{canonical name: version} of the distributions in this interpreter's site-packages, less those installed from
    a folder of the checkout ``root`` (read once per process: a job's packages do not change under it)."""
    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    out = {}
    for dist in importlib.metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name and not _from_checkout(dist, root):
            out.setdefault(canonical_name(name), dist.version)
    return out


def differences(installed: dict[str, str], pins: dict[str, str]) -> list[str]:
    """How ``installed`` differs from a lock's ``pins``, one line per package, by name."""
    lines = []
    for name in sorted(installed.keys() | pins.keys()):
        have, locked = installed.get(name), pins.get(name)
        if have is None:
            lines.append(f"{name}: locked {locked}, not installed")
        elif locked is None:
            lines.append(f"{name}: {have} installed, not in the lock")
        elif have != locked:
            lines.append(f"{name}: {have} installed, locked {locked}")
    return lines


def lock_provenance(lock_dir: Path = LOCK_DIR, installed: dict[str, str] | None = None) -> dict:
    """``{"lock": {"file", "sha256"}}`` of the lock whose packages are exactly the installed ones; else
    ``{"lock": None}`` with ``lock_closest``: the lock with the fewest differing packages, its sha256 and the
    differences (none when there is no lock file)."""
    installed = dict(installed_packages()) if installed is None else installed
    closest = None
    for path in lock_files(lock_dir):
        name = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)
        entry = {"file": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        differs = differences(installed, read_lock(path))
        if not differs:
            return {"lock": entry}
        if closest is None or len(differs) < len(closest["differs"]):
            closest = {**entry, "differs": differs}
    return {"lock": None, "lock_closest": closest}
