"""The contents of a sweep's local input files, checked when the sweep is resolved (before any job runs).

Every benchmark file and the training file (``data.kind`` jsonl or mixed) must be a non-empty UTF-8 JSONL file
without a byte order mark whose rows are JSON objects holding a non-empty ``id``, ``problem`` and ``answer``; a
benchmark's ids must not repeat, and no benchmark may share a problem with the training rows (train on the test
set). Problems are compared by a hash of
their normalised text (``problem_key``), over the rows a sweep uses: the first ``data.max_train_rows`` training rows
and the first ``eval.benchmarks.<name>.limit`` rows of each benchmark.

Not checked here: files the sweep's data job generates (``{data_dir}``: synthetic splits) and hub datasets
(``data.kind: hub``), which only the data job reads (harness/data/hub.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
from collections import Counter
from pathlib import Path

from harness.config.paths import resolve_repo_path
from harness.config.schema import PresetConfig

REQUIRED_ROW_KEYS = ("id", "problem", "answer")
UTF8_BOM = b"\xef\xbb\xbf"


class InputFileError(ValueError):
    """A local input file's content is unusable; the message names the file (and line)."""


def problem_key(text: str) -> str:
    """A hash of a problem's text after Unicode NFKC, case folding and removing all whitespace: the same problem
    typed with other spacing or case has the same key."""
    normalised = "".join(unicodedata.normalize("NFKC", text).casefold().split())
    return hashlib.sha256(normalised.encode()).hexdigest()


def _row_index(line: str, where: str) -> tuple[str, str]:
    """(id, problem key) of one JSONL line; raises naming ``where`` (file:line) when the row is unusable."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise InputFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in REQUIRED_ROW_KEYS:
        value = row.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise InputFileError(f"{where}: required key {key!r} is {'missing' if key not in row else 'empty'}")
    return str(row["id"]), problem_key(str(row["problem"]))


@functools.lru_cache(maxsize=64)
def _rows_index(path: Path, _mtime_ns: int, _size: int) -> tuple[tuple[str, str], ...]:
    """(id, problem key) of each row of a JSONL file, in order (cached while the file is unchanged)."""
    data = path.read_bytes()
    if data.startswith(UTF8_BOM):
        raise InputFileError(f"{path}:1: starts with a UTF-8 byte order mark (BOM); save the file as UTF-8 "
                             "without a BOM")
    rows = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputFileError(f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
        if line.strip():
            rows.append(_row_index(line, f"{path}:{lineno}"))
    if not rows:
        raise InputFileError(f"{path}: has no rows ({len(data)} bytes): a JSONL file of {{id, problem, answer}} "
                             "rows is needed")
    return tuple(rows)


def rows_index(path: Path, first: int = 0) -> tuple[tuple[str, str], ...]:
    """(id, problem key) of the first ``first`` rows of a JSONL file (0: all), after checking every row."""
    stat = path.stat()
    rows = _rows_index(path, stat.st_mtime_ns, stat.st_size)
    return rows[:first] if first else rows


Inputs = dict[str, tuple[Path, int]]  # dotted key -> (file, rows used: 0 = all)


def local_inputs(preset: PresetConfig) -> tuple[Inputs, Inputs]:
    """(benchmark files, training file): the local files the preset names, with the rows it uses of each."""
    benches = {f"eval.benchmarks.{name}.file": (resolve_repo_path(bench.file), bench.limit)
               for name, bench in sorted(preset.eval.benchmarks.items()) if "{data_dir}" not in bench.file}
    data = preset.data
    train = ({"data.train_file": (resolve_repo_path(data.train_file), data.max_train_rows)}
             if data.kind in ("jsonl", "mixed") else {})
    return benches, train


def input_file_problems(preset: PresetConfig) -> list[str]:
    """What is wrong with the content of the preset's local input files (module docstring), by dotted key."""
    benches, train = local_inputs(preset)
    indexed, problems = {}, []
    for key, (path, first) in {**benches, **train}.items():
        try:
            indexed[key] = rows_index(path, first)
        except InputFileError as exc:
            problems.append(f"key '{key}': {exc}")
    readable = {key: benches[key][0] for key in benches if key in indexed}
    problems += [p for key, path in readable.items() for p in _duplicate_ids(key, path, indexed[key])]
    for key, (path, _) in train.items():
        if key in indexed:
            trained = {problem for _, problem in indexed[key]}
            problems += [p for bench_key, bench_path in readable.items()
                         for p in _overlap(bench_key, bench_path, indexed[bench_key], trained, f"{path} (key '{key}')")]
    return problems


def _duplicate_ids(key: str, path: Path, rows: tuple[tuple[str, str], ...]) -> list[str]:
    repeated = sorted(row_id for row_id, count in Counter(row_id for row_id, _ in rows).items() if count > 1)
    return [f"key '{key}': {path}: ids {repeated[:5]} repeat (per-sample results are keyed by id)"] if repeated else []


def _overlap(key: str, path: Path, rows: tuple[tuple[str, str], ...], trained: set[str], train: str) -> list[str]:
    """A benchmark whose problems (by ``problem_key``) are among the training rows'."""
    shared = sum(problem in trained for _, problem in rows)
    if not shared:
        return []
    return [f"key '{key}': {shared} of the {len(rows)} problems of {path} are also in the training file {train}: "
            "the runs would train on the test set"]
