"""The trainer callback of a run: closes each optimizer step's budget accounting and digests; at the end of each
generation batch, saves the model at budget fractions and stops the run once the budget is spent; appends each log
record to ``metrics.jsonl`` and to the run's trackers; reports budget progress."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from harness.data.files import append_text
from harness.train.budget import OFF_BUDGET, tensors_sha256
from harness.train.progress import ProgressLog

if TYPE_CHECKING:
    from harness.train.trl.trainer import TargetedGRPOTrainer


class BudgetCallback(TrainerCallback):
    """Closes each step's accounting and digests (``StepAccounting.digests``), saves the model at budget fractions,
    stops once the budget is spent, and appends every log record (one per optimizer step) to ``metrics.jsonl`` and
    to ``trackers`` (harness/train/trackers.py). ``progress`` (a ``ProgressLog``, main process only) gets the spend
    after every step."""

    def __init__(self, trainer: TargetedGRPOTrainer, checkpoint_dirs: dict[float, Path], metrics_path: Path,
                 trackers: list | None = None, progress: ProgressLog | None = None):
        self.trainer = trainer
        self.checkpoint_dirs = dict(sorted(checkpoint_dirs.items()))  # budget fraction -> directory
        self.metrics_path = metrics_path
        self.trackers = trackers or []
        self.progress = progress
        self._step_started = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = self.trainer.accounting.clock.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        trainer, accounting = self.trainer, self.trainer.accounting
        accounting.clock.stop("step", self._step_started)
        seconds = accounting.clock.collect()
        # diagnostics inside the step (the sample batch) are off the budget clock
        step_seconds = seconds.pop("step", 0.0) - seconds.pop(OFF_BUDGET, 0.0)
        accounting.close_step(seconds, step_seconds, trainer.processes.sum)
        accounting.digests.close_step(state.global_step, trainer.accelerator.unwrap_model(model))
        ledger = accounting.ledger
        budget = trainer.preset.train.budget
        if self.progress is not None:
            self.progress.update(state.global_step, ledger.spent(budget.kind))
        if state.global_step % trainer.actor.updates_per_generation:
            return  # budget checkpoints and the stop fall at the end of a generation batch (train.mini_batches)
        spent = ledger.spent(budget.kind)
        for fraction, directory in self.checkpoint_dirs.items():
            if directory.name not in accounting.saved_checkpoints and spent >= fraction * budget.amount * (1 - 1e-9):
                self._save_model(model, directory, state.global_step)
                accounting.saved_checkpoints[directory.name] = {"fraction": fraction, "step": state.global_step,
                                                             "spent": spent, **ledger.summary()}
        if spent >= budget.amount * (1 - 1e-9):
            control.should_training_stop = True

    def _save_model(self, model, directory: Path, step: int) -> None:
        """Every process takes part in gathering the full weights (ZeRO-3 and FSDP shard them); the main process
        digests and writes them; the others wait until the folder exists."""
        from harness.model.checkpoints import save_policy

        trainer = self.trainer
        accelerator = trainer.accelerator
        state_dict = accelerator.get_state_dict(trainer.deepspeed if trainer.is_deepspeed_enabled else model)
        if accelerator.is_main_process:
            digests = trainer.accounting.digests
            digests.checkpoints[directory.name] = {"step": step, "rollouts_sha256": digests.rollouts,
                                                   "weights_sha256": tensors_sha256(sorted(state_dict.items()))}
            staging = directory.with_name(directory.name + ".partial")
            save_policy(accelerator.unwrap_model(model), trainer.processing_class, staging, state_dict,
                        dtype=trainer.preset.model.dtype)
            staging.rename(directory)
        accelerator.wait_for_everyone()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        record = {"step": state.global_step, **self.trainer.accounting.ledger.summary()}
        record.update({k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in logs.items()})
        append_text(self.metrics_path, json.dumps(record) + "\n")  # never through a link
        for tracker in self.trackers:
            tracker.log(record)

