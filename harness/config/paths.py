"""Where things live: the checkout (REPO_ROOT) and each artefact of a sweep; the Snakefile and the CLI build paths
here.

``SweepPaths`` methods take labels, seeds and checkpoint names as values or as Snakemake wildcard patterns:
``paths.run_file("{method}", "{seed}")`` is the train rule's output pattern."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: configs/, data/, scripts/ live here
CONFIG_DIR = REPO_ROOT / "configs"
WARMSTART_LABEL = "warmstart"  # the reference row: the starting checkpoint, evaluated like every run
# what a method label may be: a file name, a path component and a Snakemake wildcard value (the Snakefile's
# wildcard_constraints use it) without quoting
LABEL_PATTERN = r"[A-Za-z0-9_\-]+"


def checkpoint_name(fraction: float) -> str:
    """Budget fraction -> directory name: 0.25 -> 'ckpt-025', 1.0 -> 'ckpt-100'."""
    return f"ckpt-{round(fraction * 100):03d}"


REPORT_FILES = ("leaderboard.md", "leaderboard.csv", "leaderboard_runs.csv", "report.html")  # harness report


class SweepPaths:
    """The files of one sweep under ``results/<sweep>/`` (the Snakefile's layout): data/, warmstart/model/,
    runs/<label>/seed<N>/[ckpt-XXX/], eval/<label>/seed<N>/<ckpt>/<bench>/, logs/ and benchmarks/ (one file per
    job, the same name in both), the report files."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def sweep_file(self) -> Path:
        """The sweep mapping of the last Snakemake parse, for people, ``harness report`` by hand and ``harness power
        --pilot``; no job reads it (each reads its snapshot)."""
        return self.root / "sweep.yaml"

    @property
    def snapshots_dir(self) -> Path:
        """The resolved sweeps the Snakefile wrote, ``<digest>.json``, one per configuration a DAG was built from:
        each job reads the one its command names (harness/config/snapshot.py)."""
        return self.root / "sweeps"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def benchmark_data_file(self, file: str) -> Path:
        """A benchmark's JSONL (``eval.benchmarks.<name>.file``): ``{data_dir}`` is this sweep's data folder, a
        relative path is relative to the checkout."""
        return resolve_repo_path(file.replace("{data_dir}", str(self.data_dir)))

    @property
    def warmstart_dir(self) -> Path:
        return self.root / "warmstart" / "model"

    @property
    def warmstart_file(self) -> Path:
        """Written last by the warm start: its presence marks a complete warm-start model."""
        return self.warmstart_dir / "warmstart.json"

    def run_dir(self, label: str, seed: int | str) -> Path:
        return self.root / "runs" / label / f"seed{seed}"

    def checkpoint_dir(self, label: str, seed: int | str, ckpt: str) -> Path:
        if label == WARMSTART_LABEL:
            return self.warmstart_dir
        return self.run_dir(label, seed) / ckpt

    def eval_dir(self, label: str, seed: int | str, ckpt: str, bench: str) -> Path:
        return self.root / "eval" / label / f"seed{seed}" / ckpt / bench

    def run_file(self, label: str, seed: int | str) -> Path:
        """``run.json``: written last by training (or fetch), so its presence means the run finished."""
        return self.run_dir(label, seed) / "run.json"

    def metrics_file(self, label: str, seed: int | str) -> Path:
        return self.run_dir(label, seed) / "metrics.jsonl"

    def sample_batch_file(self, label: str, seed: int | str) -> Path:
        """The first generation batch in the ``harness inspect`` format, saved by the trainer."""
        return self.run_dir(label, seed) / "sample_batch.json"

    def results_file(self, label: str, seed: int | str, ckpt: str, bench: str) -> Path:
        """``results.json``: written last by evaluation, so its presence means the evaluation finished."""
        return self.eval_dir(label, seed, ckpt, bench) / "results.json"

    def samples_file(self, label: str, seed: int | str, ckpt: str, bench: str) -> Path:
        return self.eval_dir(label, seed, ckpt, bench) / "samples.jsonl"

    def report_files(self) -> list[Path]:
        return [self.root / name for name in REPORT_FILES]

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log_file(self, rule: str, label: str | None = None, seed: int | str | None = None,
                 ckpt: str | None = None) -> Path:
        """A job's log: logs/<rule>.log for the sweep-wide rules, logs/<rule>/<label>_seed<N>[_<ckpt>].log."""
        return self._job_file(self.logs_dir, ".log", rule, label, seed, ckpt)

    def benchmark_file(self, rule: str, label: str | None = None, seed: int | str | None = None,
                       ckpt: str | None = None) -> Path:
        """A job's Snakemake benchmark (time and memory), named like its log, under benchmarks/."""
        return self._job_file(self.root / "benchmarks", ".tsv", rule, label, seed, ckpt)

    def train_log(self, label: str, seed: int | str) -> Path:
        return self.log_file("train", label, seed)

    def eval_log(self, label: str, seed: int | str, ckpt: str) -> Path:
        return self.log_file("eval", label, seed, ckpt)

    @staticmethod
    def _job_file(folder: Path, suffix: str, rule: str, label: str | None, seed: int | str | None,
                  ckpt: str | None) -> Path:
        if label is None:
            return folder / f"{rule}{suffix}"
        name = f"{label}_seed{seed}" + (f"_{ckpt}" if ckpt is not None else "")
        return folder / rule / f"{name}{suffix}"



def resolve_repo_path(path: str | Path) -> Path:
    """A path from a config file: absolute as given, relative to the checkout (REPO_ROOT) otherwise."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate


def staging_file(path: str | Path) -> Path:
    """A new empty file (mode 0644) of unpredictable name beside ``path``, created exclusively (a file or link
    planted under a guessable name is never written through), to hold ``path``'s next content until it is renamed
    over ``path`` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o644)
    return Path(name)
