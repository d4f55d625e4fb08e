"""A sweep's data folder: the training split (and, with synthetic data, the benchmark splits) with its SHA256SUMS,
and the training rows in the order a seed gives them."""

from __future__ import annotations

import random

from harness.config.paths import SweepPaths, resolve_repo_path
from harness.config.schema import Resolved
from harness.data.decontamination import decontaminate
from harness.data.files import read_jsonl, verify_checksum, write_jsonl_atomic, write_sha256sums
from harness.data.synthetic import generate_split


def prepare_data(resolved: Resolved, paths: SweepPaths) -> dict:
    """Write the sweep's data folder with its SHA256SUMS: ``train.jsonl`` (synthetic problems, rows of a shipped
    JSONL after its checksum is verified, or both shuffled together for ``mixed``; for ``hub`` the rows of a hub
    dataset at its pinned commit, with ``source.json`` saying where they came from: harness/data/hub.py) and, with
    synthetic data, the ``eval.jsonl`` / ``ood.jsonl`` benchmark splits. Then the word 8-gram overlap of the
    training rows with every benchmark of the preset goes to ``decontamination.json`` (not in SHA256SUMS: nothing
    is trained from it), and training data over ``data.max_ngram_overlap`` is refused
    (harness/data/decontamination.py)."""
    data = resolved.preset.data
    out = paths.data_dir
    out.mkdir(parents=True, exist_ok=True)
    if data.kind == "hub":  # streamed from the source files to train.jsonl: never all rows in memory
        from harness.data.hub import prepare_hub_train

        train, source = prepare_hub_train(data.hub, data.max_train_rows, out)
        write_sha256sums(out, [train, source])
        return {"train": str(train), "source": str(source), "decontamination": str(decontaminate(resolved, paths))}
    (out / "source.json").unlink(missing_ok=True)  # a hub source of an earlier configuration is not this data's
    train_rows, written = [], {}
    if data.kind in ("synthetic", "mixed"):
        train_rows += generate_split(data.synthetic, "train")
        for split in ("eval", "ood"):
            written[split] = write_jsonl_atomic(out / f"{split}.jsonl", generate_split(data.synthetic, split))
    if data.kind in ("jsonl", "mixed"):
        source = resolve_repo_path(data.train_file)
        verify_checksum(source)
        rows = read_jsonl(source)
        train_rows += rows[:data.max_train_rows] if data.max_train_rows else rows
    if data.kind == "mixed":
        random.Random(data.synthetic.seed).shuffle(train_rows)
    written["train"] = write_jsonl_atomic(out / "train.jsonl", train_rows)
    write_sha256sums(out, written.values())
    return {**{split: str(path) for split, path in written.items()},
            "decontamination": str(decontaminate(resolved, paths))}


def read_train_split(paths: SweepPaths, required: tuple[str, ...] = ("id", "problem", "answer")) -> list[dict]:
    """The rows of the sweep's ``train.jsonl``, after its checksum is verified against the data folder's
    SHA256SUMS; every row must hold the ``required`` keys."""
    path = paths.data_dir / "train.jsonl"
    verify_checksum(path)
    return read_jsonl(path, required=required)


def training_rows(paths: SweepPaths, seed: int) -> list[dict]:
    """The training split shuffled by ``seed``: the data order is part of a run's seed."""
    rows = read_train_split(paths)
    random.Random(seed).shuffle(rows)
    return rows
