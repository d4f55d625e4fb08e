"""The configuration a sweep's DAG was built from, frozen into a file its jobs run, and the parts of it that decide
whether a job reruns (the Snakefile's digests) or a run resumes (``harness.train.run.run_key``).

The Snakefile resolves the sweep once (sweep file, ``--config`` overrides, preset and method YAMLs) and writes the
result to ``results/<sweep>/sweeps/<digest>.json``, named by the digest of its own text (rewritten only to undo a
change by hand). Every job is handed that path: it reads no sweep, preset or method YAML, so a later parse (another
``--config``, an edited preset) cannot switch the jobs of a running sweep. ``load_snapshot`` refuses a file whose
text no longer has its name's digest (the next parse writes it again), and one written by the Snakefile of another
checkout than the code reading it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from harness.config.code_digests import method_source_digest
from harness.config.launch import training_processes
from harness.config.loading import merge_config
from harness.config.paths import REPO_ROOT, staging_file
from harness.config.schema import ConfigError, MethodSpec, PresetConfig, Resolved, SweepConfig

FORMAT = "harness-resolved-sweep/1"
DIGEST_CHARS = 16


def digest(obj: Any) -> str:
    """A short hash of a JSON-able configuration part."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:DIGEST_CHARS]


def is_snapshot(path: str | Path) -> bool:
    """A ``--sweep`` argument that names a resolved sweep (a ``.json`` file) rather than a sweep YAML."""
    return Path(path).suffix == ".json"


def method_dict(spec: MethodSpec) -> dict:
    """Everything of a method label but the label itself: what its runs are trained with."""
    return {"method": spec.name, "seed_offset": spec.seed_offset, "checkpoint": spec.checkpoint,
            "params": dataclasses.asdict(spec.params)}


def snapshot_text(resolved: Resolved, checkout: Path) -> str:
    """The resolved sweep as the text of its file: sweep, preset, the method labels' specs and the checkout whose
    Snakefile wrote it (its code and results folder are the jobs')."""
    content = {"format": FORMAT, "checkout": str(Path(checkout).resolve()), "source": resolved.source,
               **resolved.to_dict(), "method_specs": {label: method_dict(spec)
                                                      for label, spec in sorted(resolved.methods.items())}}
    return json.dumps(content, sort_keys=True, indent=1) + "\n"


def write_snapshot(resolved: Resolved, checkout: Path, folder: Path) -> Path:
    """``folder/<digest>.json``: written atomically (so that two parses at once write one whole file); since its
    name is the digest of its text it is rewritten only when that text was changed by hand (``load_snapshot``
    refuses such a file: the next parse restores it)."""
    text = snapshot_text(resolved, checkout)
    path = Path(folder) / f"{hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]}.json"
    if path.is_symlink() or not path.is_file() or path.read_text() != text:  # a link is replaced, never kept
        staging = staging_file(path)
        staging.write_text(text)
        os.replace(staging, path)
    return path


def load_snapshot(path: Path) -> Resolved:
    """The ``Resolved`` (with its method specs) of a file ``write_snapshot`` wrote, validated again by the schema;
    refused when its text does not match its name or when this code is not the checkout that wrote it."""
    text = Path(path).read_text()
    actual = hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]
    if actual != Path(path).stem:
        raise ConfigError(f"{path}: its text has digest {actual}, not the {Path(path).stem} of its name: it was "
                          "changed after the Snakefile wrote it. A job runs only the configuration its DAG was "
                          "built from: run snakemake again, which resolves the sweep anew and writes the file again")
    content = json.loads(text)
    if content.get("format") != FORMAT:
        raise ConfigError(f"{path}: key 'format' is {content.get('format')!r}, not {FORMAT!r}: not a resolved sweep "
                          "written by the Snakefile")
    check_checkout(Path(content["checkout"]), path)
    origin = str(path)
    sweep = merge_config(SweepConfig, [(origin, content["sweep"])])
    preset = merge_config(PresetConfig, [(origin, content["preset"])])
    methods = {label: method_spec(label, spec, origin) for label, spec in content["method_specs"].items()}
    return Resolved(sweep, preset, content["source"], methods)


def method_spec(label: str, spec: dict, origin: str) -> MethodSpec:
    from methods.registry import get_method_class

    params = merge_config(get_method_class(spec["method"]).Config,
                          [(f"{origin} (method_specs.{label})", spec["params"])])
    return MethodSpec(label, spec["method"], params, spec["seed_offset"], spec["checkpoint"])


def check_checkout(checkout: Path, snapshot: Path) -> None:
    """A job runs the code of the checkout whose Snakefile launched it, and writes into that checkout's results:
    refuse to run another checkout's code (the Snakefile of one checkout run with the environment of another)."""
    if checkout.resolve() != REPO_ROOT.resolve():
        raise ConfigError(
            f"{snapshot} was written by the Snakefile of checkout {checkout}, but this harness is the code of "
            f"checkout {REPO_ROOT} (Python {sys.executable}): the job would run other code and write into "
            f"{REPO_ROOT}. Run that Snakefile with its own checkout's environment ({checkout}/.venv/bin/snakemake "
            f"after `make setup` there, or `pip install -e {checkout}` into the environment you use)")


# data settings that decide only whether the data job refuses its data (harness/data/decontamination.py), not what
# any job writes or trains: left out of every digest, so a sweep finished before they existed is not rerun
DATA_CHECK_KEYS = ("max_ngram_overlap", "overlap_reason")


def _preset_dict(resolved: Resolved) -> dict:
    """The resolved preset as a mapping, without ``DATA_CHECK_KEYS``."""
    preset = resolved.to_dict()["preset"]
    for key in DATA_CHECK_KEYS:
        preset["data"].pop(key)
    return preset


def data_config(resolved: Resolved) -> dict:
    """What changes the data job's files: the data settings but ``DATA_CHECK_KEYS`` (a refused data job leaves no
    train.jsonl, so it runs again after a change of them; a finished one is not rerun by one)."""
    return _preset_dict(resolved)["data"]


def training_config(resolved: Resolved) -> dict:
    """What changes the training of every run of a sweep: the preset without its eval settings (but the reward's
    scoring timeout), its cluster resources (but the number of training processes the batch is split over),
    ``train.fast_decode`` (the same tokens with less Python: harness/model/decode.py) and the data job's check
    (``DATA_CHECK_KEYS``)."""
    preset = _preset_dict(resolved)
    scoring_timeout_s = preset.pop("eval")["scoring_timeout_s"]
    preset.pop("resources")
    preset["train"].pop("fast_decode")
    preset["train"].pop("report_to")  # where metrics are also logged: not what is trained
    preset["train"].pop("wandb_mode")
    return {**preset, "reward_scoring_timeout_s": scoring_timeout_s,
            "training_processes": training_processes(resolved.preset)}


def evaluation_config(resolved: Resolved) -> dict:
    """What changes an evaluation's results: the eval settings without ``job_scope`` (which only groups jobs) and
    ``fast_decode`` (the same tokens), the prompt template the problems are rendered with, and the CPU kernels the
    generation runs on (``cpu_kernels``)."""
    preset = resolved.to_dict()["preset"]
    return {**{k: v for k, v in preset["eval"].items() if k not in ("job_scope", "fast_decode")},
            "prompt_template": preset["prompt_template"], "cpu_kernels": preset["cpu_kernels"]}


def warmstart_config(resolved: Resolved) -> dict:
    """What changes the warm start: the model, the warm-start and data settings (but ``DATA_CHECK_KEYS``), the
    prompt template its SFT examples are rendered with, and the CPU kernels."""
    preset = _preset_dict(resolved)
    return {key: preset[key] for key in ("model", "warmstart", "data", "prompt_template", "cpu_kernels")}


def train_job_config(resolved: Resolved, spec: MethodSpec) -> dict:
    """What a train job's result depends on besides its seed and its inputs' contents: the sweep's training
    configuration, everything of the method label but its name (the registered method, its seed offset and
    parameters: ``uniform`` and ``uniform-aa`` differ) and the source of its method module: editing a method reruns
    its labels' train jobs (shared code does not: ``harness.config.code_digests``)."""
    return {"training": training_config(resolved), "method": method_dict(spec),
            "method_source": method_source_digest(spec.name)}
