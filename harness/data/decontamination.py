"""Decontamination: how many training rows share a word 8-gram with a benchmark problem, per benchmark of the preset.

The data job (``prepare_data``) measures the sweep's ``train.jsonl`` (synthetic, shipped or hub rows alike, after
``data.max_train_rows``) against the rows each benchmark of the preset uses (the first
``eval.benchmarks.<name>.limit``), writes ``decontamination.json`` beside it, and refuses the data when, for some
benchmark, the share of training rows it flags exceeds ``data.max_ngram_overlap`` (a preset that raises the limit
says why in ``data.overlap_reason``: a configuration rule). The data row of the report's fidelity table and its
"Training data overlap" section show the file.

The method is open-r1's (``huggingface/open-r1/scripts/decontaminate.py`` at 0c68e8c): a text is lowercased, its
whitespace collapsed, and split into words on whitespace (punctuation stays part of its word: ``fraction.`` and
``fraction`` differ); a training row is flagged for a benchmark when one of its word 8-grams is a word 8-gram of
one of the benchmark's problems. Only the ``problem`` fields are compared (open-r1's ``--problem_column``), not
solutions or answers.

Where this goes further than open-r1 (which gives a text of fewer than 8 words no 8-gram, so a short benchmark
problem can never be found): a benchmark problem of fewer than 8 words is found when a training problem holds all
its words, in order and contiguous (its whole normalised text as one shorter n-gram). The arithmetic problems of
the ``tiny`` preset (``8+7-3+0``: one word) and 32 of MATH-500's 500 problems are that short. The report counts
those problems (``short_problems``) and the rows they flag (``rows_flagged_short``) apart.

A shared 8-gram is often a stock phrase ("where $m$ and $n$ are relatively prime positive", "express your answer as
a decimal to the nearest"), not a shared problem, so the report also says which 8-grams were shared most
(``shared_ngrams``) and how many benchmark problems have a near-duplicate: one training row holding at least half
of the problem's 8-grams (``near_duplicates``; a short problem found whole counts as one), with examples. The
threshold reads only ``fraction``, open-r1's measure.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.paths import SweepPaths
from harness.config.schema import Resolved
from harness.data.files import (
    DataFileError,
    jsonl_objects,
    read_json,
    read_jsonl,
    sha256_file,
    write_json_atomic,
)

NGRAM = 8  # open-r1's --ngram_size default
NEAR_DUPLICATE_SHARE = 0.5  # a training row holding at least this share of a problem's 8-grams is a near-duplicate
EXAMPLES = 5  # training row ids, shared 8-grams and near-duplicate pairs kept per benchmark
CACHE_TEXTS = 1 << 16  # distinct training problems whose matches are remembered (DAPO-Math-17k: each text 100 times)
REPORT_FILE = "decontamination.json"  # in the sweep's data folder, beside train.jsonl
LIMIT_KEY, REASON_KEY = "data.max_ngram_overlap", "data.overlap_reason"
METHOD = (f"word {NGRAM}-grams of the problem text, lowercased and split on whitespace (open-r1's "
          f"huggingface/open-r1/scripts/decontaminate.py); a benchmark problem of fewer than {NGRAM} words is found "
          "when a training problem holds all its words in order")


class DecontaminationError(DataFileError):
    """The training data overlaps a benchmark beyond ``data.max_ngram_overlap``; names the key, file and benchmark."""


def normalize(text: str) -> str:
    """open-r1's ``normalize_string``: lowercase, whitespace collapsed to single spaces, ends stripped."""
    return " ".join(text.lower().split())


def word_ngrams(text: str, n: int = NGRAM) -> set[str]:
    """The word ``n``-grams of the normalised text, each as its words joined by one space; none when the text has
    fewer than ``n`` words (as open-r1)."""
    words = normalize(text).split()
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


@dataclass
class BenchmarkIndex:
    """A benchmark's problems as lookups: 8-gram -> problems holding it, and, for problems shorter than 8 words,
    word count -> normalised text -> problems."""

    ids: list[str]
    ngrams: dict[str, list[int]] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # each problem's number of distinct 8-grams (0: short)
    short: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def short_problems(self) -> int:
        return sum(len(ids) for texts in self.short.values() for ids in texts.values())


def index_benchmark(rows: list[dict]) -> BenchmarkIndex:
    """The lookups of a benchmark's rows (``id`` and ``problem`` of each)."""
    index = BenchmarkIndex([str(row["id"]) for row in rows])
    for number, row in enumerate(rows):
        grams = word_ngrams(str(row["problem"]))
        index.sizes.append(len(grams))
        for gram in grams:
            index.ngrams.setdefault(gram, []).append(number)
        if not grams:
            text = normalize(str(row["problem"]))
            index.short.setdefault(len(text.split()), {}).setdefault(text, []).append(number)
    return index


@dataclass(frozen=True)
class Match:
    """What one training problem shares with one benchmark: per benchmark problem the share of its 8-grams the row
    holds (1.0 for a short problem held whole), the shared 8-grams, and whether a short problem was found."""

    shares: dict[int, float]
    shared: tuple[str, ...]
    short: bool


def match(index: BenchmarkIndex, problem: str) -> Match | None:
    """The training ``problem`` against one benchmark; None when it shares nothing."""
    words = normalize(problem).split()
    grams = {" ".join(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1)}
    shared = sorted(gram for gram in grams if gram in index.ngrams)
    counts = Counter(number for gram in shared for number in index.ngrams[gram])
    shares = {number: count / index.sizes[number] for number, count in counts.items()}
    short = False
    for length, texts in index.short.items():
        held = {" ".join(words[i:i + length]) for i in range(len(words) - length + 1)}
        for text in held & texts.keys():
            short = True
            shared.append(text)
            shares.update(dict.fromkeys(texts[text], 1.0))
    return Match(shares, tuple(shared), short) if shares else None


@dataclass
class _Tally:
    """One benchmark's counts over the training rows."""

    rows: int = 0
    rows_short: int = 0
    examples: list[str] = field(default_factory=list)
    shared: Counter = field(default_factory=Counter)
    best: dict[int, tuple[float, str]] = field(default_factory=dict)  # problem -> (largest share, training row id)

    def add(self, found: Match, row_id: str) -> None:
        self.rows += 1
        self.rows_short += found.short
        if len(self.examples) < EXAMPLES:
            self.examples.append(row_id)
        self.shared.update(found.shared)
        for number, share in found.shares.items():
            if share > self.best.get(number, (0.0, ""))[0]:
                self.best[number] = (share, row_id)


def overlap_report(train_rows: Iterable[dict], benchmarks: dict[str, dict[str, Any]]) -> dict:
    """The overlap of ``train_rows`` ({id, problem}) with each benchmark: ``benchmarks`` maps a name to
    {"rows": its rows (id, problem), and any fields to keep, such as its file}. Per benchmark: its problems and how
    many are shorter than 8 words, the training rows flagged (and by short problems alone), their fraction of all
    training rows, example row ids, the most shared 8-grams (rows holding each), the benchmark problems hit and
    those with a near-duplicate row (module docstring)."""
    indexes = {name: index_benchmark(spec["rows"]) for name, spec in benchmarks.items()}
    tallies = {name: _Tally() for name in benchmarks}

    @functools.lru_cache(maxsize=CACHE_TEXTS)
    def matches(problem: str) -> tuple[tuple[str, Match], ...]:
        found = ((name, match(index, problem)) for name, index in indexes.items())
        return tuple((name, m) for name, m in found if m is not None)

    total = 0
    for row in train_rows:
        total += 1
        for name, found in matches(str(row["problem"])):
            tallies[name].add(found, str(row["id"]))
    report = {}
    for name, spec in benchmarks.items():
        index, tally = indexes[name], tallies[name]
        near = sorted(((share, index.ids[number], row_id) for number, (share, row_id) in tally.best.items()
                       if share >= NEAR_DUPLICATE_SHARE), key=lambda item: (-item[0], item[1]))
        report[name] = {
            **{key: value for key, value in spec.items() if key != "rows"},
            "problems": len(index.ids), "short_problems": index.short_problems,
            "rows_flagged": tally.rows, "rows_flagged_short": tally.rows_short,
            "fraction": tally.rows / total if total else 0.0,
            "example_rows": tally.examples,
            "shared_ngrams": [[gram, rows] for gram, rows in
                              sorted(tally.shared.items(), key=lambda item: (-item[1], item[0]))[:EXAMPLES]],
            "problems_hit": len(tally.best), "near_duplicates": len(near),
            "near_duplicate_examples": [{"problem": problem, "row": row_id, "share": round(share, 4)}
                                        for share, problem, row_id in near[:EXAMPLES]],
        }
    return {"method": METHOD, "ngram": NGRAM, "near_duplicate_share": NEAR_DUPLICATE_SHARE, "train_rows": total,
            "benchmarks": report}


def over_limit(report: dict, limit: float) -> dict[str, dict]:
    """The benchmarks of a report whose fraction of flagged training rows exceeds ``limit``."""
    return {name: bench for name, bench in report["benchmarks"].items() if bench["fraction"] > limit}


def check_overlap(report: dict, limit: float, train: str, where: Path | str) -> None:
    """Refuse (``DecontaminationError``) a training set that overlaps a benchmark beyond ``limit``; the message names
    the key, the training data ``train``, each benchmark over it with its file, and the report at ``where``."""
    over = over_limit(report, limit)
    if not over:
        return
    total = report["train_rows"]
    lines = [f"{bench['rows_flagged']} of the {total} rows ({bench['fraction']:.2%}) share a word {NGRAM}-gram with "
             f"benchmark '{name}' ({bench.get('file', name)}; {bench['problems_hit']} of its {bench['problems']} "
             f"problems hit), e.g. rows {bench['example_rows'][:3]}" for name, bench in over.items()]
    needed = math.ceil(max(bench["fraction"] for bench in over.values()) * 1e4 - 1e-9) / 1e4  # shown to 4 places
    raise DecontaminationError(
        f"key '{LIMIT_KEY}' = {limit:g}: the training data {train} overlaps the benchmarks beyond it: "
        + "; ".join(lines) + f" (report: {where}). Remove those rows, or set {LIMIT_KEY} to at least {needed:g} "
        f"with {REASON_KEY} saying why the preset trains on them")


def train_source(resolved: Resolved) -> str:
    """The training data in words, for the report and error messages: the file, the hub set or the generator."""
    data = resolved.preset.data
    if data.kind == "hub":
        return f"{data.hub.repo}@{data.hub.revision or 'main'} ({', '.join(data.hub.files)})"
    parts = (["synthetic (data.synthetic)"] if data.kind in ("synthetic", "mixed") else []) + (
        [f"{data.train_file} (key 'data.train_file')"] if data.kind in ("jsonl", "mixed") else [])
    return " + ".join(parts)


def report_file(paths: SweepPaths) -> Path:
    return paths.data_dir / REPORT_FILE


def decontaminate(resolved: Resolved, paths: SweepPaths) -> Path:
    """Measure the data folder's ``train.jsonl`` against every benchmark of the preset, write
    ``decontamination.json`` (also when the data is refused, so that it can be read) and refuse the data over
    ``data.max_ngram_overlap``; the report's path. A benchmark whose file is not there (a ``{data_dir}`` split that
    only synthetic data generates) is listed under ``unmeasured``."""
    data, benchmarks, unmeasured = resolved.preset.data, {}, {}
    for name, bench in sorted(resolved.preset.eval.benchmarks.items()):
        path = paths.benchmark_data_file(bench.file)
        if not path.is_file():  # a {data_dir} split this data job does not generate (resolve checks the others)
            unmeasured[name] = {"file": bench.file, "reason": "no such file when the data job ran"}
            continue
        rows = read_jsonl(path)
        benchmarks[name] = {"file": bench.file, "sha256": sha256_file(path),
                            "rows": rows[:bench.limit] if bench.limit else rows}
    train = paths.data_dir / "train.jsonl"
    report = overlap_report((row for _, row in jsonl_objects(train)), benchmarks)
    source = train_source(resolved)
    record = {"train": {"file": train.name, "source": source, "sha256": sha256_file(train)},
              "limit": {LIMIT_KEY: data.max_ngram_overlap, REASON_KEY: data.overlap_reason}, **report,
              "unmeasured": unmeasured}
    written = write_json_atomic(report_file(paths), record)
    try:
        check_overlap(report, data.max_ngram_overlap, source, written)
    except DecontaminationError:
        train.unlink()  # refused: no later job may train on it, even after a data job run by hand
        raise
    return written


def read_report(data_dir: Path) -> dict | None:
    """The ``decontamination.json`` of a data folder; None when there is none (a sweep whose data job predates it:
    its overlap was not measured)."""
    path = Path(data_dir) / REPORT_FILE
    return read_json(path) if path.is_file() else None


def summary(report: dict | None) -> str:
    """One line for a table cell: the share of training rows flagged per benchmark, or "not measured"."""
    if report is None:
        return f"not measured (no data/{REPORT_FILE}: the sweep's data job predates the decontamination report)"
    total = report["train_rows"]
    cells = [f"{name} {bench['rows_flagged']}/{total} rows ({bench['fraction']:.2%})"
             for name, bench in report["benchmarks"].items()]
    cells += [f"{name} not measured ({bench['reason']})" for name, bench in report.get("unmeasured", {}).items()]
    return f"{NGRAM}-gram overlap of the training rows: " + ", ".join(cells)
