"""Data files: sha256 checks against ``SHA256SUMS``, strict JSON and JSONL reading, atomic writes.

``SHA256SUMS`` uses the ``sha256sum`` format (``<64 hex>  <path relative to the SHA256SUMS folder>``), so
``cd data && sha256sum -c SHA256SUMS`` checks the same thing ``verify_checksum`` does.

Atomic writes go to a temp file in the destination folder, are fsynced, then ``os.replace``d over the target:
a job killed mid-write leaves at most a stray ``.tmp`` file, never a complete-looking truncated output. A link
planted at the target's name is replaced, never written through (the staging name is unpredictable: mkstemp).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.config.paths import REPO_ROOT

CHECKSUM_FILE = "SHA256SUMS"


class DataFileError(ValueError):
    """A data file is missing, corrupt, unlisted or malformed; the message names the file (and line)."""


def sha256_file(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (training sets are several MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def read_checksums(sums_file: Path) -> dict[str, str]:
    """``SHA256SUMS`` -> {relative path: hex digest}; a malformed line raises naming file:line."""
    table: dict[str, str] = {}
    for lineno, line in enumerate(sums_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(maxsplit=1)
        digest = parts[0].lower()
        if len(parts) != 2 or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise DataFileError(f"{sums_file}:{lineno}: expected '<sha256 hex>  <path>', got {line!r}")
        name = parts[1].strip().removeprefix("*")  # sha256sum -b marks binary mode with '*'
        table[os.path.normpath(name)] = digest
    return table


def _search_dirs(path: Path) -> list[Path]:
    """The file's folder and its ancestors, stopping at the repo root for files inside the repo."""
    dirs = [path.parent, *path.parent.parents]
    if path.is_relative_to(REPO_ROOT):
        dirs = [d for d in dirs if d.is_relative_to(REPO_ROOT)]
    return dirs


def find_expected_checksum(path: str | Path) -> tuple[str, Path]:
    """(expected digest, SHA256SUMS file) from the nearest ``SHA256SUMS`` that lists ``path``."""
    path = Path(path).resolve()
    consulted = []
    for folder in _search_dirs(path):
        sums_file = folder / CHECKSUM_FILE
        if not sums_file.is_file():
            continue
        consulted.append(str(sums_file))
        table = read_checksums(sums_file)
        key = os.path.normpath(str(path.relative_to(folder)))
        if key in table:
            return table[key], sums_file
    where = ", ".join(consulted) if consulted else f"no {CHECKSUM_FILE} in {path.parent} or its ancestors"
    raise DataFileError(f"{path}: not listed in any {CHECKSUM_FILE} (consulted: {where}); "
                        f"add its line with `sha256sum` from the folder holding {CHECKSUM_FILE}")


def verify_checksum(path: str | Path) -> str:
    """Check ``path`` against the nearest ``SHA256SUMS`` listing it; return the digest or raise naming both."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: data file not found")
    expected, sums_file = find_expected_checksum(path)
    actual = sha256_file(path)
    if actual != expected:
        raise DataFileError(f"{path}: sha256 mismatch: expected {expected} (from {sums_file}), actual {actual}")
    return actual


def jsonl_objects(path: str | Path, where: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSONL file; a line that is not a JSON object raises naming
    ``where:line`` (``where``: the file by default)."""
    where = str(path) if where is None else where
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{where}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{where}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | Path, required: Iterable[str] = ("id", "problem", "answer")) -> list[dict[str, Any]]:
    """Rows of a JSONL file; every row must be an object with each ``required`` key present and non-empty.

    Blank lines are skipped. Errors name ``file:line``.
    """
    path = Path(path)
    required = tuple(required)
    rows = []
    for lineno, row in jsonl_objects(path):
        for key in required:
            value = row.get(key)
            if value is None or (isinstance(value, str) and not value.strip()):
                state = "missing" if key not in row else "empty"
                raise DataFileError(f"{path}:{lineno}: required key {key!r} is {state}")
        rows.append(row)
    return rows


def read_json(path: str | Path) -> Any:
    """A JSON file; malformed JSON raises naming the file, line and column."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFileError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None


def _write_atomic(path: str | Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """One JSON object per line (UTF-8, ``ensure_ascii=False``), replacing ``path`` in one step."""

    def write(handle):
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    return _write_atomic(path, write)


def write_json_atomic(path: str | Path, obj: Any, indent: int = 2) -> Path:
    """``obj`` as indented JSON, replacing ``path`` in one step."""

    def write(handle):
        json.dump(obj, handle, ensure_ascii=False, indent=indent)
        handle.write("\n")

    return _write_atomic(path, write)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``text`` as UTF-8, replacing ``path`` in one step."""
    return _write_atomic(path, lambda handle: handle.write(text))


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path``, created (0644) when missing; a symbolic link there is refused, never
    written through (a log growing line by line cannot be staged and renamed like the files above)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        if Path(path).is_symlink():
            raise ValueError(f"{path} is a symbolic link: refusing to append through it (remove it; a sweep "
                             "folder's files are never links)") from None
        raise
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(text)


def write_sha256sums(folder: str | Path, files: Iterable[str | Path]) -> Path:
    """Add or refresh ``files``' lines in ``folder/SHA256SUMS`` (other lines kept, sorted), written atomically.

    For generated data (e.g. the synthetic eval sets): write the JSONL files, then call this, so that
    ``verify_checksum`` and ``sha256sum -c SHA256SUMS`` accept them.
    """
    folder = Path(folder).resolve()
    sums_file = folder / CHECKSUM_FILE
    table = read_checksums(sums_file) if sums_file.is_file() else {}
    for path in files:
        path = Path(path).resolve()
        if not path.is_relative_to(folder):
            raise DataFileError(f"{path}: not inside {folder}, so {sums_file} cannot list it")
        table[os.path.normpath(str(path.relative_to(folder)))] = sha256_file(path)

    def write(handle):
        for name in sorted(table):
            handle.write(f"{table[name]}  {Path(name).as_posix()}\n")

    return _write_atomic(sums_file, write)
