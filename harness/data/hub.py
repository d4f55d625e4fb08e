"""Training sets from the Hugging Face hub (``data.kind: hub``): the files of a dataset repository at a pinned commit,
their rows mapped to the harness's {id, problem, answer} rows, and where they came from.

Only the sweep's data job reads the hub (``prepare_data``, the Snakefile's ``data`` rule, once per sweep):
``huggingface_hub.snapshot_download`` puts the listed files of the repository at ``data.hub.revision`` in the hub
cache (HF_HUB_CACHE / HF_HOME; with HF_HUB_OFFLINE=1, which the jobs of a sweep that reads the hub set, it reads a
cache filled beforehand by ``harness prefetch``, harness/ops/prefetch.py), this module writes their rows to the sweep's
``train.jsonl`` and the provenance to ``source.json`` beside it (both in the data folder's SHA256SUMS). Training reads
``train.jsonl`` like any other training file and copies the source checksums into run.json (``source_checksums``).

``source.json``: the hub id, the revision asked for and the commit read, the column mapping and problem transform,
each source file with its sha256, size and the rows taken from it, and the rows and sha256 of ``train.jsonl``.

A row's ``id`` is ``<repo path>:<row number in that file, from 0>``; ``source`` is the hub id. Rows keep the order
of the files and of the rows in each file (a seed shuffles them at training time); duplicates are kept, as a
trainer reading the files would see them.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.config.schema import COMMIT_SHA, HubDataConfig, column_path_parts, hub_pinned_digests
from harness.data.files import (
    DataFileError,
    jsonl_objects,
    read_json,
    sha256_file,
    verify_checksum,
    write_json_atomic,
    write_jsonl_atomic,
)

SOURCE_FILE = "source.json"  # the data folder's record of where train.jsonl came from
BATCH_ROWS = 4096  # parquet rows converted at a time: a 300 MB file is never held as Python objects at once

# DAPO-Math-17k's prompt (BytedTsinghua-SIA/DAPO-Math-17k, column prompt[0].content): the problem between this
# instruction and reminder. The text is as several public preprocessing scripts of that dataset strip it; it was not
# checked against the parquet file here (no hub access), which is why every row must match it exactly: a dataset
# whose rows differ stops the data job naming the row instead of training on half-stripped prompts.
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def strip_dapo_instruction(text: str) -> str:
    """The problem inside DAPO-Math-17k's instruction; a ValueError when ``text`` does not carry it exactly."""
    if not text.startswith(DAPO_PREFIX):
        raise ValueError(f"does not start with DAPO's instruction {DAPO_PREFIX[:48]!r}...")
    if not text.endswith(DAPO_SUFFIX):
        raise ValueError(f"does not end with DAPO's reminder {DAPO_SUFFIX!r}")
    problem = text[len(DAPO_PREFIX):len(text) - len(DAPO_SUFFIX)].strip()
    if not problem:
        raise ValueError("holds DAPO's instruction around an empty problem")
    return problem


PROBLEM_TRANSFORMS = {"none": lambda text: text, "strip_dapo_instruction": strip_dapo_instruction}


class _PathError(ValueError):
    pass


def column_value(row: dict[str, Any], parts: list[str | int]) -> Any:
    """The value at a parsed column path (``column_path_parts``); a ValueError says which step failed."""
    value: Any = row
    walked = ""
    for part in parts:
        if isinstance(part, int):
            if not isinstance(value, list | tuple):
                raise _PathError(f"{walked or 'the row'} is {type(value).__name__}, not a list, so [{part}] fails")
            if part >= len(value):
                raise _PathError(f"{walked} has {len(value)} items, so [{part}] is out of range")
            value, walked = value[part], f"{walked}[{part}]"
        else:
            if not isinstance(value, dict):
                raise _PathError(f"{walked or 'the row'} is {type(value).__name__}, not a mapping, so .{part} fails")
            if part not in value:
                raise _PathError(f"key {part!r} is missing in {walked or 'the row'} (keys: {sorted(value)})")
            value, walked = value[part], f"{walked}.{part}" if walked else part
    return value


def download_snapshot(hub: HubDataConfig) -> Path:
    """The local folder of the repository at ``hub.revision`` holding (at least) the files of ``hub.files``:
    huggingface_hub's ``snapshot_download`` into the hub cache, or the cache alone under HF_HUB_OFFLINE=1."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=hub.repo, repo_type="dataset", revision=hub.revision or None,
                                      allow_patterns=list(hub.files)))
    except LocalEntryNotFoundError as exc:  # offline: the CLI names `harness prefetch` (harness/model/hub.py)
        raise LocalEntryNotFoundError(f"dataset {hub.repo}@{hub.revision or 'main'}, files {list(hub.files)}: "
                                      f"{str(exc).splitlines()[0]}") from None


def source_files(snapshot: Path, hub: HubDataConfig) -> list[tuple[str, Path]]:
    """(repo path, local file) of every file ``hub.files`` names, in that order (a glob's matches sorted)."""
    on_disk = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*")
                     if p.is_file() and ".cache" not in p.relative_to(snapshot).parts)
    chosen: list[str] = []
    for pattern in hub.files:
        matches = [name for name in on_disk if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise DataFileError(f"data.hub.files: {pattern!r} matches no file of {hub.repo}@{hub.revision} "
                                f"({snapshot}); its files: {on_disk}")
        chosen += [name for name in matches if name not in chosen]
    unreadable = [name for name in chosen if Path(name).suffix not in (".parquet", ".jsonl")]
    if unreadable:
        raise DataFileError(f"data.hub.files: {unreadable} are neither .parquet nor .jsonl files")
    return [(name, snapshot / name) for name in chosen]


def _raw_rows(path: Path, columns: dict[str, str], where: str) -> Iterator[dict[str, Any]]:
    """The rows of a parquet or JSONL file as dicts holding (at least) the keys of ``columns`` (column -> the config
    setting that names it); a missing column is an error naming that setting, the file and the columns it has."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise DataFileError(f"{columns[missing[0]]}: {where}: no column {missing[0]!r}; its columns: {names}")
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
            yield from batch.to_pylist()
        return
    for lineno, row in jsonl_objects(path, where):
        missing = [c for c in columns if c not in row]
        if missing:
            raise DataFileError(f"{columns[missing[0]]}: {where}:{lineno}: no column {missing[0]!r}; the row's "
                                f"columns: {sorted(row)}")
        yield row


def _text(value: Any, key: str, spec: str, where: str, number: int, *, numbers: bool) -> str:
    ok = isinstance(value, str) or (numbers and isinstance(value, int | float) and not isinstance(value, bool))
    if not ok:
        raise DataFileError(f"data.hub.{key}={spec!r}: {where} row {number}: a {type(value).__name__} "
                            f"({str(value)[:80]!r}), not {'text or a number' if numbers else 'text'}")
    text = str(value)
    if not text.strip():
        raise DataFileError(f"data.hub.{key}={spec!r}: {where} row {number}: empty")
    return text


def hub_rows(hub: HubDataConfig, files: list[tuple[str, Path]], limit: int, counts: dict[str, int]):
    """Rows {id, problem, answer, source} of ``files`` in order, at most ``limit`` (0 = all); ``counts`` gets the
    rows taken from each file. Errors name the config key, the file and the row."""
    paths = {key: column_path_parts(getattr(hub, key)) for key in ("problem", "answer")}
    columns: dict[str, str] = {}
    for key, parts in paths.items():
        columns.setdefault(parts[0], f"data.hub.{key}={getattr(hub, key)!r}")
    transform = PROBLEM_TRANSFORMS[hub.problem_transform]
    produced = 0
    for name, path in files:
        where = f"{name} of {hub.repo}@{hub.revision}"
        counts[name] = 0
        if limit and produced >= limit:
            continue
        for number, raw in enumerate(_raw_rows(path, columns, where)):
            values = {}
            for key, parts in paths.items():
                spec = getattr(hub, key)
                try:
                    values[key] = column_value(raw, parts)
                except _PathError as exc:
                    raise DataFileError(f"data.hub.{key}={spec!r}: {where} row {number}: {exc}") from None
            problem = _text(values["problem"], "problem", hub.problem, where, number, numbers=False)
            try:
                problem = transform(problem)
            except ValueError as exc:
                raise DataFileError(f"data.hub.problem_transform={hub.problem_transform}: {where} row {number}: "
                                    f"the problem {exc}") from None
            answer = _text(values["answer"], "answer", hub.answer, where, number, numbers=True).strip()
            yield {"id": f"{name}:{number}", "problem": problem, "answer": answer, "source": hub.repo}
            counts[name] += 1
            produced += 1
            if limit and produced >= limit:
                break


def prepare_hub_train(hub: HubDataConfig, max_rows: int, out: Path) -> tuple[Path, Path]:
    """Download (or find in the cache) the files of ``hub``, check any pinned sha256, write ``out/train.jsonl``
    and ``out/source.json``; return both paths (the caller lists them in SHA256SUMS)."""
    snapshot = download_snapshot(hub)
    files = source_files(snapshot, hub)
    digests = {name: sha256_file(path) for name, path in files}
    pinned = hub_pinned_digests(hub)
    unknown = sorted(set(pinned) - set(digests))
    if unknown:
        raise DataFileError(f"data.hub.sha256 names {unknown}, which data.hub.files does not select "
                            f"(selected: {sorted(digests)})")
    for name, expected in pinned.items():
        if digests[name] != expected:
            raise DataFileError(f"{name} of {hub.repo}@{hub.revision}: sha256 mismatch: expected {expected} "
                                f"(data.hub.sha256), actual {digests[name]} ({snapshot / name})")
    counts: dict[str, int] = {}
    train = write_jsonl_atomic(out / "train.jsonl", hub_rows(hub, files, max_rows, counts))
    rows = sum(counts.values())
    if not rows:
        raise DataFileError(f"data.hub: no rows in {[name for name, _ in files]} of {hub.repo}@{hub.revision}")
    # the commit read: the snapshot folder of the hub cache is named by it (a branch resolves to one)
    commit = snapshot.name if COMMIT_SHA.fullmatch(snapshot.name) else None
    record = {
        "kind": "hub", "repo": hub.repo, "revision": hub.revision, "commit": commit,
        "pinned": bool(COMMIT_SHA.fullmatch(hub.revision)),
        "mapping": {"problem": hub.problem, "answer": hub.answer, "problem_transform": hub.problem_transform,
                    "id": "<repo path>:<row number>", "max_train_rows": max_rows},
        "files": [{"path": name, "sha256": digests[name], "bytes": os.path.getsize(path), "rows_taken": counts[name]}
                  for name, path in files],
        "train": {"file": train.name, "rows": rows, "sha256": sha256_file(train)},
    }
    return train, write_json_atomic(out / SOURCE_FILE, record)


def source_checksums(data_dir: Path) -> dict[str, str]:
    """The sha256 of each hub file behind the data folder's train.jsonl, named ``<repo>@<commit>:<repo path>``
    (from its ``source.json``, after that file's checksum is verified); {} for other training data."""
    path = Path(data_dir) / SOURCE_FILE
    if not path.is_file():
        return {}
    verify_checksum(path)
    record = read_json(path)
    commit = record.get("commit") or record["revision"]
    return {f"{record['repo']}@{commit}:{f['path']}": f["sha256"] for f in record["files"]}
