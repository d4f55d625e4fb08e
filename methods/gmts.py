"""GMTS: gradient-magnitude token selection (Lv, Zhang, Zhang; arXiv 2608.30632, OpenReview JGvOicAo3g).

Official code: github.com/outongyiLv/GMTS, Framework1 @70fcd28adf9f292f46b15607aa818cec45df4c63
(GMTS-Framework1/grpo_tools/grpo.py: ``GMTS`` and ``update_policy``, the per-group reference followed here) and
Framework2 @ae429bfc062d6847814f8e7a5a8b61060abbb4ef (GMTS-Framework2/verl/workers/actor/dp_actor.py
``update_policy``). See docs/methods.md, section "GMTS".

Each token's score approximates the norm of its loss gradient w.r.t. the logits: the scalar omega multiplying
grad log pi_theta(y_{i,t}) in its loss term, times the entropy as a proxy for ||p - e_y|| (paper Prop. 3.1):

    r_{i,t}     = pi_theta / pi_old = exp(logp - old_logp)
    trust_{i,t} = 0 if (r > 1 + eps_high and A > 0) or (r < 1 - eps_low and A < 0) else 1    (PPO clip: zero grad)
    omega_{i,t} = r trust A  (+ beta pi_ref / pi_theta - beta when beta > 0: the k3-KL gradient)
    delta_{i,t} = H_{i,t} |omega_{i,t}|        (score="exact_gradient": |omega| sqrt(1 - 2 p_y + sum_v p_v^2))

Within each prompt group (scope="group"; "batch" ranks the whole batch) with N completion tokens, sort delta
ascending (stable: rollouts in batch order, then positions, as Framework1's list sort) and remove the
max(1, ceil(remove_fraction N)) lowest; a token with delta = 0 is never kept. So about floor(0.2 N) tokens stay at
remove_fraction = 0.8 and none in a group of under 5 tokens. Unselected tokens contribute nothing; the loss keeps
the baseline's denominator over all completion tokens (official: the advantage of unselected tokens is zeroed):

    L = sum_{i,t} S_{i,t} l_{i,t} / sum_{i,t} M_{i,t}        (token-mean; denominator="selected": / sum S, paper text)

The config keeps the official semantic, the fraction REMOVED (Framework1 ``selected_percent: 0.8``, Framework2
``doing_entropy_clipping_percent=0.8``); paper rho = 1 - remove_fraction.

Deviations (also in ``GMTS.deviations``):
- H and r come from each mini-batch's own training forward (the loss's own tensors, no grad), r against the
  rollout policy's log-probs (train.mini_batches x train.ppo_epochs > 1: r != 1 after the first mini-batch); the
  official codes run an extra no-grad forward at the start of each mini-batch. Both see the weights before that
  mini-batch's update, so the values are the same on every mini-batch (tests/test_minibatches.py); only the extra
  forward is saved.
- Groups come from ``group_ids``; Framework1 asserts 16 rollouts per group and Framework2 slices fixed 16-row
  chunks with a loop that filters only the first groups (bug, docs/methods.md "GMTS"): neither is reproduced.
- Count rule of Framework1; Framework2 instead removes int(0.8 N') of the N' nonzero scores and every tie at the
  threshold.
- A zero-score token is never kept (project rule). Framework1 keeps a zero-score token that survives the count
  rule if its entropy is nonzero; such a token has zero policy gradient (trust = 0 or A = 0), so only its weight
  and the "selected" denominator differ.
- omega uses the raw advantage A (Framework2, the project's DAPO-mode decision); Framework1 folds the loss
  normaliser into A (GRPO: A / (G |o_i|)), which favours short rollouts: switch fold_aggregation=true multiplies
  omega by the token's aggregation weight.
- The 1/T factor of the logit gradient is left out of omega (a constant: no effect on the ranking).
- score="exact_gradient" is this project's ablation (docs/methods.md "GMTS", derived), not in the paper or code.
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

SCOPES = ("group", "batch")
DENOMINATORS = ("all", "selected")
SCORES = ("entropy", "exact_gradient")


def trust_indicator(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """1 where the clipped surrogate has a gradient, 0 where PPO clipping zeroes it; (B, T) float."""
    clipped = ((ratio > 1 + eps_high) & (advantages > 0)) | ((ratio < 1 - eps_low) & (advantages < 0))
    return (~clipped).to(ratio.dtype)


def keep_top_scores(score: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, remove_fraction: float,
                    scope: str) -> torch.Tensor:
    """(B, T) bool: per scope, all but the max(1, ceil(remove_fraction N)) lowest scores among ``mask``; score > 0.

    The order is stable over row-major positions, so equal scores are removed first in earlier rollouts and
    earlier positions, as Python's list sort in Framework1. All groups are ranked at once: a stable sort by score,
    then a stable sort by group.
    """
    mask = mask.bool()
    positions = mask.flatten().nonzero(as_tuple=False).squeeze(1)  # (N,), row-major
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if positions.numel() == 0:
        return selected.view_as(mask)
    if scope == "group":
        labels = group_ids.to(mask.device)[positions // mask.shape[1]]
    else:
        labels = torch.zeros_like(positions)
    _, group = torch.unique(labels, return_inverse=True)  # (N,), 0..n_groups-1
    order = torch.sort(score.flatten()[positions], stable=True).indices  # ascending score, ties row-major
    order = order[torch.sort(group[order], stable=True).indices]  # grouped, ascending score within each group
    counts = torch.bincount(group)  # N_g
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel(), device=mask.device) - starts[group[order]]
    # Framework1: k = max(1, ceil(len(entries) * frac)), in double precision as Python's math.ceil
    removed = torch.ceil(counts.to(torch.float64) * remove_fraction).clamp(min=1).long()
    selected[positions[order[rank >= removed[group[order]]]]] = True
    return selected.view_as(mask) & (score > 0)


@register_method("gmts")
class GMTS(Method):
    """Per prompt group, keep the tokens with the largest H |omega| (approximate gradient norm); official count rule."""

    needs = frozenset({"entropy"})
    deviations = (
        "H and r from each mini-batch's own training forward (the weights before its update, as the official "
        "no-grad forward per mini-batch: same values), not a separate forward",
        "groups from group_ids; Framework1's 16-rollout assert and Framework2's 16-row chunks (and loop bug) dropped",
        "count rule of Framework1 (remove max(1, ceil(0.8 N)) lowest, stable order); Framework2's rule not used",
        "zero-score tokens never kept (Framework1 keeps survivors with nonzero entropy; their gradient is zero)",
        "omega uses the raw advantage (Framework2); Framework1's normaliser folding is fold_aggregation=true",
        "1/T factor of the logit gradient omitted (constant, ranking unchanged)",
        "score=exact_gradient is a project ablation, not in the paper or code",
    )

    @dataclass
    class Config:
        remove_fraction: float = setting(
            0.8, "Fraction of each scope's tokens REMOVED, lowest scores first (official semantic; paper rho = 1 - "
            "this). At least one token is always removed: max(1, ceil(remove_fraction N)).", low=0.0, high=1.0)
        scope: str = setting(
            "group", '"group": rank within each prompt group (Framework1); "batch": one ranking over the whole batch '
            '(paper).', choices=SCOPES)
        denominator: str = setting(
            "all", '"all": the run\'s aggregation over every completion token, unselected ones weigh 0 (official '
            'code); "selected": the run\'s aggregation over the selected tokens (paper text, S_rho).',
            choices=DENOMINATORS)
        score: str = setting(
            "entropy", '"entropy": H |omega| (paper, code); "exact_gradient": |omega| sqrt(1 - 2 p_y + sum p^2) '
            '(ablation).', choices=SCORES)
        fold_aggregation: bool = setting(
            False, "Multiply omega by the token's aggregation weight w/D (Framework1 GRPO: A / (G |o_i|)); False: raw "
            "A.")

        def __post_init__(self):
            check_declared(self, "method.")

    def __init__(self, config=None):
        super().__init__(config)
        # the exact-gradient score reads sum_v p_v^2 instead of the entropy (the harness reads the instance's needs)
        self.needs = frozenset({"sum_p2"}) if self.config.score == "exact_gradient" else frozenset({"entropy"})

    def needs_at(self, ctx: StepContext) -> frozenset[str]:
        # omega's KL part reads pi_ref whenever beta > 0 (not in ``needs``: a beta = 0 run must not load a reference)
        return self.needs | {"ref_logp"} if ctx.beta > 0 else self.needs

    def scores(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(delta (B, T), trust (B, T)), no grad."""
        logp = stats.logp.detach().float()
        ratio = torch.exp(logp - stats.old_logp.detach().float())  # r = pi_theta / pi_old
        advantages = batch.advantages.detach().float()
        trust = trust_indicator(ratio, advantages, ctx.clip_eps_low, ctx.clip_eps_high)
        omega = ratio * trust * advantages  # omega = r * 1_trust * A
        if ctx.beta > 0:
            if stats.ref_logp is None:
                raise ValueError(f"method 'gmts' with beta = {ctx.beta} > 0 needs stats.ref_logp for the KL term of "
                                 "its score; the trainer provides it whenever beta > 0")
            # + beta pi_ref / pi_theta - beta: d(-beta k3)/d log pi_theta, k3 = pi_ref/pi - log(pi_ref/pi) - 1
            omega = omega + (torch.exp(stats.ref_logp.detach().float() - logp) * ctx.beta - ctx.beta)
        if self.config.fold_aggregation:
            folded = aggregate(batch.completion_mask, ctx)
            omega = omega * folded.weights / folded.denominator
        if self.config.score == "entropy":
            if stats.entropy is None:
                raise ValueError("method 'gmts' needs stats.entropy (declared in GMTS.needs)")
            factor = stats.entropy.detach().float()  # H, the paper's proxy for ||p - e_y||
        else:
            if stats.sum_p2 is None:
                raise ValueError("method 'gmts' with score=exact_gradient needs stats.sum_p2 (declared in needs)")
            p_y = torch.exp(logp)
            factor = torch.sqrt(torch.clamp(1 - 2 * p_y + stats.sum_p2.detach().float(), min=0.0))  # ||p - e_y||
        return factor * omega.abs(), trust  # delta = H |omega|

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        mask = batch.completion_mask > 0  # (B, T)
        delta, trust = self.scores(stats, batch, ctx)
        selected = keep_top_scores(delta, mask, batch.group_ids, self.config.remove_fraction, self.config.scope)
        selected = selected.to(torch.float32)
        n = max(int(mask.sum()), 1)
        metrics = {"tokens_selected_frac": float(selected.sum()) / n,
                   "trust_zero_frac": float(((trust == 0) & mask).sum()) / n,
                   "score_zero_frac": float(((delta == 0) & mask).sum()) / n}
        if self.config.denominator == "selected":  # L = sum_S l / |S| under token-mean (paper)
            return aggregate(selected, ctx, metrics)
        # L = sum_S l / |M| under token-mean (official: unselected advantages zeroed)
        return aggregate(batch.completion_mask, ctx, metrics, trained=selected)
