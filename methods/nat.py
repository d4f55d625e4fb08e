"""NAT: Not All Tokens Are Needed (Sang, Xu, Zhou, He, Wang; arXiv 2603.06619, Feb 2026).

Sources: the abstract and a design-review note citing the paper's v1 Sec. 3-4 (docs/methods.md "NAT"). No official code
was found, so the tests check the estimator's defining property (Monte Carlo unbiasedness) instead of a golden file.

Horvitz-Thompson partial-token policy gradient: draw a token mask m independent of theta with inclusion
probabilities pi_{i,t} = P(m_{i,t} = 1) > 0 and keep the FULL-sequence denominator:

    L_hat = (1 / D) sum_{i,t} (m_{i,t} / pi_{i,t}) w_{i,t} l_{i,t},   E_m[L_hat] = L = (1 / D) sum_{i,t} w_{i,t} l_{i,t}

where (w, D) is the baseline aggregation (train.aggregation) of the ORIGINAL completion mask and l the clipped
surrogate; E_m[grad L_hat] = grad L because m / pi is a constant of theta. With train.beta > 0 the KL term gets the
same weights, beta (1 / D) sum (m / pi) w kl, so it too is unbiased for the full-token KL term (a token outside the
sample has no logits when the forward stops at the cut). Two schemes:

    RPC (random prefix cutting, default): c_i ~ Uniform{1..|o_i|},  m_{i,t} = [t <= c_i],
                                          pi_{i,t} = P(c_i >= t) = (|o_i| - t + 1) / |o_i|  >= 1 / |o_i| > 0
    URS (uniform random sampling):        m_{i,t} ~ Bernoulli(q),    pi_{i,t} = q

RPC keeps a prefix, so ``before_forward`` zeroes ``completion_mask`` past each cut: causal attention makes the
logits at t <= c_i depend only on prompt + y[:c_i], so the kept tokens' log-probs equal those of the full forward
(tested with a tiny Llama). The saving: about half the completion tokens per row, (|o| + 1) / (2 |o|) kept on
average. Padding would hide it: ``prepare_batch`` cuts only the columns past the longest kept prefix of the
whole batch, and E[max_i c_i] / |o| = B / (B + 1) for B rows of one length. The harness trainer therefore sorts
rows by kept length and runs the forward in row chunks (``train.forward_chunk_rows``), each packed without padding
(``train.padding_free``), so the per-row saving is real and counted in the FLOPs budget. Metric ``forward_length_frac``
reports the whole-batch padded shrink. URS cannot shorten
sequences: a kept token needs every earlier position in the forward, so URS leaves ``completion_mask`` (which may
also serve as the attention mask) untouched. Its saving is the LM head: ``loss_positions`` gives the sampled tokens
before the statistics, and the trainer computes logits (and logp, entropy) only there, about q of the completion
positions (tested: same loss and gradient as the head at every position; the FLOPs ledger counts the logits
computed). By the ledger's FLOP model the head is 2 N_head of a position's 2 (N_body + N_head) matmul FLOPs, so the
saving is (1 - q) times that share of the completion positions' forward + backward: small unless the vocabulary
is large relative to the body (V x d_model against the layers' weights).

Deviations and assumptions (also in ``NAT.deviations``): the cut distribution Uniform{1..|o|} and the URS variant
(independent Bernoulli rather than a fixed count) are derived, not read from the paper; q = 0.5 ("as few as 50 %
of tokens"); positions t are counted over real tokens (cumsum of the mask), so a mask with holes still works.
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
    aggregation_row_denominators,
    aggregation_weights,
)
from methods.declaration import check_declared, setting
from methods.registry import register_method

SCHEMES = ("rpc", "urs")


def random_prefix_cut(mask: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """RPC: (m, pi), each (B, T), for c_i ~ Uniform{1..|o_i|}; pi = 1 off the mask (where m = 0)."""
    mask = mask.to(torch.float32)
    lengths = mask.sum(dim=1)  # |o_i|
    position = torch.cumsum(mask, dim=1)  # t = 1..|o_i| on real tokens
    uniform = torch.rand(mask.shape[0], generator=generator, dtype=torch.float64).to(mask.device)
    cut = torch.minimum(torch.floor(uniform * lengths) + 1, lengths.clamp(min=1))  # c_i ~ Uniform{1..|o_i|}
    sample = mask * (position <= cut[:, None]).float()  # m_{i,t} = [t <= c_i]
    # pi_{i,t} = P(c_i >= t) = (|o_i| - t + 1) / |o_i|
    inclusion = torch.where(mask > 0, (lengths[:, None] - position + 1) / lengths[:, None].clamp(min=1), 1.0)
    return sample, inclusion


def uniform_random_sample(mask: torch.Tensor, q: float,
                          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """URS: (m, pi), each (B, T), for m_{i,t} ~ Bernoulli(q); pi = q on the mask, 1 off it."""
    mask = mask.to(torch.float32)
    draw = torch.rand(mask.shape, generator=generator).to(mask.device)
    sample = mask * (draw < q).float()
    inclusion = torch.where(mask > 0, torch.full_like(mask, q), 1.0)
    return sample, inclusion


@register_method("nat")
class NAT(Method):
    """Horvitz-Thompson weights m / pi over a random token subset, full-sequence denominator.

    before_forward draws (m, pi) from ``ctx.generator()`` (seeded by run seed, step and process: each process of a
    distributed run draws its own masks) and stores in ``batch.extras`` (all row-indexed):
    nat_sample (B, T) m, nat_inclusion (B, T) pi, nat_base_weights (B, T) w and nat_base_row_denominators (B,)
    each row's part of D of the untruncated mask, nat_lengths (B,) |o_i|. token_weights sees the truncated batch
    (or one mini-batch of its rows) and returns weights = m / pi * w, denominator = D = the sum of its rows' parts.
    """

    needs = frozenset()
    deviations = (
        "RPC cut distribution c ~ Uniform{1..|o|} is derived, not confirmed from the paper (no floor/cap on 1/pi)",
        "URS draws independent Bernoulli(q) per token (not a fixed count without replacement); q = 0.5 assumed",
        "URS cannot shorten the forward pass: it saves only the LM head (logits at the sampled tokens only)",
        "no official code: unbiasedness is tested by Monte Carlo, no golden test",
    )

    @dataclass
    class Config:
        scheme: str = setting(
            "rpc", 'Token sampling scheme. "rpc": random prefix cutting, c ~ Uniform{1..|o|}, sequences truncated '
            'before the forward pass; "urs": uniform random sampling, Bernoulli(q) per token, no truncation.',
            choices=SCHEMES)
        q: float = setting(
            0.5, 'URS inclusion probability per token (the paper\'s "as few as 50 % of tokens"); ignored by RPC.',
            low=0.0, low_open=True, high=1.0)

        def __post_init__(self):
            check_declared(self, "method.")

    def before_forward(self, batch: RolloutBatch, ctx: StepContext) -> RolloutBatch:
        mask = batch.completion_mask  # (B, T), the original completion
        # (w, D) of the full loss, fixed now: token_weights only sees the truncated batch
        base_weights, _ = aggregation_weights(mask, ctx.aggregation, ctx.max_completion_length)
        if self.config.scheme == "rpc":
            sample, inclusion = random_prefix_cut(mask, ctx.generator())
            completion_mask = mask * sample  # 0 past the cut: prepare_batch drops columns past max_i c_i
        else:
            sample, inclusion = uniform_random_sample(mask, self.config.q, ctx.generator())
            completion_mask = mask  # every position up to the last kept token must be forwarded anyway
        extras = {
            **batch.extras,
            "nat_sample": sample,
            "nat_inclusion": inclusion,
            "nat_base_weights": base_weights,
            "nat_base_row_denominators": aggregation_row_denominators(mask, ctx.aggregation,
                                                                      ctx.max_completion_length),
            "nat_lengths": mask.sum(dim=1),
        }
        return batch.replace(completion_mask=completion_mask, extras=extras)

    def loss_positions(self, batch: RolloutBatch, ctx: StepContext) -> torch.Tensor | None:
        """URS: the sampled tokens, the only ones with a nonzero weight m / pi (KL weights included): the trainer
        runs the LM head only there. RPC: None, its forward already stops at each cut (every kept token is sampled)."""
        if self.config.scheme == "urs":
            return batch.extras["nat_sample"] > 0
        return None

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        if "nat_inclusion" not in batch.extras:
            raise ValueError("method 'nat' found no nat_* extras: run before_forward first "
                             "(harness.train.hooks.prepare_batch does)")
        sample = batch.extras["nat_sample"]  # (B, T') after truncation
        inclusion = batch.extras["nat_inclusion"]
        # L_hat = (1 / D) sum (m / pi) w l, (w, D) of the untruncated completion
        horvitz_thompson = sample / inclusion
        weights = horvitz_thompson * batch.extras["nat_base_weights"]
        # D of the untruncated rows present: a sum over rows, so a mini-batch (train.mini_batches) divides by its own
        # rows' part, as the baseline's aggregation of that mini-batch does
        parts = batch.extras["nat_base_row_denominators"]
        denominator = parts.sum().clamp(min=1.0)
        lengths = batch.extras["nat_lengths"]  # (B,) |o_i| before truncation
        longest = float(lengths.max()) if lengths.numel() else 0.0
        metrics = {
            "tokens_kept_frac": float(sample.sum()) / max(float(lengths.sum()), 1.0),
            "ht_weight_max": float(horvitz_thompson.max()) if horvitz_thompson.numel() else 0.0,
            # padded completion columns forwarded / longest completion: the saving without padding-free packing
            "forward_length_frac": sample.shape[1] / max(longest, 1.0),
        }
        # the KL term (train.beta > 0) by the same HT weights: E_m[sum (m / pi) w kl / D] = sum w kl / D, the
        # full-token KL term (the baseline's kl weights over the cut mask would drop the late tokens' KL)
        return TokenWeights(weights, denominator, metrics, kl_weights=weights, kl_denominator=denominator,
                            row_denominators=parts, kl_row_denominators=parts)
