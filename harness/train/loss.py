"""The policy loss, as pure tensor functions (torch only: no TRL, no trainer), in the style of verl's
``verl/trainer/ppo/core_algos.py`` (``compute_policy_loss``, ``kl_penalty``).

Shapes: B rollouts, T completion positions; every per-token tensor is (B, T).

    r      = exp(clamp(logp - old_logp, -20, 20))                     ratio pi_theta / pi_old
    l      = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))         clipped surrogate (PPO, DAPO's clip-higher)
    l      = min(l, -A c)  where A < 0                                dual-clip (Ye et al. 2020, arXiv 1912.09729)
    loss   = sum(w l) / D  +  beta sum(w_kl kl) / D_kl                 w, D: the method's weights and denominator

The clamp of the log-ratio keeps exp finite (verl does the same); at |logp - old_logp| <= 20 it changes nothing.
The KL term runs over every completion token with the baseline's aggregation (``w_kl``, ``D_kl``), not over the
method's selection: the penalty keeps the whole policy near the reference. A method may set its own (``w_kl``,
``D_kl``) in ``TokenWeights``: NAT's Horvitz-Thompson weights make the KL term of a random token subset unbiased.

Metrics are returned, not logged (the actor logs them): 0-dim detached tensors, so that a caller summing
them over row chunks does not synchronise with the device per chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 4.9e8: finite in float32; verl clamps the same way


@dataclass(frozen=True)
class LossConfig:
    """clip_eps_low/high: the clip range (1 - low, 1 + high); clip_ratio_c: dual-clip bound c > 1 for A < 0, None
    = off; beta: KL coefficient (0 = no KL term); kl_estimator: a name in KL_ESTIMATORS."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    clip_ratio_c: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"


def ratio_of(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """(B, T) log-probs under pi_theta and pi_old -> (B, T) r = pi_theta / pi_old, log-ratio clamped to +-20."""
    return torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


@dataclass
class ClipRegions:
    """(B, T) bool masks of the tokens whose gradient a clip removed.

    low:  A < 0 and r < 1 - eps_low      (the surrogate uses the clipped ratio)
    high: A > 0 and r > 1 + eps_high
    dual: A < 0 and r > c                (dual-clip: the loss is the constant -A c); all False when c is None
    """

    low: torch.Tensor
    high: torch.Tensor
    dual: torch.Tensor


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_eps_low: float, clip_eps_high: float,
                      clip_ratio_c: float | None = None) -> tuple[torch.Tensor, ClipRegions]:
    """(B, T) ratio and advantages -> (B, T) per-token loss (to minimise) and the clip regions.

    Adapted from verl's ``compute_policy_loss`` (vanilla): https://github.com/volcengine/verl,
    verl/trainer/ppo/core_algos.py.
    """
    # l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) = -min(r A, clip(r) A)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_eps_low, 1 + clip_eps_high)
    per_token = torch.maximum(pg_loss1, pg_loss2)
    with torch.no_grad():
        low = (ratio < 1 - clip_eps_low) & (advantages < 0)
        high = (ratio > 1 + clip_eps_high) & (advantages > 0)
        dual = torch.zeros_like(low)
    if clip_ratio_c is not None:
        if not clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be > 1 (dual-clip bounds -A r for A < 0 at r = c), got {clip_ratio_c}")
        # for A < 0: l = min(l, -A c); -A r grows without bound in r, the bound caps a token's gradient at r > c
        pg_loss3 = -advantages * clip_ratio_c
        per_token = torch.where(advantages < 0, torch.minimum(per_token, pg_loss3), per_token)
        with torch.no_grad():
            dual = (advantages < 0) & (ratio > clip_ratio_c)
    return per_token, ClipRegions(low, high, dual)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi_theta - log pi_ref: unbiased for KL(pi_theta || pi_ref) on samples of pi_theta, high variance.
    Schulman, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html)."""
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1 >= 0: unbiased, low variance (same blog post); GRPO's KL term
    (arXiv 2402.03300, eq. 4)."""
    log_ratio_ref = ref_logp - logp
    return torch.exp(log_ratio_ref) - log_ratio_ref - 1


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's ``low_var_kl``: k3 with the log-ratio clamped to +-20 and the result clamped to [-10, 10]."""
    log_ratio_ref = torch.clamp(ref_logp - logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.clamp(torch.exp(log_ratio_ref) - log_ratio_ref - 1, min=-10.0, max=10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "k3": kl_k3, "low_var_kl": kl_low_var}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """(B, T) log-probs under pi_theta and pi_ref -> (B, T) per-token estimate of KL(pi_theta || pi_ref)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, got {estimator!r}")
    return KL_ESTIMATORS[estimator](logp, ref_logp)


def weighted_loss(per_token: torch.Tensor, weights: torch.Tensor, denominator: torch.Tensor | float) -> torch.Tensor:
    """sum(w * l) / D: (B, T) per-token loss and weights, scalar denominator -> scalar. Every aggregation mode is
    such a pair (``methods.base.aggregation_weights``); a method's selection is a pair too."""
    return (weights * per_token).sum() / denominator


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(values * mask) / max(sum(mask), 1), detached: a token-mean over ``mask`` for the metrics."""
    with torch.no_grad():
        return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor, denominator: torch.Tensor | float, config: LossConfig,
                ref_logp: torch.Tensor | None = None, kl_weights: torch.Tensor | None = None,
                kl_denominator: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of a set of rows: all (B, T) tensors except the scalar denominators.

    logp (with grad), old_logp (rollout policy), advantages, mask (1 on completion tokens: what the metrics
    average over), weights and denominator (the method's), ref_logp, kl_weights and kl_denominator (only when
    config.beta > 0). Returns the scalar loss and token-means over ``mask``: ``clip_ratio/low_mean``,
    ``clip_ratio/high_mean``, ``clip_ratio/dual_mean`` (fraction of tokens in each clip region),
    ``clip_ratio/region_mean`` (low or high) and, with beta > 0, ``kl``.

    A row chunk's loss uses the whole batch's denominators, so the chunks' losses add up to the batch's.
    """
    ratio = ratio_of(logp, old_logp)
    per_token, regions = clipped_surrogate(ratio, advantages, config.clip_eps_low, config.clip_eps_high,
                                           config.clip_ratio_c)
    loss = weighted_loss(per_token, weights, denominator)
    metrics = {
        "clip_ratio/region_mean": masked_mean(regions.low | regions.high, mask),
        "clip_ratio/low_mean": masked_mean(regions.low, mask),
        "clip_ratio/high_mean": masked_mean(regions.high, mask),
        "clip_ratio/dual_mean": masked_mean(regions.dual, mask),
    }
    if config.beta > 0:
        if ref_logp is None or kl_weights is None or kl_denominator is None:
            raise ValueError("beta > 0 needs ref_logp, kl_weights and kl_denominator")
        kl = kl_estimate(logp, ref_logp, config.kl_estimator)
        loss = loss + config.beta * (kl_weights * kl).sum() / kl_denominator  # (beta sum) / D_kl: no rounding change
        metrics["kl"] = masked_mean(kl.detach(), mask)
    return loss, metrics


@dataclass
class LossInputs:
    """What the loss of a set of rows needs besides the current policy's logp.

    advantages, mask, weights: (B, T); denominator: the method's, scalar; kl_weights (B, T) and kl_denominator:
    the baseline aggregation for the KL term (None without one); old_logp (B, T): the rollout policy's log-probs,
    None while pi_old = pi_theta (the first pass over a batch: old_logp = logp.detach()); ref_logp (B, T) or None.
    """

    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    denominator: torch.Tensor | float
    kl_weights: torch.Tensor | None = None
    kl_denominator: torch.Tensor | float | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None

    def rows(self, rows: torch.Tensor, width: int) -> LossInputs:
        """The inputs of ``rows``, cut to the first ``width`` positions; the denominators stay the whole batch's."""
        def cut(t):
            return None if t is None else t[rows, :width]

        return LossInputs(cut(self.advantages), cut(self.mask), cut(self.weights), self.denominator,
                          cut(self.kl_weights), self.kl_denominator, cut(self.old_logp), cut(self.ref_logp))


def loss_of_rows(logp: torch.Tensor, inputs: LossInputs,
                 config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` of a set of rows, (B, T) logp with grad."""
    old_logp = logp.detach() if inputs.old_logp is None else inputs.old_logp
    return policy_loss(logp, old_logp, inputs.advantages, inputs.mask, inputs.weights, inputs.denominator, config,
                       inputs.ref_logp, inputs.kl_weights, inputs.kl_denominator)


def combine_row_metrics(parts: list[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Token-means of row chunks, each given with its token count -> the token-means of all their rows."""
    total = sum(count for _, count in parts).clamp(min=1)
    return {name: sum(metrics[name] * count for metrics, count in parts) / total for name in parts[0][0]}
