"""D3S: Dynamic Dual-Level Down-Sampling (Wang et al., "Learning More with Less", arXiv 2509.22115, ICLR 2026).

Sources: the paper (abstract and Sec. 3 as restated by paper-note digests and the OpenReview reviews; see
docs/methods.md "D3S"); PODS (Xu et al., arXiv 2504.13818) for the max-variance subset. The official code exists only
in the OpenReview supplement and was not read: nothing here is checked against it.

With A_i the GRPO rollout advantage, normalised over all G rollouts of its group BEFORE any selection, and
p = ctx.progress (budget spent):

    sample level, per group g:   S_g = argmax_{S in g, |S| = N_s} Var(A_S),           N_s = ceil(group_keep(p) G_g)
    cross-group, whole batch:    S   = argmax_{S in U_g S_g, |S| = N} Var(A_S),       N   = ceil(batch_keep(p) B)
                                 (advantages are NOT re-normalised over S; dropped rollouts leave the forward pass)
    token level, kept rollouts:  K   = topk_{(i,t): m_{i,t} = 1}(|A_{i,t}| H_{i,t}, ceil(token_keep(p) n))
    loss:                        L   = the run's aggregation (train.aggregation) over K   (denominator="aggregation")
                                       token-mean: sum_{(i,t) in K} l_{i,t} / |K|
    schedule:                    x(p) = (1 - p) x_start + p x_end   for x in (group_keep, batch_keep, token_keep)

The max-variance subset of size N of n scalars is always the k smallest plus the N - k largest for some k
(PODS; derived in docs/methods.md "D3S"): sort once, scan k = 0..N with prefix sums, O(n log n).

The schedule's start/end values are NOT published (docs/methods.md "Project decisions"): the defaults (keep
50 % of rollouts and 20 % of tokens at the start, 100 % of both at the end) are this project's choice. The paper
counts rollouts (N_s, N); we give fractions of the group size G and of the generation batch B so one config fits
every preset.
With the defaults the per-group pass keeps 75 % of each group and the cross-group pass 50 % of the batch, so both
passes act. Ablations (set start and end): batch_keep = 1 leaves the per-group pass only; group_keep = 1 the
cross-group pass only; token_keep = 1 switches the token level off; start = end switches the schedule off.

The denominator follows the run's aggregation so that D3S and its baseline differ only in what they select: at
the end of the schedule (everything kept) D3S is the baseline, GRPO's seq-mean-token-mean included (paper-d3s).
Under token-mean (DAPO, the tiny preset) this is the selected-token mean |K|, the earlier default ("selected"),
with identical arithmetic; "selected" keeps the token mean under any aggregation.

Scope across processes: the cross-group pass ranks the rollouts of ONE process (its generation batch share): in a
run of P training processes each keeps ceil(batch_keep B / P) of its own B / P rollouts, not the max-variance
subset of all B. A global pass would need every process's advantages and group ids gathered before the selection
and an uneven number of kept rollouts per process; not done. The per-group pass is exact (whole groups live on one
process).

Deviations (also in ``D3S.deviations``): the schedule values and fraction parameterisation above; the paper's
"N_pos largest positive and N_neg most negative" split is taken to be the exact max-variance split; the token
denominator (the run's aggregation over the selected tokens) is assumed, not confirmed; the cross-group pass is
per process; token selection ranks over the whole update batch (of the process); tokens with zero score may be
selected when K% exceeds the nonzero ones (they add to |K| but not to the gradient).
"""

from __future__ import annotations

import math
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

DENOMINATORS = ("selected", "aggregation", "all")


def fraction(default: float, doc: str):
    """A kept fraction's setting: in (0, 1]."""
    return setting(default, doc, low=0.0, low_open=True, high=1.0)


def lerp(start: float, end: float, progress: float) -> float:
    """x(p) = (1 - p) x_start + p x_end, with p clamped to [0, 1]."""
    p = min(max(float(progress), 0.0), 1.0)
    return (1.0 - p) * start + p * end


def keep_count(fraction: float, n: int) -> int:
    """ceil(fraction * n), at least 1 when n > 0, at most n (1e-9 absorbs float error: 0.7 * 10 -> 7, not 8)."""
    if n <= 0:
        return 0
    return min(n, max(1, math.ceil(fraction * n - 1e-9)))


def max_variance_subset(values: torch.Tensor, size: int) -> torch.Tensor:
    """Indices (size,) into ``values`` (n,) of a size-``size`` subset with the largest variance.

    The optimum is the k smallest plus the (size - k) largest values for some k (PODS, arXiv 2504.13818):
    sort once, Var_k = E_k[x^2] - E_k[x]^2 from prefix sums, take the first best k.
    """
    n = values.numel()
    if size >= n:
        return torch.arange(n, device=values.device)
    if size <= 0:
        return torch.zeros(0, dtype=torch.long, device=values.device)
    x = values.detach().to(torch.float64)
    order = torch.argsort(x, stable=True)
    s = x[order] - x.mean()  # centring keeps E[x^2] - E[x]^2 away from cancellation
    zero = s.new_zeros(1)
    c1 = torch.cat([zero, torch.cumsum(s, 0)])  # c1[j] = sum of the j smallest
    c2 = torch.cat([zero, torch.cumsum(s * s, 0)])
    k = torch.arange(size + 1, device=values.device)  # k smallest + (size - k) largest
    sum1 = c1[k] + c1[n] - c1[n - size + k]
    sum2 = c2[k] + c2[n] - c2[n - size + k]
    variance = sum2 / size - (sum1 / size) ** 2
    best = int(torch.argmax(variance))
    return torch.cat([order[:best], order[n - size + best:]])


@register_method("d3s")
class D3S(Method):
    """Max-Var(A) rollouts per group then across the batch; top-K% tokens by |A| * H; both relaxed over progress.

    on_rollouts sets ``keep`` (B,); token_weights returns the selection (B', T) over the kept rollouts.
    """

    needs = frozenset({"entropy"})
    deviations = (
        "schedule start/end values are not published: defaults keep 50% of rollouts and 20% of tokens at the "
        "start, 100% of both at the end (linear in budget progress)",
        "rollout counts parameterised as fractions: per-group pass keeps ceil(group_keep*G) (75% at the start), "
        "cross-group pass ceil(batch_keep*B) of the generation batch (50% at the start)",
        "sample-level subset is the exact max-variance subset (k smallest + N-k largest, PODS scan); the paper's "
        "N_pos/N_neg split is assumed to be this optimum",
        "loss denominator = the run's aggregation over the selected tokens, token-mean: |K| (assumed; paper not "
        "confirmed); switch: denominator",
        "cross-group pass ranks one process's rollouts (each of P processes keeps ceil(batch_keep B/P) of its B/P); "
        "no gather across processes",
        "token top-K% ranks over the whole update batch of the process (scope assumed); zero-score tokens can be "
        "selected",
        "official code (OpenReview supplement only) not read; no golden test",
    )

    @dataclass
    class Config:
        group_keep_start: float = fraction(
            0.75, "Fraction of each prompt group's rollouts kept by the per-group max-Var(A) pass at progress 0 "
            "(assumed).")
        group_keep_end: float = fraction(1.0, "... at progress 1 (assumed).")
        batch_keep_start: float = fraction(
            0.5, "Fraction of the generation batch kept by the cross-group max-Var(A) pass at progress 0 (assumed).")
        batch_keep_end: float = fraction(1.0, "... at progress 1 (assumed).")
        token_keep_start: float = fraction(
            0.2, "Fraction of the kept rollouts' tokens selected by |A| * H at progress 0 (assumed).")
        token_keep_end: float = fraction(1.0, "... at progress 1 (assumed).")
        denominator: str = setting(
            "aggregation", 'Loss denominator. "aggregation": the run\'s aggregation (train.aggregation) over the '
            'selected tokens, so the end of the schedule is the baseline (under token-mean: |K|, identical to '
            '"selected"); "selected": |K| (token-mean over K, whatever train.aggregation says); "all": the run\'s '
            'aggregation over every token of the kept rollouts, unselected tokens weigh 0.', choices=DENOMINATORS)

        def __post_init__(self):
            check_declared(self, "method.")

    def schedule(self, progress: float) -> tuple[float, float, float]:
        """(group_keep, batch_keep, token_keep) at budget progress p: linear from the start to the end values."""
        c = self.config
        return (lerp(c.group_keep_start, c.group_keep_end, progress),
                lerp(c.batch_keep_start, c.batch_keep_end, progress),
                lerp(c.token_keep_start, c.token_keep_end, progress))

    def on_rollouts(self, batch: RolloutBatch, ctx: StepContext) -> RolloutBatch:
        group_keep, batch_keep, _ = self.schedule(ctx.progress)
        advantages = batch.rollout_advantages  # (B,), normalised over the full group: never re-normalised here
        candidates = torch.nonzero(batch.keep, as_tuple=False).flatten()
        # sample level: S_g = argmax_{|S| = ceil(group_keep * G_g)} Var(A_S), per prompt group
        survivors = []
        for gid in torch.unique(batch.group_ids[candidates]):
            rows = candidates[batch.group_ids[candidates] == gid]
            survivors.append(rows[max_variance_subset(advantages[rows], keep_count(group_keep, rows.numel()))])
        survivors = torch.cat(survivors) if survivors else candidates
        # cross-group: S = argmax_{|S| = ceil(batch_keep * B)} Var(A_S) over the survivors of all groups
        size = min(keep_count(batch_keep, candidates.numel()), survivors.numel())
        kept = survivors[max_variance_subset(advantages[survivors], size)]
        keep = torch.zeros_like(batch.keep)
        keep[kept] = True
        return batch.replace(keep=keep)

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        if stats.entropy is None:
            raise ValueError("method 'd3s' needs stats.entropy (declared in D3S.needs)")
        group_keep, batch_keep, token_keep = self.schedule(ctx.progress)
        mask = batch.completion_mask > 0  # (B', T): tokens of the kept rollouts
        # score_{i,t} = |A_{i,t}| * H_{i,t};  K = the top ceil(token_keep * n) scores among real tokens
        score = (batch.advantages.detach().abs() * stats.entropy.detach().float()).masked_fill(~mask, -math.inf)
        n = int(mask.sum())
        selected = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        selected.view(-1)[torch.topk(score.flatten(), keep_count(token_keep, n)).indices] = 1.0
        metrics = {"group_keep": group_keep, "batch_keep": batch_keep, "token_keep": token_keep,
                   "tokens_selected_frac": float(selected.sum()) / max(n, 1)}
        if self.config.denominator == "selected":  # L = sum_K l / |K|
            return aggregate(selected, ctx, metrics, mode="token-mean")
        if self.config.denominator == "aggregation":
            return aggregate(selected, ctx, metrics)
        # "all": unselected tokens weigh 0 in the baseline's loss over every kept token
        return aggregate(batch.completion_mask, ctx, metrics, trained=selected)
