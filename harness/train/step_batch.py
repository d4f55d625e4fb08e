"""``StepBatch``: the rows of one generation batch that the method kept, as every forward pass and the loss read them.

TRL generates a batch dict (prompt/completion ids and masks); the method's hooks (``harness.train.hooks``) keep some
of its rows and columns and give the advantages. ``StepBatch.kept`` takes both into one batch on the training
device; ``Actor.before_updates`` adds log pi_old and log pi_ref; ``update_schedule`` cuts it into mini-batches
(``Sequences.rows``: every per-row field alike) and ``Actor.policy_loss`` reads one of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from harness.train.hooks import PreparedBatch
from harness.train.row_chunks import Sequences
from methods.base import RolloutBatch


@dataclass(frozen=True)
class StepBatch(Sequences):
    """``Sequences`` (TRL's dtypes; completions cut to the longest kept one) and, per row: ``advantages`` (B, T) the
    method's, ``rewards``, ``group_ids``, ``rollout_advantages`` (B,), the method's ``extras``; ``old_logp`` and
    ``ref_logp`` (B, T) once ``Actor.before_updates`` has computed them (None: not needed by this step)."""

    advantages: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    rollout_advantages: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None

    @classmethod
    def kept(cls, out: dict, prepared: PreparedBatch, device) -> StepBatch:
        """The rows and columns of TRL's generated batch ``out`` that the method kept (``prepared``), with its
        advantages and the RolloutBatch fields."""
        rows, length, batch = prepared.rows.to(device), prepared.length, prepared.batch
        return cls(
            prompt_ids=out["prompt_ids"][rows], prompt_mask=out["prompt_mask"][rows],
            completion_ids=out["completion_ids"][rows, :length],
            completion_mask=batch.completion_mask.to(device=device, dtype=out["completion_mask"].dtype),
            advantages=batch.advantages.to(device), rewards=batch.rewards.to(device),
            group_ids=batch.group_ids.to(device), rollout_advantages=batch.rollout_advantages.to(device),
            extras={name: value.to(device) for name, value in batch.extras.items()})

    def with_log_probs(self, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None) -> StepBatch:
        return dataclasses.replace(self, old_logp=old_logp, ref_logp=ref_logp)

    def rollout_batch(self, special_token_ids: tuple[int, ...]) -> RolloutBatch:
        """The method's view of these rows (every row kept)."""
        mask = self.completion_mask.float()
        return RolloutBatch(
            completion_ids=self.completion_ids, completion_mask=mask, rewards=self.rewards, group_ids=self.group_ids,
            rollout_advantages=self.rollout_advantages, advantages=self.advantages,
            keep=torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device),
            special_token_ids=special_token_ids, extras=dict(self.extras))
