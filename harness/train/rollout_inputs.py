"""TRL's batch dict <-> the harness's ``RolloutBatch``: the inputs of the forward passes and the loss.

TRL hands each optimizer step a dict of tensors (prompt/completion ids and masks, advantages). The RolloutBatch
fields TRL does not carry (rewards, group ids, rollout advantages, a method's extras) and the log-probs computed
before the updates ride in the same dict under ``ROLLOUT_KEY_PREFIX``: TRL slices and shuffles every tensor of the
dict by rows, so they stay aligned with the rows.
"""

from __future__ import annotations

import torch

from harness.train.hooks import PreparedBatch
from methods.base import RolloutBatch

ROLLOUT_KEY_PREFIX = "tt_"  # "tt" = token targeting, a prefix no TRL key uses
OLD_LOGP = f"{ROLLOUT_KEY_PREFIX}old_logp"  # log pi_old (B, T), when a generation batch feeds several steps
REF_LOGP = f"{ROLLOUT_KEY_PREFIX}ref_logp"  # log pi_ref (B, T), when there is a reference model
GROUP_IDS = f"{ROLLOUT_KEY_PREFIX}group_ids"
EXTRA_PREFIX = f"{ROLLOUT_KEY_PREFIX}extra_"


def reduced_inputs(out: dict, prepared: PreparedBatch, device) -> dict:
    """The rows and columns of TRL's generated batch ``out`` that the method kept (``prepared``), with its
    advantages and the RolloutBatch fields: what every forward pass of the step reads."""
    rows, length = prepared.rows.to(device), prepared.length
    kept = prepared.batch
    reduced = {
        "prompt_ids": out["prompt_ids"][rows],
        "prompt_mask": out["prompt_mask"][rows],
        "completion_ids": out["completion_ids"][rows, :length],
        "completion_mask": kept.completion_mask.to(device=device, dtype=out["completion_mask"].dtype),
        "advantages": kept.advantages.to(device),
        "num_items_in_batch": kept.completion_mask.sum().to(device),
        f"{ROLLOUT_KEY_PREFIX}rewards": kept.rewards.to(device),
        GROUP_IDS: kept.group_ids.to(device),
        f"{ROLLOUT_KEY_PREFIX}rollout_advantages": kept.rollout_advantages.to(device),
    }
    for name, value in kept.extras.items():
        reduced[f"{EXTRA_PREFIX}{name}"] = value.to(device)
    return reduced


def rollout_batch_of(inputs: dict, special_token_ids: tuple[int, ...]) -> RolloutBatch:
    """The RolloutBatch of a step's inputs (``reduced_inputs``, or one mini-batch of them)."""
    extras = {k.removeprefix(EXTRA_PREFIX): v for k, v in inputs.items() if k.startswith(EXTRA_PREFIX)}
    mask = inputs["completion_mask"].float()
    return RolloutBatch(
        completion_ids=inputs["completion_ids"], completion_mask=mask,
        rewards=inputs[f"{ROLLOUT_KEY_PREFIX}rewards"], group_ids=inputs[GROUP_IDS],
        rollout_advantages=inputs[f"{ROLLOUT_KEY_PREFIX}rollout_advantages"], advantages=inputs["advantages"],
        keep=torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device),
        special_token_ids=special_token_ids, extras=extras)
