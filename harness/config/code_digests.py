"""Which code a result came from: digests of the source files that decide it, recorded in every run and result.

A method module is the label's own code: its source (and the modules of its package it imports, but the shared
``base``, ``declaration`` and ``registry``) is part of the label's training digest
(``harness.config.snapshot.train_job_config``), so editing a method reruns exactly that method's train jobs. Shared
code is not: rerunning every job of a sweep on every edit of ``harness/`` would make the sweep unusable while it is
developed. Instead every run records the digest of the shared training code, of the evaluation code (scoring,
lm-eval task YAMLs) and of the installed package set (``code_record``); ``stale_by_code`` names the finished runs
whose recorded digests differ from the checkout's, for ``harness plan`` and the Snakefile's parse to list, and the
report marks comparisons across them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
import json
from functools import cache
from pathlib import Path

from harness.config.paths import REPO_ROOT

# shared code per result kind, as paths below the checkout (folders: every .py, .yaml and .j2 file in them)
TRAINING_CODE = ("harness/train", "harness/model", "harness/data", "methods/base.py", "methods/registry.py")
EVALUATION_CODE = ("harness/evaluation", "harness/data", "harness/model")
SHARED_METHOD_MODULES = ("base", "declaration", "registry")
SOURCE_SUFFIXES = (".py", ".yaml", ".j2")


def files_digest(files: list[Path], root: Path = REPO_ROOT) -> str:
    """sha256 over each file's path below ``root`` and content, in path order."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: str(p.relative_to(root))):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def source_files(parts: tuple[str, ...], root: Path = REPO_ROOT) -> list[Path]:
    """The source files of ``parts`` (files, or folders searched recursively), without caches."""
    out = []
    for part in parts:
        path = root / part
        found = [path] if path.is_file() else path.rglob("*")
        out += [p for p in found if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts]
    return sorted(set(out))


def method_source_files(method: str) -> list[Path]:
    """The registered method's module file and the modules of its package it imports (transitively), but the
    package's shared ``base``, ``declaration`` and ``registry``."""
    from methods.registry import get_method_class

    first = Path(inspect.getsourcefile(get_method_class(method))).resolve()
    package_dir, seen, todo = first.parent, set(), [first]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += [sibling for sibling in _imported_siblings(path, package_dir) if sibling not in seen]
    return sorted(seen)


def _imported_siblings(path: Path, package_dir: Path) -> list[Path]:
    """Modules of ``package_dir`` that the module at ``path`` may import: every imported module's last name and
    every name imported from a module, that is a file there (``from methods.x import``, ``from . import x``), but
    the shared ones. A name that only looks like a sibling adds a file: more reruns, never fewer."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            names.update([(node.module or "").split(".")[-1], *(alias.name for alias in node.names)])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[-1] for alias in node.names)
    candidates = (package_dir / f"{name}.py" for name in sorted(names - set(SHARED_METHOD_MODULES)) if name)
    return [c.resolve() for c in candidates if c.is_file()]


def method_source_digest(method: str) -> str:
    """A short digest of ``method_source_files``: part of the label's training digest."""
    files = method_source_files(method)
    return files_digest(files, files[0].parent)[:16]


@cache
def packages_digest() -> str:
    """sha256 of every installed distribution as ``name==version``, sorted (once per process)."""
    installed = sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in importlib.metadata.distributions()
                        if d.metadata["Name"]})
    return hashlib.sha256("\n".join(installed).encode()).hexdigest()


@cache
def shared_code_digest(parts: tuple[str, ...], root: Path = REPO_ROOT) -> str:
    """``files_digest`` of ``source_files(parts)`` (once per process: a job's code does not change under it)."""
    return files_digest(source_files(parts, root), root)


def code_record(method: str | None = None, root: Path = REPO_ROOT) -> dict[str, str]:
    """What a run (``method``: its registered method) or an evaluation (None) records of its code."""
    record = {"training_code": shared_code_digest(TRAINING_CODE, root),
              "evaluation_code": shared_code_digest(EVALUATION_CODE, root), "packages": packages_digest()}
    if method is not None:
        record["method_source"] = method_source_digest(method)
    return record


STALE_KEYS = {"training_code": "shared training code", "evaluation_code": "evaluation code",
              "packages": "installed packages"}


def stale_by_code(recorded: dict[str, dict], current: dict[str, str]) -> dict[str, list[str]]:
    """{result name: what differs} for the results in ``recorded`` (name -> its recorded code record, e.g. run.json's
    ``provenance.code``) whose shared code or package digests differ from ``current`` (``code_record()``); results
    recorded before code digests existed count as differing in everything."""
    stale = {}
    for name, record in recorded.items():
        differs = [label for key, label in STALE_KEYS.items() if key in current and record.get(key) != current[key]]
        if differs:
            stale[name] = differs
    return stale


def stale_results(paths, labels: list[str]) -> list[str]:
    """Lines naming each finished run (``run.json``) and evaluation (``results.json``) of ``labels`` under the sweep
    folder ``paths`` (``SweepPaths``) whose recorded code differs from this checkout's: their numbers came from
    other code, and nothing reruns them by itself (delete the folder of a result to recompute it)."""
    current = code_record()
    recorded = {}
    for label in labels:
        for run_file in sorted((paths.root / "runs" / label).glob("seed*/run.json")):
            recorded[f"run {label}/{run_file.parent.name}"] = _code_of(run_file, ("provenance", "code"))
        for results in sorted((paths.root / "eval" / label).glob("seed*/*/*/results.json")):
            name = f"evaluation {label}/{'/'.join(results.parts[-4:-1])}"
            recorded[name] = {**_code_of(results, ("code",)), "training_code": current["training_code"]}
    return [f"{name}: {', '.join(differs)} differ from this checkout's"
            for name, differs in stale_by_code(recorded, current).items()]


def _code_of(path: Path, keys: tuple[str, ...]) -> dict:
    """The code record at ``keys`` of a JSON result file; {} when it has none (written before code digests)."""
    record = json.loads(path.read_text(encoding="utf-8"))
    for key in keys:
        record = record.get(key, {}) if isinstance(record, dict) else {}
    return record if isinstance(record, dict) else {}
