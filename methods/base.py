"""The Method interface every token-targeting method implements.

A method is a small class whose defaults reproduce the uniform GRPO/DAPO baseline; it overrides only the hooks
it changes. The harness calls the hooks in this order for every optimizer step (and `harness inspect` calls
exactly the same driver, `harness.train.hooks.run_hooks`, on a batch file):

1. ``on_rollouts(batch, ctx)``     after rewards: may replace per-token advantages (KTAE) and set ``keep`` (D3S).
2. rollouts with ``keep == 0`` are removed before any forward pass (a real saving, not a mask).
3. ``before_forward(batch, ctx)``  may shorten sequences (NAT prefix cutting); columns past the longest kept
   prefix are dropped before the forward pass.
4. token statistics are computed, only those named in ``needs_at(ctx)`` (``needs`` unless a setting adds one)
   beyond ``logp``, and only at ``loss_positions`` when a method knows them in advance (NAT's URS).
5. ``token_weights(stats, batch, ctx)`` returns per-token weights and the loss denominator:
   ``loss = sum(weights * surrogate) / denominator`` (+ beta times the KL term, over every token unless the
   method sets ``kl_weights``: NAT), with the denominator's per-rollout parts (``row_denominators``), which the
   trainer sums over every process of the optimizer step (or over each micro-batch: ``TokenWeights``).

Shapes: B rollouts, T completion positions. Names follow the public ``inspect`` format.
Methods are pure tensor maps: no TRL, no I/O, no globals; randomness comes from ``ctx.generator()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Token statistics beyond logp that a method may name in ``needs`` (the fields of TokenStats below). The logit
# statistics come from pi_theta's logits in the same chunked pass as logp (harness/train/token_statistics.py);
# ref_logp comes from a forward of the reference model.
LOGIT_STATISTICS = ("entropy", "sum_p2")
STATISTICS = (*LOGIT_STATISTICS, "ref_logp")


@dataclass
class RolloutBatch:
    """One generation batch after rewards.

    completion_ids:      (B, T) long, padded completions
    completion_mask:     (B, T) float 0/1, 1 on real completion tokens
    rewards:             (B,) float
    group_ids:           (B,) long, rollouts of one prompt share an id
    rollout_advantages:  (B,) float, group-normalised outcome advantage of each rollout
    advantages:          (B, T) float, per-token advantage entering the clipped surrogate
    keep:                (B,) bool, rollouts that enter the forward/backward pass
    special_token_ids:   ids a method treats as special (EOS, PAD)
    extras:              per-method tensors carried from one hook to the next (e.g. NAT's inclusion probabilities)
    """

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    rollout_advantages: torch.Tensor
    advantages: torch.Tensor
    keep: torch.Tensor
    special_token_ids: tuple[int, ...] = ()
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def replace(self, **changes: Any) -> RolloutBatch:
        return dataclasses.replace(self, **changes)

    def select_rows(self, rows: torch.Tensor) -> RolloutBatch:
        """The sub-batch of the given row indices (used to drop rollouts before the forward pass)."""
        return self.replace(
            completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows],
            rewards=self.rewards[rows],
            group_ids=self.group_ids[rows],
            rollout_advantages=self.rollout_advantages[rows],
            advantages=self.advantages[rows],
            keep=self.keep[rows],
            extras={k: v[rows] for k, v in self.extras.items()},
        )

    def truncate(self, length: int) -> RolloutBatch:
        """The batch cut to its first ``length`` completion positions (per-token extras are cut too)."""
        cut = {k: (v[:, :length] if v.dim() == 2 else v) for k, v in self.extras.items()}
        return self.replace(
            completion_ids=self.completion_ids[:, :length],
            completion_mask=self.completion_mask[:, :length],
            advantages=self.advantages[:, :length],
            extras=cut,
        )


@dataclass
class TokenStats:
    """Per-token statistics of the sampled completion tokens, each (B, T).

    logp:      log pi_theta(y_t), with grad during training
    old_logp:  log pi_old(y_t) (rollout policy); equals logp.detach() on the first pass over a batch
    entropy:   H_t = -sum_v p log p of pi_theta, no grad; None unless the method needs it
    sum_p2:    sum_v p_v^2 of pi_theta, no grad; None unless the method needs it
    ref_logp:  log pi_ref(y_t); None unless a KL term or the method needs it
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_p2: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class StepContext:
    """What a method may know about the step besides the batch.

    progress: share of the budget spent before this step, in [0, 1] (drives schedules; the same on every process
    of a distributed run); step: optimizer step; seed: run seed; process_index: this training process's rank
    (0 in a single-process run and in ``harness inspect``), so that random draws differ between processes.
    aggregation: the baseline's loss aggregation (one of AGGREGATIONS); max_completion_length for Dr.GRPO.
    """

    progress: float = 0.0
    step: int = 0
    seed: int = 0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    beta: float = 0.0
    aggregation: str = "token-mean"
    max_completion_length: int = 1
    process_index: int = 0

    def generator(self) -> torch.Generator:
        """A CPU generator fixed by (seed, step, process_index): a method's random draws repeat exactly on a rerun,
        and each process of a distributed run draws its own. Process 0 keeps the (seed, step) seed of a
        single-process run. Process k > 0 hashes (seed, step, k) with splitmix64: the CPU generator keeps only the
        low 32 bits of its seed, so an offset such as k * 2^48 would be lost (and k * 2^32 too)."""
        seed = self.seed * 1_000_003 + self.step
        if self.process_index:
            seed = splitmix64(seed + (self.process_index << 32))
        return torch.Generator().manual_seed(seed)


def splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
    2014; constants of Vigna's splitmix64.c, prng.di.unimi.it): a 64-bit mix whose low bits depend on every input
    bit."""
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


@dataclass
class TokenWeights:
    """weights (B, T): per-token multiplicative weight; denominator: scalar; metrics: logged as ``method/<key>``.

    kl_weights (B, T) and kl_denominator (scalar), both or neither: the weights of the KL term (train.beta > 0),
    ``beta sum(kl_weights kl) / kl_denominator``. None (every method but NAT): the baseline aggregation over every
    completion token of the batch, whatever the method selected (the penalty keeps the whole policy near the
    reference). NAT sets its Horvitz-Thompson weights, so the KL term is unbiased for the full-token one too.

    row_denominators (B,): each rollout's part d_i of the denominator, denominator = max(sum_i d_i, 1)
    (``aggregation_row_denominators``; kl_row_denominators likewise for kl_denominator). The trainer sums them over
    the training processes (the loss is one mean over the optimizer step's tokens) or over the rows of each
    micro-batch (``train.loss_micro_batch_tokens``). None: the denominator is taken as a whole (summed over the
    processes; the micro-batch option then refuses the method).
    """

    weights: torch.Tensor
    denominator: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    kl_weights: torch.Tensor | None = None
    kl_denominator: torch.Tensor | None = None
    row_denominators: torch.Tensor | None = None
    kl_row_denominators: torch.Tensor | None = None


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group",
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage per rollout, (B,) -> (B,).

    scale="group": (R - mean_G R) / (std_G R + eps), std unbiased (n-1), as verl's compute_grpo_outcome_advantage;
    a group of one rollout gets mean 0 and std 1. scale="none": R - mean_G R (Dr.GRPO, arXiv 2503.20783).
    """
    if scale not in ("group", "none"):
        raise ValueError(f"scale_rewards must be one of ['group', 'none'], got {scale!r}")
    rewards = rewards.to(torch.float64)
    advantages = torch.zeros_like(rewards)
    for gid in torch.unique(group_ids):
        rows = group_ids == gid
        group = rewards[rows]
        if group.numel() == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = group.mean(), group.std(unbiased=True)
        centred = group - mean
        advantages[rows] = centred / (std + eps) if scale == "group" else centred
    return advantages.to(torch.float32)


def aggregation_weights(mask: torch.Tensor, mode: str, max_completion_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Express a loss aggregation over ``mask`` (B, T) as (weights (B, T), denominator scalar).

    token-mean (DAPO):                 sum_{i,t} m l / sum m
    seq-mean-token-mean (GRPO):        (1/B') sum_i (1/|o_i|) sum_t m l, B' = rollouts with a token in mask
    seq-mean-token-sum-norm (Dr.GRPO): sum_{i,t} m l / (B * max_completion_length)
    The denominator is clamped to at least 1 so an empty selection gives a zero loss, not NaN.
    """
    mask = mask.to(torch.float32)
    if mode == "token-mean":
        return mask, mask.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=1, keepdim=True)
        weights = mask / lengths.clamp(min=1.0)
        return weights, (lengths > 0).sum().to(torch.float32).clamp(min=1.0)
    if mode == "seq-mean-token-sum-norm":
        return mask, torch.tensor(float(mask.shape[0] * max_completion_length))
    raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {mode!r}")


def aggregation_row_denominators(mask: torch.Tensor, mode: str, max_completion_length: int) -> torch.Tensor:
    """(B,) each rollout's part d_i of ``aggregation_weights``' denominator over ``mask`` (B, T): D = max(sum d, 1).

    token-mean: d_i = sum_t m_{i,t};  seq-mean-token-mean: d_i = 1 if the rollout has a token in mask, else 0;
    seq-mean-token-sum-norm: d_i = max_completion_length. Every denominator is such a sum over rollouts, so the
    denominator of rollouts spread over several processes (or of one micro-batch's rollouts) is the sum of theirs.
    """
    mask = mask.to(torch.float32)
    if mode == "token-mean":
        return mask.sum(dim=1)
    if mode == "seq-mean-token-mean":
        return (mask.sum(dim=1) > 0).to(torch.float32)
    if mode == "seq-mean-token-sum-norm":
        return torch.full((mask.shape[0],), float(max_completion_length), device=mask.device)
    raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {mode!r}")


def aggregate(counted: torch.Tensor, ctx: StepContext, metrics: dict[str, float] | None = None, *,
              trained: torch.Tensor | None = None, mode: str | None = None) -> TokenWeights:
    """The run's loss aggregation (``ctx.aggregation``, or ``mode``) over the tokens of ``counted`` (B, T): their
    weights, the denominator and its per-rollout parts, as the ``TokenWeights`` a method returns.

    ``trained`` (B, T), 0/1: only these tokens keep their weight; the denominator still counts every token of
    ``counted`` (a selection whose loss is averaged over all tokens: ``aggregate(mask, ctx, trained=selected)``).
    """
    mode = mode or ctx.aggregation
    weights, denominator = aggregation_weights(counted, mode, ctx.max_completion_length)
    if trained is not None:
        weights = weights * trained
    return TokenWeights(weights, denominator, dict(metrics or {}),
                        row_denominators=aggregation_row_denominators(counted, mode, ctx.max_completion_length))


def check_needs(owner: str, needs) -> frozenset[str]:
    """``needs`` as a frozenset, or a ValueError naming ``owner``, the unknown names and the allowed ones (a typo
    would otherwise leave the statistic uncomputed and the method reading None)."""
    if isinstance(needs, str):  # frozenset("entropy") would be a set of letters
        raise ValueError(f"{owner}: needs must be a set of statistic names, got the string {needs!r}")
    needs = frozenset(needs)
    unknown = sorted(needs - set(STATISTICS))
    if unknown:
        raise ValueError(f"{owner}: needs names unknown statistic(s) {unknown}; allowed: {list(STATISTICS)}")
    return needs


class Method:
    """The uniform baseline: every completion token, weight 1, the baseline's aggregation.

    Subclasses set ``name``, ``needs`` and a ``Config`` dataclass whose defaults are the paper's, and override hooks.
    ``needs`` is checked against STATISTICS when the class is registered (``methods.registry.register_method``) and
    when an instance sets its own (GMTS picks its statistic from its config).
    """

    name: ClassVar[str] = "uniform"
    needs: ClassVar[frozenset[str]] = frozenset()

    @dataclass
    class Config:
        pass

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    def needs_at(self, ctx: StepContext) -> frozenset[str]:
        """The statistics ``token_weights`` reads under this step's settings: ``needs``, plus any a setting adds
        (GMTS reads ``ref_logp`` whenever beta > 0). The trainer computes these before the weights."""
        return frozenset(self.needs)

    def loss_positions(self, batch: RolloutBatch, ctx: StepContext) -> torch.Tensor | None:
        """(B, T) bool, known before the token statistics: the only positions where ``token_weights`` (and its KL
        weights) can be nonzero; the trainer then runs the LM head only there, and the statistics are 0 elsewhere.
        None (default): every position. ``batch`` is the prepared batch (after ``before_forward``)."""
        return None

    def __setattr__(self, attribute: str, value: Any) -> None:
        if attribute == "needs":
            value = check_needs(f"method {self.name!r} ({type(self).__qualname__})", value)
        super().__setattr__(attribute, value)

    def on_rollouts(self, batch: RolloutBatch, ctx: StepContext) -> RolloutBatch:
        return batch

    def before_forward(self, batch: RolloutBatch, ctx: StepContext) -> RolloutBatch:
        return batch

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        return aggregate(batch.completion_mask, ctx)

    # Deviations from the paper, listed by each method; shown in reports beside its results.
    deviations: ClassVar[tuple[str, ...]] = ()
