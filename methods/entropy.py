"""Entropy ("Beyond the 80/20 Rule"): train only on the high-entropy minority of tokens.

Wang et al., arXiv 2506.01939 (NeurIPS 2025), Sec. 5.1 Eq. 6. Official code: github.com/Shenzhi-Wang/
Beyond-the-80-20-Rule-RLVR @6f5dda6f70dbee207bea28705e5f96ce12eb98df (mask cast fix 137d8d1),
verl/trainer/ppo/core_algos.py ``get_global_entropy_top_mask`` (L53-85) and verl/workers/actor/dp_actor.py, where
the mask multiplies the response mask inside ``agg_loss``. TRL variant: huggingface/trl
@f2cd57710ae345ea6428ae95363267fcf38a3dc8, ``GRPOTrainer.get_high_entropy_mask`` and ``top_entropy_quantile``.

With H_{i,t} the entropy of pi_theta (the training policy, at the current forward), M the completion mask and n = |M|:

    verl (default):  S = topk_{(i,t) in M}(H, k),  k = max(1, int(n rho + 0.9999))          (Eq. 6: H >= tau_rho^B)
                     L = sum_{i,t} S l / sum S                                              (denominator: selected)
    trl:             tau = quantile_{(i,t) in M}(H, 1 - rho) (linear interpolation),  S = M & (H >= tau)
                     L = sum_{i,t} S l / sum M                                              (denominator: all)
    ets:             tau = sort(H[M])[r - 1],  r = int(n (1 - rho)),  S = M & (H >= tau) & (H != 0)
                     L = sum_{i,t} S l / sum M                                              (denominator: all)

"ets" is the ETS baseline of the GMTS paper (Lv et al., arXiv 2608.30632): github.com/outongyiLv/GMTS @70fcd28,
GMTS-Framework1/grpo_tools/grpo.py ``update_policy`` with ``use_TES_method`` and ``selected_percent`` = 1 - rho:
the r lowest entropies of the mini-batch are removed by a threshold (ties with the r-th are kept), a token whose
entropy is 0 is never kept (the code marks removed tokens by zeroing their entropy), and the advantages of removed
tokens are zeroed while the loss still divides by every response token. With r = 0 the official index r - 1 = -1
takes the largest entropy as the threshold; that case only arises for n = 1, where it keeps that token (if H > 0).

``int(n rho + 0.9999)`` is the official ceil: it equals ceil(n rho) unless the fractional part of n rho lies in
(0, 1e-4), and it absorbs float error (25 * 0.28 = 7.000000000000001 keeps 7, math.ceil would keep 8). Ties at the
k-th value are broken by ``torch.topk`` exactly as in the official code (the same call on the same flat vector).
The TRL threshold keeps every tie, so it keeps at least ceil(rho n) tokens, and its denominator is unchanged:
at rho = 0.2 its gradient is about 5x smaller than verl's.

With another aggregation than token-mean, "selected" applies the run's aggregation to the selected mask (what
verl's ``agg_loss(loss, response_mask * entropy_mask, mode)`` does) and "all" applies it to the completion mask with
unselected tokens weighted 0 (what TRL does).

Deviations (also in ``Entropy.deviations``): the ranking scope is the batch handed to ``token_weights`` (the
trainer's update batch), not verl's per-GPU micro-batch; TRL's threshold is taken over this process's tokens (TRL
gathers every rank's tokens); under seq-mean-token-mean a rollout without a selected token is left out of the
sequence mean (verl divides 0 by 0 there); ets normalises by the run's aggregation over every token of the batch,
where Framework1 folds a per-group token count into the advantage (DAPO: A / sum of the group's lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import (
    Method,
    RolloutBatch,
    StepContext,
    TokenStats,
    TokenWeights,
    aggregate,
)
from methods.declaration import check_declared, setting
from methods.registry import register_method

SEMANTICS = ("verl", "trl", "ets")
DENOMINATORS = ("auto", "selected", "all")
QUANTILE_MAX_NUMEL = 2**24  # torch.quantile refuses larger inputs


def official_top_k(n: int, rho: float) -> int:
    """k = max(1, int(n rho + 0.9999)): the official code's ceil(n rho), at least one token."""
    return max(1, int(n * rho + 0.9999))


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """verl's ``get_global_entropy_top_mask``: (B, T) bool, the k highest-entropy tokens among ``mask`` (B, T)."""
    flat_mask = mask.flatten().bool()
    flat_entropy = entropy.flatten()[flat_mask]  # (n,)
    selected = torch.zeros_like(flat_mask)
    if flat_entropy.numel() == 0:
        return selected.view_as(mask)
    # S = topk(H[M], max(1, int(n rho + 0.9999)))
    _, top = torch.topk(flat_entropy, k=official_top_k(flat_entropy.numel(), rho))
    selected[flat_mask.nonzero(as_tuple=False).squeeze(1)[top]] = True
    return selected.view_as(mask)


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation), also for inputs above torch's 2**24 limit."""
    if values.numel() <= QUANTILE_MAX_NUMEL:
        return torch.quantile(values, q)
    ordered = torch.sort(values).values
    position = q * (ordered.numel() - 1)
    low = int(position)
    high = min(low + 1, ordered.numel() - 1)
    return torch.lerp(ordered[low], ordered[high], position - low)


def quantile_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> tuple[torch.Tensor, float]:
    """TRL's ``get_high_entropy_mask`` with quantile 1 - rho: (mask (B, T) bool, threshold)."""
    mask = mask.bool()
    valid = entropy[mask].float()  # TRL takes the quantile in float32
    if valid.numel() == 0:
        return torch.zeros_like(mask), float("nan")
    threshold = quantile(valid, 1.0 - rho)  # tau = quantile(H[M], 1 - rho)
    return (entropy.float() >= threshold) & mask, float(threshold)  # ties at tau are kept


def ets_threshold_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> tuple[torch.Tensor, float]:
    """GMTS Framework1's ETS: (mask (B, T) bool, threshold), removing the int(n (1 - rho)) lowest entropies."""
    mask = mask.bool()
    valid = entropy[mask]  # (n,)
    if valid.numel() == 0:
        return torch.zeros_like(mask), float("nan")
    removed = int(valid.numel() * (1.0 - rho))
    threshold = torch.sort(valid).values[removed - 1]  # tau = sort(H[M])[r - 1]; r = 0 indexes the largest, as official
    return mask & (entropy >= threshold) & (entropy != 0), float(threshold)


@register_method("entropy")
class Entropy(Method):
    """Top-rho tokens by pi_theta entropy within the update batch; the loss averages over them (verl)."""

    needs = frozenset({"entropy"})
    deviations = (
        "ranking scope is the update batch handed to token_weights, not verl's per-GPU micro-batch",
        "trl semantics: the quantile is taken over this process's tokens (TRL gathers across ranks)",
        "seq-mean-token-mean with the selected denominator skips rollouts without a selected token (verl: 0/0)",
        "ets semantics: the run's aggregation over the batch, not Framework1's per-group token count in the advantage",
    )

    @dataclass
    class Config:
        rho: float = setting(
            0.2, "Fraction of the batch's completion tokens kept, by entropy (paper: 0.2; ablations 0.1/0.5/1.0).",
            low=0.0, low_open=True, high=1.0)
        semantics: str = setting(
            "verl", '"verl": official top-k with k = max(1, int(n rho + 0.9999)); "trl": TRL\'s quantile threshold, '
            'ties kept; "ets": the GMTS paper\'s ETS baseline (threshold at the int(n (1 - rho))-th lowest entropy, '
            'ties kept, zero entropies dropped).', choices=SEMANTICS)
        denominator: str = setting(
            "auto", '"auto": the semantics\' own ("selected" for verl, "all" for trl and ets); "selected": the run\'s '
            'aggregation over the selected tokens; "all": the run\'s aggregation over every completion token, '
            'unselected ones weigh 0.', choices=DENOMINATORS)

        def __post_init__(self):
            check_declared(self, "method.")

    def denominator_mode(self) -> str:
        if self.config.denominator != "auto":
            return self.config.denominator
        return "selected" if self.config.semantics == "verl" else "all"

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        if stats.entropy is None:
            raise ValueError("method 'entropy' needs stats.entropy (declared in Entropy.needs)")
        entropy = stats.entropy.detach()  # (B, T), pi_theta at this forward
        mask = batch.completion_mask > 0  # (B, T)
        if self.config.semantics == "verl":
            selected = top_entropy_mask(entropy, mask, self.config.rho)
            threshold = float(entropy[selected].min()) if bool(selected.any()) else float("nan")
        elif self.config.semantics == "trl":
            selected, threshold = quantile_entropy_mask(entropy, mask, self.config.rho)
        else:
            selected, threshold = ets_threshold_mask(entropy, mask, self.config.rho)
        selected = selected.to(torch.float32)
        n = int(mask.sum())
        metrics = {"tokens_selected_frac": float(selected.sum()) / max(n, 1)}
        if threshold == threshold:  # not NaN: some token was selected
            metrics["entropy_threshold"] = threshold
        if self.denominator_mode() == "selected":  # L = sum_S l / |S| under token-mean
            return aggregate(selected, ctx, metrics)
        return aggregate(batch.completion_mask, ctx, metrics, trained=selected)  # L = sum_S l / |M| under token-mean
