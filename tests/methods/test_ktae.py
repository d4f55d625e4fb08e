"""KTAE: exact Fisher p (= scipy), IG in bits, key range, degenerate groups, special ids, a hand-computed key."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate
from scipy.stats import fisher_exact

from harness.train.hooks import new_rollout_batch, run_hooks
from methods.base import StepContext, TokenStats
from methods.ktae import KTAE, TF_EPS, fisher_exact_two_sided, fisher_term_table, information_gain_bits
from methods.uniform import Uniform

CTX = StepContext(clip_eps_low=0.2, clip_eps_high=0.28)


def hand_batch(special_token_ids=()):
    """One group of 4: rewards 1, 1, 0, 0; token 3 in rows 0, 1, 3 (3 times in C, once in W), 4 in rows 0, 2,
    5 in rows 2, 3 (only W). Row 4 is another group, all correct."""
    ids = torch.tensor([[3, 4], [3, 3], [4, 5], [3, 5], [3, 9]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    return new_rollout_batch(ids, torch.ones(5, 2), rewards, torch.tensor([0, 0, 0, 0, 1]), "group",
                             special_token_ids)


# By hand, group 0 (|C| = |W| = 2, L_C = L_W = avgL = 4, so k1 (1 - b + b L/avgL) = 2):
# token 3: a=2 b=1 c=0 d=1. Fisher support k in {1, 2}, weights C(2,k) C(2,3-k) = 2, 2 -> p = 4/4 = 1 -> F = 0.
#   IG = 1 - (3/4) h(2/3) = 0.31127812445913283 bits. x = asin 1 - asin sqrt(1/2) = pi/4;
#   tf_C = (3/4) 3 / (3/4 + 2) = 9/11, tf_W = (1/4) 3 / (1/4 + 2) = 1/3; x += (9/11)/(1/3 + 1e-5) - (1/3)/(9/11 + 1e-5)
#   -> x = 2.8324675557438934, score = IG x / 2 = 0.4408425941716517, key = 2 (sigmoid(score) - 1/2):
KEY_3 = 0.21691957149271301
# token 4: a=1 b=1 c=1 d=1: p = 1, IG = 0 -> key 0.
# token 5: a=0 b=2: p = 1/3, IG = 1, x = -pi/2 - 0.6/1e-5 -> score ~ -45000 -> key = -1 (saturated, official).
ROLLOUT_A = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # (R - 0.5) / (std_unbiased + 1e-6)
SINGLE_A = 1.0 / (1.0 + 1e-6)  # a group of one rollout: mean 0, std 1 (verl)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 16), st.integers(0, 16), st.integers(0, 16), st.integers(0, 16))
def test_fisher_p_equals_scipy_two_sided(a, b, c, d):
    expected = fisher_exact([[a, b], [c, d]], alternative="two-sided").pvalue
    assert float(fisher_exact_two_sided(a, b, c, d)) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_fisher_p_one_is_exact():
    assert fisher_exact_two_sided(2, 1, 0, 1) == 1  # token 3 above
    assert fisher_exact_two_sided(1, 1, 1, 1) == 1
    assert fisher_exact_two_sided(3, 0, 0, 0) == 1  # zero column
    assert fisher_exact_two_sided(0, 2, 2, 0) == pytest.approx(1 / 3)
    assert fisher_exact_two_sided(2, 5, 6, 1) < 1  # float32 lgamma misses a tie here (official 0.054, exact 0.103)
    assert float(fisher_exact_two_sided(2, 5, 6, 1)) == pytest.approx(0.10256410256410256, rel=1e-12)


def test_information_gain_in_bits():
    ig = information_gain_bits(*(torch.tensor([v]) for v in (2, 0, 0, 2)))
    assert float(ig) == pytest.approx(1.0)  # a token that splits the group perfectly carries H(Y) = 1 bit
    ig = information_gain_bits(*(torch.tensor([v]) for v in (1, 0, 1, 2)))
    assert float(ig) == pytest.approx(1 - 0.75 * (math.log2(3) - 2 / 3))  # 1 - 3/4 h(1/3) = 0.3112781
    ig = information_gain_bits(*(torch.tensor([v]) for v in (1, 1, 1, 1)))
    assert float(ig) == pytest.approx(0.0, abs=1e-15)


def test_hand_computed_keys():
    batch = KTAE().on_rollouts(hand_batch(), CTX)
    A = ROLLOUT_A
    expected = torch.tensor([[A + KEY_3, A + 0.0], [A + KEY_3, A + KEY_3], [-A + 0.0, -A - 1.0],
                             [-A + KEY_3, -A - 1.0], [SINGLE_A, SINGLE_A]])
    assert torch.allclose(batch.advantages, expected, atol=1e-6)
    # gamma = 0 switches the frequency term off: x = pi/4, key = 2 (sigmoid(IG pi/8) - 1/2)
    no_tf = KTAE(KTAE.Config(gamma=0.0)).on_rollouts(hand_batch(), CTX)
    assert float(no_tf.advantages[1, 0]) == pytest.approx(A + 0.06104332518064415, abs=1e-6)


def test_degenerate_groups_get_key_zero():
    ids = torch.tensor([[5, 6, 7], [5, 8, 8], [9, 9, 9], [1, 2, 3]])
    for rewards in ([1.0, 0.5, 1.0, 2.0], [0.0, -1.0, 0.0, 0.0]):  # all correct (R > 0); all wrong (R <= 0)
        batch = new_rollout_batch(ids, torch.ones(4, 3), torch.tensor(rewards), torch.zeros(4, dtype=torch.long),
                                  "group")
        assert torch.equal(KTAE().on_rollouts(batch, CTX).advantages, batch.advantages)


def test_special_tokens_get_key_zero():
    batch = KTAE().on_rollouts(hand_batch(special_token_ids=(5, 151643)), CTX)
    assert float(batch.advantages[2, 1]) == pytest.approx(-ROLLOUT_A)  # token 5: key 0 instead of -1
    assert float(batch.advantages[0, 0]) == pytest.approx(ROLLOUT_A + KEY_3)  # others unchanged


def test_padding_does_not_enter_the_tables_but_empty_rollouts_count():
    ids = torch.tensor([[3, 4, 5], [3, 3, 7], [4, 5, 7], [3, 5, 7]])
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]])  # same real tokens as the hand group
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    batch = new_rollout_batch(ids, mask, rewards, torch.zeros(4, dtype=torch.long), "group")
    out = KTAE().on_rollouts(batch, CTX)
    assert float(out.advantages[0, 0]) == pytest.approx(ROLLOUT_A + KEY_3, abs=1e-6)
    assert torch.equal(out.advantages[:, 2], torch.zeros(4))
    # a fifth, correct rollout with no completion token: |C| = 3, so token 3 has a = 2 of 3 (not 2 of 2)
    ids5 = torch.cat([ids, torch.tensor([[3, 3, 3]])])
    mask5 = torch.cat([mask, torch.zeros(1, 3)])
    batch5 = new_rollout_batch(ids5, mask5, torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0]), torch.zeros(5, dtype=torch.long),
                               "group")
    key3 = float(KTAE().on_rollouts(batch5, CTX).advantages[0, 0] - batch5.rollout_advantages[0])
    assert key3 != pytest.approx(KEY_3, abs=1e-3)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), group_size=st.integers(2, 16), length=st.integers(1, 12))
def test_key_lies_in_the_open_interval(seed, group_size, length):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 8, (group_size, length), generator=g)
    mask = (torch.rand(group_size, length, generator=g) > 0.2).float()
    rewards = (torch.rand(group_size, generator=g) > 0.5).float()
    batch = new_rollout_batch(ids, mask, rewards, torch.zeros(group_size, dtype=torch.long), "group")
    # without the frequency term |score| <= pi/2, so |key| <= 2 sigmoid(pi/2) - 1 < 1; with it keys may saturate
    key = KTAE(KTAE.Config(gamma=0.0, top=1.0)).on_rollouts(batch, CTX).advantages - batch.advantages
    assert float(key.abs().max()) <= 2 / (1 + math.exp(-math.pi / 2)) - 1 + 1e-6
    key = KTAE(KTAE.Config(top=0.5)).on_rollouts(batch, CTX).advantages - batch.advantages
    assert bool(torch.isfinite(key).all()) and float(key.abs().max()) <= 0.5 + 1e-6
    assert bool((key[mask == 0] == 0).all())


def reference_keys(method: KTAE, batch) -> torch.Tensor:
    """The group-by-group computation KTAE ran before its statistics were batched over groups (one group's
    vocabulary, counts and terms at a time, BM25 lengths as Python numbers): the formula the batched path keeps."""
    cfg = method.config
    mask = batch.completion_mask > 0
    keys = torch.zeros(mask.shape, dtype=torch.float64)
    for gid in torch.unique(batch.group_ids):
        group = torch.nonzero(batch.group_ids == gid).flatten()
        ids, m, correct = batch.completion_ids[group], mask[group], batch.rewards[group] > 0
        n_correct, n_wrong = int(correct.sum()), int((~correct).sum())
        if n_correct == 0 or n_wrong == 0 or not bool(m.any()):
            continue
        rows = torch.arange(len(group))[:, None].expand_as(m)[m]
        vocab, token_index = torch.unique(ids[m], return_inverse=True)
        present = torch.zeros(len(group), vocab.numel(), dtype=torch.bool)
        present[rows, token_index] = True
        a, b = present[correct].sum(0), present[~correct].sum(0)
        f_term = fisher_term_table(n_correct, n_wrong)[a, b]
        ig = information_gain_bits(a, b, n_correct - a, n_wrong - b)
        x = torch.asin(torch.sqrt(a.double() / n_correct)) - torch.asin(torch.sqrt(b.double() / n_wrong))
        if cfg.gamma:
            token_correct = correct[rows]
            length_c, length_w = int(token_correct.sum()), int((~token_correct).sum())
            average = (length_c + length_w) / 2

            def tf(count, length, average=average):
                frequency = count.double() / length if length > 0 else torch.zeros_like(count, dtype=torch.float64)
                return frequency * (cfg.bm25_k1 + 1) / (frequency + cfg.bm25_k1 * (
                    1 - cfg.bm25_b + cfg.bm25_b * length / average))

            tf_c = tf(torch.bincount(token_index[token_correct], minlength=vocab.numel()), length_c)
            tf_w = tf(torch.bincount(token_index[~token_correct], minlength=vocab.numel()), length_w)
            x = x + tf_c / (tf_w + TF_EPS) - tf_w / (tf_c + TF_EPS)
        key = 2 * cfg.top * (torch.sigmoid((cfg.alpha * f_term + cfg.beta * ig) * x / (cfg.alpha + cfg.beta)) - 0.5)
        if batch.special_token_ids:
            key = torch.where(torch.isin(vocab, torch.tensor(batch.special_token_ids)), torch.zeros_like(key), key)
        keys[group[:, None].expand_as(m)[m], torch.nonzero(m)[:, 1]] = key[token_index]
    return keys


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), sizes=st.lists(st.integers(1, 16), min_size=1, max_size=6),
       length=st.integers(1, 12), vocab=st.integers(2, 30), gamma=st.sampled_from([0.0, 1.0]),
       top=st.sampled_from([1.0, 0.3]))
def test_batched_keys_equal_the_group_by_group_formula(seed, sizes, length, vocab, gamma, top):
    """Groups of mixed sizes, interleaved and with arbitrary ids, some all-correct or all-wrong, empty rollouts,
    padding and special ids: every key equals the group-by-group computation."""
    g = torch.Generator().manual_seed(seed)
    group_ids = torch.cat([torch.full((n,), 7 * i + 3) for i, n in enumerate(sizes)])
    group_ids = group_ids[torch.randperm(len(group_ids), generator=g)]
    n = len(group_ids)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    mask = (torch.rand(n, length, generator=g) > 0.3).float()
    mask[torch.rand(n, generator=g) < 0.1] = 0.0
    rewards = (torch.rand(n, generator=g) > 0.5).float() * torch.randint(0, 3, (n,), generator=g).float()
    batch = new_rollout_batch(ids, mask, rewards, group_ids, "group", special_token_ids=(0, vocab + 5))
    method = KTAE(KTAE.Config(gamma=gamma, top=top))
    keys = method.batch_keys(batch.completion_ids, mask > 0, batch.rewards, batch.group_ids, batch.special_token_ids)
    expected = reference_keys(method, batch)
    # equal up to an ulp: torch computes asin/sigmoid of a tensor's SIMD-aligned elements and of its tail with
    # different kernels, so an element's last bit depends on its position in the (groups, vocabulary) grid
    torch.testing.assert_close(keys, expected, rtol=1e-12, atol=1e-15)
    advantages = method.on_rollouts(batch, CTX).advantages
    assert torch.equal(advantages, ((batch.rollout_advantages.double()[:, None] + expected) * mask).float())


def test_run_hooks_gives_rollout_advantage_plus_key_and_uniform_weights():
    def stats_for(prepared):
        return TokenStats(torch.zeros(len(prepared.rows), prepared.length),
                          torch.zeros(len(prepared.rows), prepared.length))

    out = run_hooks(KTAE(), hand_batch(), stats_for, CTX)
    uniform = run_hooks(Uniform(), hand_batch(), stats_for, CTX)
    assert torch.equal(out.weights, uniform.weights) and out.denominator == uniform.denominator
    assert float(out.advantages[1, 1]) == pytest.approx(ROLLOUT_A + KEY_3, abs=1e-6)
    assert torch.equal(out.advantages[4], uniform.advantages[4])  # the all-correct group is untouched
    assert out.metrics["key_saturated_frac"] == pytest.approx(2 / 10)


def test_gradient_matches_the_loss_with_additive_key():
    batch = KTAE().on_rollouts(hand_batch(), CTX)
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1], [-0.3, -0.2], [-1.5, -3.0], [-0.7, -0.4]], requires_grad=True)
    old_logp = logp.detach() + torch.tensor([[0.1, -0.4], [0.0, 0.3], [-0.5, 0.2], [0.1, 0.0], [0.4, -0.1]])
    out = KTAE().token_weights(TokenStats(logp, old_logp), batch, CTX)
    surrogate = clipped_surrogate(logp, old_logp, batch.advantages, CTX.clip_eps_low, CTX.clip_eps_high)
    (trainer_grad,) = torch.autograd.grad((out.weights * surrogate).sum() / out.denominator, logp)
    A = ROLLOUT_A
    advantages = torch.tensor([[A + KEY_3, A], [A + KEY_3, A + KEY_3], [-A, -A - 1], [-A + KEY_3, -A - 1],
                               [SINGLE_A, SINGLE_A]])
    # token-mean over all 10 tokens
    direct = clipped_surrogate(logp, old_logp, advantages, CTX.clip_eps_low, CTX.clip_eps_high).mean()
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(trainer_grad, direct_grad, atol=1e-6)
    assert float(direct_grad.abs().sum()) > 0


@pytest.mark.parametrize("kwargs,message", [
    ({"alpha": -1.0}, "key 'method.alpha': -1.0 is outside the allowed range [0.0, inf)"),
    ({"gamma": math.inf}, "key 'method.gamma': inf is outside the allowed range [0.0, inf)"),
    ({"alpha": 0.0, "beta": 0.0}, "method.alpha + method.beta must be > 0, got 0.0 + 0.0"),
    ({"top": 0.0}, "key 'method.top': 0.0 is outside the allowed range (0.0, inf)"),
    ({"bm25_k1": math.nan}, "key 'method.bm25_k1': nan is outside the allowed range (0.0, inf)"),
    ({"bm25_b": 1.5}, "key 'method.bm25_b': 1.5 is outside the allowed range [0.0, 1.0]"),
])
def test_config_range_checks(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        KTAE.Config(**kwargs)
