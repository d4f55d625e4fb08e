"""KTAE: Key-token Advantage Estimation (Sun et al., arXiv 2505.16826, NeurIPS 2025).

Official code: github.com/xiaolizh1/KTAE (mirror ZNLP/KTAE), spec read at ea9fb77f366216d754e2368653911724e73a7376;
this module was checked against the copy at 45f3e77ab1399f95ee98acabd57a066c4e2cc32c:
verl/workers/actor/compute_key_tokens.py (``ComputeKeyTokens``, ``fisher_exact_test``, ``calculate_ig``,
``compute_tf``, ``compute_Cohen``) and verl/trainer/ppo/core_algos.py ``compute_ktae_outcome_advantage_and_keytokens``.

Model-free statistics per prompt group and vocabulary id v, from rewards alone. C = rollouts with R > 0, W = R <= 0
(every rollout of the group counts, also one with no completion token); if C or W is empty every key is 0.

    a = #C rollouts whose completion contains v,  b = #W containing v,  c = |C| - a,  d = |W| - b   (presence)
    F(v)  = exp(-2 p),  p = two-sided Fisher exact p of [[a, b], [c, d]];  F = 0 when p = 1
    IG(v) = H(Y) - H(Y | v present/absent), in bits, Y = correctness
    x(v)  = asin sqrt(a / |C|) - asin sqrt(b / |W|)                                  (Cohen's h without the 2)
            + gamma != 0:  tf_C / (tf_W + 1e-5) - tf_W / (tf_C + 1e-5)
    tf_X  = f (k1 + 1) / (f + k1 (1 - b_bm + b_bm L_X / avgL)),  f = (#occurrences of v in X) / L_X
            L_X = completion tokens of X,  avgL = (L_C + L_W) / 2,  k1 = 2.0, b_bm = 0.5     (BM25 saturation)
    score = (alpha F + beta IG) x / (alpha + beta)
    key(v) = 2 top (sigmoid(score) - 0.5)  in (-top, top);  key = 0 for special ids
    A_{i,t} = A_i + key(y_{i,t}) on completion tokens                                 (then the unchanged loss)

Defaults alpha = beta = gamma = top = 1: the official effective setting (the run scripts pass beta_ig = 2, but
the advantage function hard-codes 1.0 for all four). The official code uses gamma only as an on/off switch.

p is computed exactly: P(k) = C(|C|, k) C(|W|, a + b - k) / C(n, a + b) with Python integers, and the two-sided p sums
the P(k) <= P(a) compared as exact integers (scipy's two-sided semantics; scipy needs a 1e-14 relative tolerance
only because its pmf is in floats). So "p = 1" is decided exactly: F = 0 iff the observed table is a most likely
table (the code's intent). The official float32 lgamma sum makes p = 1 wobble to 0.99999994 or 1.0000001, which
then gives F = exp(-2) instead of 0 (on most such tables of random small groups), and it can miss exact ties
elsewhere ([[2, 5], [6, 1]]: official 0.054, exact and scipy 0.103). Everything else is computed in float64 and
the key cast to the advantages' dtype (official: float32). A token seen only in C (or only in W) saturates the tf
term and gets key near +-top (exactly +-top in floating point): that is the official behaviour.

Deviations (also in ``KTAE.deviations``): exact p (above) and float64 arithmetic; special ids are the batch's
``special_token_ids`` (training: the tokenizer's EOS and PAD; inspect: the batch's list, default [151643]) instead of
the hard-coded Qwen id 151643; if every rollout of one side has an empty completion the official f = 0/0 gives NaN
keys, here f = 0; a/(a + c + 1e-10) is a/|C| (the 1e-10 vanishes in float32 for |C| >= 1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

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

TF_EPS = 1e-5  # compute_key_tokens.py: tf_C / (tf_W + 1e-5) - tf_W / (tf_C + 1e-5)


def fisher_exact_two_sided(a: int, b: int, c: int, d: int) -> Fraction:
    """Exact two-sided Fisher p of the 2x2 table [[a, b], [c, d]] (scipy.stats.fisher_exact semantics).

    With row1 = a + b, col1 = a + c, n = a + b + c + d, a is hypergeometric: P(k) = C(col1, k) C(n - col1, row1 - k)
    / C(n, row1); p = sum of P(k) over the support with P(k) <= P(a). A zero row or column gives p = 1.
    """
    row1, col1, n = a + b, a + c, a + b + c + d

    def weight(k: int) -> int:  # P(k) C(n, row1), an integer
        return math.comb(col1, k) * math.comb(n - col1, row1 - k)

    observed = weight(a)
    support = range(max(0, row1 + col1 - n), min(row1, col1) + 1)
    return Fraction(sum(w for w in map(weight, support) if w <= observed), math.comb(n, row1))


@functools.cache
def fisher_term_table(n_correct: int, n_wrong: int) -> torch.Tensor:
    """F[a, b] = exp(-2 p) of [[a, b], [|C| - a, |W| - b]] for every a <= |C|, b <= |W|; F = 0 when p = 1 exactly.

    (|C| + 1)(|W| + 1) exact p-values (81 for G = 16), kept per split (|C|, |W|) for the process's lifetime (a
    handful of splits per group size; recomputed per batch they took 3 ms per tiny-preset step).
    Read-only: callers copy.
    """
    table = torch.zeros(n_correct + 1, n_wrong + 1, dtype=torch.float64)
    for a in range(n_correct + 1):
        for b in range(n_wrong + 1):
            p = fisher_exact_two_sided(a, b, n_correct - a, n_wrong - b)
            table[a, b] = 0.0 if p == 1 else math.exp(-2 * float(p))
    return table


def binary_entropy_bits(q: torch.Tensor) -> torch.Tensor:
    """h(q) = -q log2 q - (1 - q) log2 (1 - q), with 0 log 0 = 0."""
    return -(torch.special.xlogy(q, q) + torch.special.xlogy(1 - q, 1 - q)) / math.log(2.0)


def information_gain_bits(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """IG = H(Y) - [(a+b)/n h(a/(a+b)) + (c+d)/n h(c/(c+d))], Y = correctness, X = token present; float64 bits."""
    a, b, c, d = (t.to(torch.float64) for t in (a, b, c, d))
    n = a + b + c + d
    present, absent = a + b, c + d
    h_y = binary_entropy_bits((a + c) / n)
    h_present = torch.where(present > 0, binary_entropy_bits(a / present.clamp(min=1)), torch.zeros_like(a))
    h_absent = torch.where(absent > 0, binary_entropy_bits(c / absent.clamp(min=1)), torch.zeros_like(a))
    return h_y - (present / n * h_present + absent / n * h_absent)


def bm25_tf(count: torch.Tensor, length: torch.Tensor, average_length: torch.Tensor, k1: float,
            b: float) -> torch.Tensor:
    """tf = f (k1 + 1) / (f + k1 (1 - b + b L / avgL)), f = count / L (f = 0 when L = 0; official: NaN).

    count (G, U); length L and average_length avgL (G, 1), one per group."""
    length = length.to(torch.float64)
    frequency = torch.where(length > 0, count.to(torch.float64) / length.clamp(min=1), 0.0)
    saturation = k1 * (1 - b + b * length / average_length)
    return frequency * (k1 + 1) / (frequency + saturation)


@register_method("ktae")
class KTAE(Method):
    """Token advantage = rollout advantage + key(token id), the key from per-group Fisher/IG/direction statistics."""

    needs = frozenset()
    deviations = (
        "Fisher p computed exactly (integer hypergeometric weights, = scipy two-sided); F = 0 iff p = 1 exactly "
        "(official float32: the p = 1 test wobbles and then gives F = exp(-2), and some exact ties are missed)",
        "float64 arithmetic, key cast to the advantages' dtype (official: float32 throughout)",
        "special ids are the batch's special_token_ids (EOS/PAD in training), not the hard-coded Qwen id 151643",
        "a side whose rollouts have no completion token gets tf = 0 (official: 0/0 = NaN keys)",
    )

    @dataclass
    class Config:
        alpha: float = setting(
            1.0, "Weight of the Fisher term F (official effective value 1.0; 0 switches it off).", low=0.0)
        beta: float = setting(
            1.0, "Weight of the information gain IG (official effective 1.0; the run scripts' beta_ig = 2 is "
            "overridden).", low=0.0)
        gamma: float = setting(
            1.0, "Nonzero adds the BM25 frequency term to the direction x (official: an on/off switch, effective "
            "1.0).", low=0.0)
        top: float = setting(1.0, "Key range: key in (-top, top) (official 1.0).", low=0.0, low_open=True)
        bm25_k1: float = setting(
            2.0, "BM25 k1 of the frequency term (hard-coded 2.0 in the official code).", low=0.0, low_open=True)
        bm25_b: float = setting(
            0.5, "BM25 length normalisation b (hard-coded 0.5 in the official code).", low=0.0, high=1.0)

        def __post_init__(self):
            check_declared(self, "method.")
            if not self.alpha + self.beta > 0.0:
                raise ValueError(f"method.alpha + method.beta must be > 0, got {self.alpha!r} + {self.beta!r}")

    def batch_keys(self, completion_ids: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor,
                   group_ids: torch.Tensor, special_token_ids: tuple[int, ...]) -> torch.Tensor:
        """key(y_{i,t}) of every rollout, from its own prompt group's statistics: ids (B, T), mask (B, T) bool,
        rewards (B,), group_ids (B,) -> (B, T) float64.

        All groups at once on a (groups, vocabulary seen in the batch) grid: the per-group formulas are elementwise,
        so each cell holds what a group-by-group computation gives for that group's token (a token absent from a
        group has a cell that is never read). A Python loop over groups took 13 ms per tiny-preset batch (16
        groups x 8), this 2 ms (1 thread, loaded 2-core machine).
        """
        cfg = self.config
        keys = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
        _, group_of_row = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
        n_groups = int(group_of_row.max()) + 1 if group_of_row.numel() else 0
        correct = rewards > 0  # C: R > 0; W: R <= 0
        n_correct = torch.bincount(group_of_row[correct], minlength=n_groups)  # (G,)
        n_wrong = torch.bincount(group_of_row[~correct], minlength=n_groups)
        informative = (n_correct > 0) & (n_wrong > 0)  # a group without C or without W keeps key 0
        tokens = mask & informative[group_of_row][:, None]
        if not bool(tokens.any()):
            return keys
        rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)[tokens]  # (N,)
        token_group = group_of_row[rows]  # (N,)
        vocab, token_index = torch.unique(completion_ids[tokens], return_inverse=True)  # (U,), (N,)
        n_vocab = vocab.numel()
        present = torch.zeros(mask.shape[0], n_vocab, dtype=torch.long, device=mask.device)
        present[rows, token_index] = 1  # presence, not counts
        a = torch.zeros(n_groups, n_vocab, dtype=torch.long, device=mask.device)
        a.index_add_(0, group_of_row[correct], present[correct])  # (G, U)
        b = torch.zeros_like(a).index_add_(0, group_of_row[~correct], present[~correct])
        c, d = n_correct[:, None] - a, n_wrong[:, None] - b
        # F(v) = exp(-2 p), F = 0 when p = 1 exactly: group g reads the table of its split (|C_g|, |W_g|)
        tables = torch.zeros(n_groups, int(n_correct.max()) + 1, int(n_wrong.max()) + 1, dtype=torch.float64)
        for g in torch.nonzero(informative).flatten().tolist():
            split = int(n_correct[g]), int(n_wrong[g])
            tables[g, :split[0] + 1, :split[1] + 1] = fisher_term_table(*split)
        tables = tables.to(mask.device)
        f_term = tables[torch.arange(n_groups, device=mask.device)[:, None], a, b]  # (G, U)
        ig = information_gain_bits(a, b, c, d)
        # x = asin sqrt(a/|C|) - asin sqrt(b/|W|)  (+ tf_C/(tf_W + 1e-5) - tf_W/(tf_C + 1e-5)); the clamps only
        # touch uninformative groups, whose cells are never read
        x = (torch.asin(torch.sqrt(a.double() / n_correct.clamp(min=1)[:, None].double()))
             - torch.asin(torch.sqrt(b.double() / n_wrong.clamp(min=1)[:, None].double())))
        if cfg.gamma:
            token_correct = correct[rows]  # (N,)
            cell = token_group * n_vocab + token_index  # (N,) flat (G, U) index
            length_c = torch.bincount(token_group[token_correct], minlength=n_groups)[:, None]  # (G, 1)
            length_w = torch.bincount(token_group[~token_correct], minlength=n_groups)[:, None]
            average = (length_c + length_w).double() / 2
            count_c = torch.bincount(cell[token_correct], minlength=n_groups * n_vocab).view(n_groups, n_vocab)
            count_w = torch.bincount(cell[~token_correct], minlength=n_groups * n_vocab).view(n_groups, n_vocab)
            tf_c = bm25_tf(count_c, length_c, average, cfg.bm25_k1, cfg.bm25_b)
            tf_w = bm25_tf(count_w, length_w, average, cfg.bm25_k1, cfg.bm25_b)
            x = x + tf_c / (tf_w + TF_EPS) - tf_w / (tf_c + TF_EPS)
        score = (cfg.alpha * f_term + cfg.beta * ig) * x / (cfg.alpha + cfg.beta)
        key = 2 * cfg.top * (torch.sigmoid(score) - 0.5)  # (G, U), in (-top, top)
        if special_token_ids:
            special = torch.tensor(list(special_token_ids), dtype=vocab.dtype, device=vocab.device)
            key = torch.where(torch.isin(vocab, special)[None, :], torch.zeros_like(key), key)
        keys[tokens] = key[token_group, token_index]
        return keys

    def on_rollouts(self, batch: RolloutBatch, ctx: StepContext) -> RolloutBatch:
        mask = batch.completion_mask > 0  # (B, T)
        keys = self.batch_keys(batch.completion_ids, mask, batch.rewards, batch.group_ids, batch.special_token_ids)
        # A_{i,t} = A_i + key(y_{i,t}) on completion tokens
        advantages = (batch.rollout_advantages.to(torch.float64)[:, None] + keys) * mask
        return batch.replace(advantages=advantages.to(batch.advantages.dtype))

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        mask = batch.completion_mask > 0
        key = (batch.advantages.detach() - batch.rollout_advantages[:, None])[mask].abs()  # |key| on real tokens
        metrics = {}
        if key.numel():
            metrics = {"key_abs_mean": float(key.mean()),
                       "key_nonzero_frac": float((key > 1e-6 * self.config.top).float().mean()),
                       "key_saturated_frac": float((key > 0.999 * self.config.top).float().mean())}
        return aggregate(batch.completion_mask, ctx, metrics)
