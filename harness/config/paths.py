"""Where things live: the checkout (REPO_ROOT) and each artefact of a sweep; the Snakefile and the CLI build paths
here."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: configs/, data/, scripts/ live here
CONFIG_DIR = REPO_ROOT / "configs"
WARMSTART_LABEL = "warmstart"  # the reference row: the starting checkpoint, evaluated like every run


def checkpoint_name(fraction: float) -> str:
    """Budget fraction -> directory name: 0.25 -> 'ckpt-025', 1.0 -> 'ckpt-100'."""
    return f"ckpt-{round(fraction * 100):03d}"


class SweepPaths:
    """The files of one sweep under ``results/<sweep>/``: runs/, eval/, logs/ (the Snakefile's layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def warmstart_dir(self) -> Path:
        return self.root / "warmstart" / "model"

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

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def train_log(self, label: str, seed: int | str) -> Path:
        return self.logs_dir / "train" / f"{label}_seed{seed}.log"

    def eval_log(self, label: str, seed: int | str, ckpt: str) -> Path:
        return self.logs_dir / "eval" / f"{label}_seed{seed}_{ckpt}.log"
