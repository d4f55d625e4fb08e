"""The one code path from a rollout batch to per-token weights, shared by the trainer and ``harness inspect``.

``prepare_batch`` runs before any forward pass (advantages, ``on_rollouts``, dropping rollouts,
``before_forward`` truncation); ``weigh_tokens`` runs on the token statistics of the prepared batch.
``run_hooks`` chains both for a batch whose statistics are already known (inspect) and scatters the result back
to the full (B, T) shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.train.loss import LossConfig, LossInputs, loss_of_rows
from methods.base import (
    Method,
    RolloutBatch,
    StepContext,
    TokenStats,
    TokenWeights,
    aggregation_row_denominators,
    aggregation_weights,
    group_advantages,
)


@dataclass
class PreparedBatch:
    """batch: the rows and columns that enter the forward pass; rows: their indices in the generation batch;
    length: the number of completion positions kept."""

    batch: RolloutBatch
    rows: torch.Tensor
    length: int


def statistics_read(method: Method, beta: float) -> frozenset[str]:
    """The token statistics beyond logp that a step of ``method`` reads at ``train.beta`` = ``beta``: the method's own
    (``needs_at``: ``needs`` and what a setting adds, GMTS's ref_logp at beta > 0) and ref_logp for the KL term when
    beta > 0. The one rule for what a step computes: the actor computes these (and entropy, which it logs), the
    trainer holds a reference model when ref_logp is among them, ``harness inspect`` requires them in a batch file and
    ``harness plan`` sizes the reference model by them."""
    reference = frozenset({"ref_logp"}) if beta > 0 else frozenset()
    return frozenset(method.needs_at(StepContext(beta=beta))) | reference


def new_rollout_batch(completion_ids: torch.Tensor, completion_mask: torch.Tensor, rewards: torch.Tensor,
                      group_ids: torch.Tensor, scale_rewards: str, special_token_ids: tuple[int, ...] = (),
                      rollout_advantages: torch.Tensor | None = None) -> RolloutBatch:
    """A batch with the baseline's advantages: the group-normalised rollout advantage on every real token.

    ``rollout_advantages`` may be given when the groups extend beyond these rows (several processes)."""
    if rollout_advantages is None:
        rollout_advantages = group_advantages(rewards, group_ids, scale=scale_rewards)
    mask = completion_mask.to(torch.float32)
    return RolloutBatch(
        completion_ids=completion_ids.long(),
        completion_mask=mask,
        rewards=rewards.to(torch.float32),
        group_ids=group_ids.long(),
        rollout_advantages=rollout_advantages,
        advantages=rollout_advantages[:, None] * mask,
        keep=torch.ones(len(rewards), dtype=torch.bool),
        special_token_ids=tuple(special_token_ids),
    )


def prepare_batch(method: Method, batch: RolloutBatch, ctx: StepContext) -> PreparedBatch:
    batch = method.on_rollouts(batch, ctx)
    rows = torch.nonzero(batch.keep, as_tuple=False).flatten()
    batch = batch.select_rows(rows)
    batch = method.before_forward(batch, ctx)
    real = batch.completion_mask.sum(dim=0) > 0
    length = int(torch.nonzero(real).max()) + 1 if bool(real.any()) else 0
    return PreparedBatch(batch.truncate(length), rows, length)


def weigh_tokens(method: Method, stats: TokenStats, prepared: PreparedBatch, ctx: StepContext) -> TokenWeights:
    result = method.token_weights(stats, prepared.batch, ctx)
    expected = tuple(prepared.batch.completion_mask.shape)
    if tuple(result.weights.shape) != expected:
        raise ValueError(f"method {method.name!r} returned weights of shape {tuple(result.weights.shape)}, "
                         f"expected {expected}")
    if (result.kl_weights is None) != (result.kl_denominator is None):
        raise ValueError(f"method {method.name!r} returned only one of kl_weights and kl_denominator")
    if result.kl_weights is not None and tuple(result.kl_weights.shape) != expected:
        raise ValueError(f"method {method.name!r} returned kl_weights of shape {tuple(result.kl_weights.shape)}, "
                         f"expected {expected}")
    for name, parts, denominator in (("row_denominators", result.row_denominators, result.denominator),
                                     ("kl_row_denominators", result.kl_row_denominators, result.kl_denominator)):
        if parts is None:
            continue
        if tuple(parts.shape) != expected[:1] or denominator is None:
            raise ValueError(f"method {method.name!r} returned {name} of shape {tuple(parts.shape)} (expected "
                             f"{expected[:1]}){'' if denominator is not None else ' without its denominator'}")
        total, whole = float(parts.sum()), float(denominator)
        if min(abs(total - whole), abs(max(total, 1.0) - whole)) > 1e-5 * max(abs(whole), 1.0):
            raise ValueError(f"method {method.name!r}: {name} add up to {total}, its denominator is {whole} "
                             "(the denominator must be the sum of the row parts, or 1 when that is below 1)")
    return result


def kl_weights_of(result: TokenWeights, batch: RolloutBatch, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """(kl_weights (B, T), kl_denominator) of the KL term: the method's if it set them, else the baseline
    aggregation over every completion token of ``batch``."""
    if result.kl_weights is not None:
        return result.kl_weights, result.kl_denominator
    return aggregation_weights(batch.completion_mask, ctx.aggregation, ctx.max_completion_length)


def denominator_parts(result: TokenWeights, batch: RolloutBatch,
                      ctx: StepContext) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-rollout parts (B,) of the loss's and the KL term's denominators (``TokenWeights.row_denominators``): the
    method's, and for the KL term without the method's weights, the baseline aggregation's (``kl_weights_of``).
    None where the method gave none."""
    if result.kl_weights is not None:
        return result.row_denominators, result.kl_row_denominators
    return result.row_denominators, aggregation_row_denominators(batch.completion_mask, ctx.aggregation,
                                                                  ctx.max_completion_length)


def with_global_denominators(inputs: LossInputs, denominator: torch.Tensor, kl_denominator: torch.Tensor,
                             processes: int) -> LossInputs:
    """One process's loss inputs when the loss is one mean over every process's rollouts of the optimizer step.

    ``denominator``, ``kl_denominator``: the sums over the processes of their parts, D = sum_p D_p. The process's
    loss becomes sum(w l) / (D / P): DDP/ZeRO/FSDP average the gradients over the P processes, which gives
    sum_p sum(w l)_p / D, the gradient of the global mean. D is clamped to at least 1 as each method's own is."""
    return dataclasses.replace(inputs, denominator=denominator.clamp(min=1.0) / processes,
                               kl_denominator=kl_denominator.clamp(min=1.0) / processes)


def with_row_scales(inputs: LossInputs, scales: torch.Tensor, kl_scales: torch.Tensor) -> LossInputs:
    """The loss inputs with each row's weights multiplied by its scale (B,) and no denominator: the weighting of
    verl's legacy micro-batches (``harness.train.micro_batches.micro_batch_row_scales``)."""
    kl_weights = None if inputs.kl_weights is None else inputs.kl_weights * kl_scales[:, None]
    return dataclasses.replace(inputs, weights=inputs.weights * scales[:, None], denominator=1.0,
                               kl_weights=kl_weights, kl_denominator=None if kl_weights is None else 1.0)


@dataclass
class HookOutput:
    """The inspect format: advantages (B, T), weights (B, T), keep (B,), denominator, the method's metrics, and
    (given a loss configuration) the policy loss of the batch with the loss's own metrics (clip fractions, kl)."""

    advantages: torch.Tensor
    weights: torch.Tensor
    keep: torch.Tensor
    denominator: float
    metrics: dict[str, float]
    loss: float | None = None
    loss_metrics: dict[str, float] | None = None


def loss_inputs_for(method: Method, batch: RolloutBatch, result: TokenWeights, ctx: StepContext,
                    positions: torch.Tensor | None, old_logp: torch.Tensor | None,
                    ref_logp: torch.Tensor | None) -> LossInputs:
    """What the loss of ``batch`` needs besides logp: the method's weights, the KL term's weights, and the tokens
    whose statistics were computed (all completion tokens, or the method's ``loss_positions`` (B, T) bool)."""
    kl_weights, kl_denominator = kl_weights_of(result, batch, ctx)
    computed = batch.completion_mask
    if positions is not None:
        computed = computed * positions
        weighted = (result.weights != 0) | ((kl_weights != 0) if ctx.beta > 0 else False)
        if bool((weighted & ~positions).any()):
            raise ValueError(f"method {method.name!r} weighs tokens outside its loss_positions")
    return LossInputs(batch.advantages, computed, result.weights, result.denominator, kl_weights, kl_denominator,
                      old_logp=old_logp, ref_logp=ref_logp)


def run_hooks(method: Method, batch: RolloutBatch, stats_for: Callable[[PreparedBatch], TokenStats],
              ctx: StepContext, loss_config: LossConfig | None = None) -> HookOutput:
    """All hooks on one batch; ``stats_for`` gives the statistics of the prepared (reduced) batch. With
    ``loss_config``, also the loss the trainer would compute on it."""
    full_shape = batch.completion_mask.shape
    prepared = prepare_batch(method, batch, ctx)
    stats = stats_for(prepared)
    result = weigh_tokens(method, stats, prepared, ctx)
    advantages = torch.zeros(full_shape)
    weights = torch.zeros(full_shape)
    rows, length = prepared.rows, prepared.length
    advantages[rows, :length] = prepared.batch.advantages.detach().float()
    weights[rows, :length] = result.weights.detach().float()
    keep = torch.zeros(full_shape[0], dtype=torch.bool)
    keep[rows] = True
    output = HookOutput(advantages, weights, keep, float(result.denominator), result.metrics)
    if loss_config is not None:
        positions = method.loss_positions(prepared.batch, ctx)
        inputs = loss_inputs_for(method, prepared.batch, result, ctx, positions, stats.old_logp, stats.ref_logp)
        loss, loss_metrics = loss_of_rows(stats.logp, inputs, loss_config)
        output.loss, output.loss_metrics = float(loss), {k: float(v) for k, v in loss_metrics.items()}
    return output
