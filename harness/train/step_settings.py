"""``StepSettings``: the training config's values that one step's methods and loss read, taken from ``train.*`` once.

The trainer's step context and loss config, the first batch's ``sample_batch.json`` and ``harness inspect``'s step
keys all come from here, so there is one set of defaults (the schema's, harness/config/schema.py ``TrainConfig``)
and one list of the keys a batch file may set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.config.schema import TrainConfig
from harness.train.loss import LossConfig
from methods.base import StepContext


@dataclass(frozen=True)
class StepSettings:
    """clip_eps_low/high, beta, aggregation, max_completion_length: what a method sees in its ``StepContext``;
    clip_ratio_c, kl_estimator: the loss's alone (``LossConfig``); scale_rewards: the rollout advantages'."""

    clip_eps_low: float
    clip_eps_high: float
    beta: float
    aggregation: str
    max_completion_length: int
    clip_ratio_c: float | None
    kl_estimator: str
    scale_rewards: str

    @classmethod
    def of(cls, train: TrainConfig) -> StepSettings:
        return cls(**{name: getattr(train, name) for name in STEP_KEYS})

    def replace(self, **changes) -> StepSettings:
        """These settings with ``changes`` (a batch file's keys, named in ``STEP_KEYS``)."""
        unknown = sorted(set(changes) - set(STEP_KEYS))
        if unknown:
            raise ValueError(f"unknown step setting(s) {unknown}; allowed: {list(STEP_KEYS)}")
        return dataclasses.replace(self, **changes)

    def context(self, progress: float = 0.0, step: int = 0, seed: int = 0, process_index: int = 0) -> StepContext:
        """What a method may know of the step: these settings and where the run stands."""
        return StepContext(progress=progress, step=step, seed=seed, clip_eps_low=self.clip_eps_low,
                           clip_eps_high=self.clip_eps_high, beta=self.beta, aggregation=self.aggregation,
                           max_completion_length=self.max_completion_length, process_index=process_index)

    def loss_config(self) -> LossConfig:
        return LossConfig(clip_eps_low=self.clip_eps_low, clip_eps_high=self.clip_eps_high,
                          clip_ratio_c=self.clip_ratio_c, beta=self.beta, kl_estimator=self.kl_estimator)

    def method_record(self) -> dict:
        """What a method's selection reads, as a batch file's keys (``sample_batch.json``; ``harness inspect`` reads
        them back). beta and the loss's own keys are left out: the sample batch holds no ref_logp, and the report
        shows the selection, not the loss."""
        return {"aggregation": self.aggregation, "scale_rewards": self.scale_rewards, "clip_eps_low": self.clip_eps_low,
                "clip_eps_high": self.clip_eps_high, "max_completion_length": self.max_completion_length}


STEP_KEYS = tuple(f.name for f in dataclasses.fields(StepSettings))
