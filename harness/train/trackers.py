"""Experiment trackers a run logs to besides metrics.jsonl (``train.report_to``): the same records under the same
names, one per optimizer step, and the run's configuration. No account and no network: TensorBoard event files
(``<run>/tensorboard``), Weights & Biases in offline mode (``<run>/wandb``; ``wandb sync`` uploads it later if one
wants), MLflow with a local file store (``<run>/mlruns``; ``mlflow ui --backend-store-uri <run>/mlruns``).
wandb and mlflow are optional (``pip install -e .[trackers]``); TensorBoard comes with the harness.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

TRACKER_FOLDERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a metrics.jsonl record but its step: what trackers plot."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardTracker:
    """Event files in ``folder``; a resumed run first drops the events after the step it resumed from."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), purge_step=resumed_step + 1 if resumed_step else None)
        if not resumed_step:
            self.writer.add_text("config", f"run {name}\n\n```yaml\n{config_yaml}```")

    def log(self, record: dict) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()  # a running sweep's plots stay current

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """An offline Weights & Biases run in ``folder``; a resumed run continues the same run id."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int):
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(dir=str(folder), name=name, id=name.replace("/", "-"), config=config, mode="offline",
                              resume="allow", project=os.environ.get("WANDB_PROJECT", "tokentarget-harness"))

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run in a local file store in ``folder``: the configuration as an artifact, the metrics by step."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(folder.resolve().as_uri())
        mlflow.start_run(run_name=name)
        mlflow.log_text(config_yaml, "config.yaml")

    def log(self, record: dict) -> None:
        self.mlflow.log_metrics(scalars(record), step=record["step"])

    def close(self) -> None:
        self.mlflow.end_run()


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def open_trackers(report_to: list[str], run_dir: Path, name: str, config: dict, config_yaml: str,
                  resumed_step: int = 0) -> list:
    """One tracker per name of ``report_to``, each writing under ``run_dir``; ``resumed_step``: the optimizer step a
    resumed run continues from (0: a fresh run). A missing optional package is a clear error."""
    trackers = []
    for key in report_to:
        if key not in TRACKERS:
            raise ValueError(f"key 'train.report_to': {key!r} is not one of {sorted(TRACKERS)}")
        try:
            trackers.append(TRACKERS[key](run_dir / TRACKER_FOLDERS[key], name, config, config_yaml, resumed_step))
        except ImportError as exc:
            raise ValueError(f"key 'train.report_to' names {key!r}, which needs the package {exc.name!r}: "
                             "`pip install -e .[trackers]`, or leave it out of train.report_to") from None
    return trackers
