"""GMTS: trust indicator, per-group ranking, the official count rule, zero scores, denominators, gradient."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate

from harness.train.hooks import new_rollout_batch, run_hooks
from methods.base import RolloutBatch, StepContext, TokenStats
from methods.gmts import GMTS, keep_top_scores, trust_indicator

CTX = StepContext(clip_eps_low=0.2, clip_eps_high=0.28)


def make_batch(mask, rollout_advantages, group_ids):
    """A batch with given rollout advantages (no reward normalisation), broadcast on the completion mask."""
    mask = mask.float()
    B, T = mask.shape
    advantages = torch.as_tensor(rollout_advantages, dtype=torch.float32)
    return RolloutBatch(torch.zeros(B, T, dtype=torch.long), mask, torch.zeros(B), torch.as_tensor(group_ids),
                        advantages, advantages[:, None] * mask, torch.ones(B, dtype=torch.bool))


def stats_of(entropy, logp=None, old_logp=None, ref_logp=None, sum_p2=None):
    logp = torch.zeros_like(entropy) if logp is None else logp
    return TokenStats(logp=logp, old_logp=logp.detach() if old_logp is None else old_logp, entropy=entropy,
                      ref_logp=ref_logp, sum_p2=sum_p2)


def test_trust_indicator_edge_cases():
    ratio = torch.tensor([1.3, 1.3, 0.7, 0.7, 1.27, 0.81, 1.0])
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0])
    # r > 1 + 0.28 with A > 0 and r < 1 - 0.2 with A < 0 are clipped (zero gradient); the other sides are not
    expected = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.equal(trust_indicator(ratio, advantages, 0.2, 0.28), expected)


def test_clipped_tokens_score_zero_and_are_never_kept():
    # one group of 10 tokens: 2 survive the count rule; the two highest-entropy tokens are clipped
    entropy = torch.tensor([[9.0, 8.0, 1.0, 2.0, 3.0], [9.0, 8.0, 4.0, 5.0, 6.0]])
    logp = torch.zeros(2, 5)
    old_logp = torch.zeros(2, 5)
    old_logp[0, :2] = math.log(1 / 1.5)  # r = 1.5 > 1.28 with A > 0 -> trust 0
    old_logp[1, :2] = math.log(1 / 0.5)  # r = 0.5 < 0.8 with A < 0 -> trust 0
    batch = make_batch(torch.ones(2, 5), [1.0, -1.0], [0, 0])
    method = GMTS()
    delta, trust = method.scores(stats_of(entropy, logp, old_logp), batch, CTX)
    assert torch.equal(delta[:, :2], torch.zeros(2, 2))
    assert torch.equal(trust[:, 2:], torch.ones(2, 3))
    out = method.token_weights(stats_of(entropy, logp, old_logp), batch, CTX)
    expected = torch.zeros(2, 5)
    expected[1, 3:] = 1.0  # H |A| = 5 and 6 are the top two among positive scores
    assert torch.equal(out.weights > 0, expected > 0)
    # the opposite sides keep their gradient: r = 1.5 with A < 0, r = 0.5 with A > 0 -> trust 1, scores H |r A|
    flipped = make_batch(torch.ones(2, 5), [-1.0, 1.0], [0, 0])
    delta, _ = method.scores(stats_of(entropy, logp, old_logp), flipped, CTX)
    assert torch.allclose(delta[:, :2], torch.tensor([[9.0 * 1.5, 8.0 * 1.5], [9.0 * 0.5, 8.0 * 0.5]]))


@settings(max_examples=40, deadline=None)
@given(n_tokens=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_official_count_rule(n_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(4, 10)
    mask.view(-1)[torch.randperm(40, generator=g)[:n_tokens]] = 1.0
    entropy = (torch.randperm(40, generator=g).float().view(4, 10) + 1) / 7  # distinct, positive
    batch = make_batch(mask, [1.0, -0.5, 2.0, -1.5], [3, 3, 3, 3])
    out = GMTS().token_weights(stats_of(entropy), batch, CTX)
    kept = n_tokens - max(1, math.ceil(n_tokens * 0.8))  # about floor(0.2 N); 0 for N < 5
    assert int((out.weights > 0).sum()) == kept
    if n_tokens < 5:
        assert kept == 0
    score = entropy * batch.advantages.abs()
    selected, rest = out.weights > 0, (mask > 0) & ~(out.weights > 0)
    if bool(selected.any()) and bool(rest.any()):
        assert float(score[selected].min()) >= float(score[rest].max())  # ties: see the row-major test


def test_ranking_is_per_prompt_group():
    # group 0 has uniformly larger scores; per-group ranking still keeps 1 of 5 tokens in each group
    entropy = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    batch = make_batch(torch.ones(2, 5), [1.0, 1.0], [0, 1])
    out = GMTS().token_weights(stats_of(entropy), batch, CTX)
    assert torch.equal(out.weights > 0, torch.tensor([[False] * 4 + [True], [False] * 4 + [True]]))
    batch_scope = GMTS(GMTS.Config(scope="batch")).token_weights(stats_of(entropy), batch, CTX)
    expected = torch.zeros(2, 5, dtype=torch.bool)
    expected[0, 3:] = True  # 10 tokens: remove 8, keep 13 and 14, both in group 0
    assert torch.equal(batch_scope.weights > 0, expected)


def test_groups_need_not_be_contiguous_rows():
    entropy = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [4.0, 5.0, 6.0], [40.0, 50.0, 60.0]])
    batch = make_batch(torch.ones(4, 3), [1.0, 1.0, 1.0, 1.0], [7, 9, 7, 9])
    out = GMTS().token_weights(stats_of(entropy), batch, CTX)
    expected = torch.zeros(4, 3, dtype=torch.bool)
    expected[2, 2] = expected[3, 2] = True  # 6 tokens per group: remove ceil(4.8) = 5
    assert torch.equal(out.weights > 0, expected)


def test_zero_score_is_never_kept():
    # 10 tokens, 9 with H = 0: the count rule removes 8 zero scores, one zero and the positive token survive
    entropy = torch.zeros(2, 5)
    entropy[0, 0] = 0.3
    batch = make_batch(torch.ones(2, 5), [1.0, -1.0], [0, 0])
    out = GMTS().token_weights(stats_of(entropy), batch, CTX)
    expected = torch.zeros(2, 5, dtype=torch.bool)
    expected[0, 0] = True
    assert torch.equal(out.weights > 0, expected)
    # a group whose advantages are all 0 keeps nothing
    flat = make_batch(torch.ones(2, 5), [0.0, 0.0], [0, 0])
    assert float(GMTS().token_weights(stats_of(torch.ones(2, 5)), flat, CTX).weights.sum()) == 0.0


def test_ties_are_removed_in_row_major_order():
    # equal scores: the stable ascending sort removes earlier rollouts/positions first (Framework1's list sort)
    score = torch.ones(2, 5)
    selected = keep_top_scores(score, torch.ones(2, 5), torch.tensor([0, 0]), 0.8, "group")
    expected = torch.zeros(2, 5, dtype=torch.bool)
    expected[1, 3:] = True
    assert torch.equal(selected, expected)
    # with the group's rows in reverse batch order, the earlier batch row still loses first
    selected = keep_top_scores(score, torch.ones(2, 5), torch.tensor([4, 4]), 0.9, "group")
    assert torch.equal(selected, torch.tensor([[False] * 5, [False] * 4 + [True]]))


@pytest.mark.parametrize("denominator,expected", [("all", 10.0), ("selected", 2.0)])
def test_denominator_switch(denominator, expected):
    entropy = torch.arange(1.0, 11.0).view(2, 5)
    batch = make_batch(torch.ones(2, 5), [1.0, -1.0], [0, 0])
    out = GMTS(GMTS.Config(denominator=denominator)).token_weights(stats_of(entropy), batch, CTX)
    assert float(out.denominator) == expected
    assert torch.equal(out.weights, (entropy > 8).float())


def test_kl_term_enters_the_score_when_beta_positive():
    entropy = torch.tensor([[2.0, 1.0]])
    logp = torch.tensor([[-1.0, -1.0]])
    old_logp = torch.tensor([[-1.5, -1.0]])  # r = e^0.5 > 1.28 on the first token: trust 0
    ref_logp = torch.tensor([[-0.5, -2.0]])
    batch = make_batch(torch.ones(1, 2), [1.0], [0])
    ctx = StepContext(clip_eps_low=0.2, clip_eps_high=0.28, beta=0.1)
    delta, _ = GMTS().scores(stats_of(entropy, logp, old_logp, ref_logp), batch, ctx)
    # omega = r trust A + beta pi_ref / pi_theta - beta
    omega = torch.tensor([0.0 + 0.1 * math.exp(0.5) - 0.1, 1.0 + 0.1 * math.exp(-1.0) - 0.1])
    assert torch.allclose(delta, (entropy * omega.abs()), atol=1e-6)
    without, _ = GMTS().scores(stats_of(entropy, logp, old_logp, ref_logp), batch, CTX)  # beta = 0: no KL term
    assert float(without[0, 0]) == 0.0
    with pytest.raises(ValueError, match="needs stats.ref_logp"):
        GMTS().scores(stats_of(entropy, logp, old_logp), batch, ctx)
    # so the trainer's no-grad pass (train.backward_chunk_rows) computes ref_logp exactly when beta > 0
    assert GMTS().needs_at(ctx) == frozenset({"entropy", "ref_logp"})
    assert GMTS().needs_at(CTX) == GMTS().needs == frozenset({"entropy"})


def test_exact_gradient_score_and_needs():
    assert GMTS().needs == frozenset({"entropy"})
    method = GMTS(GMTS.Config(score="exact_gradient"))
    assert method.needs == frozenset({"sum_p2"})
    logp = torch.log(torch.tensor([[0.5, 0.9]]))
    sum_p2 = torch.tensor([[0.5**2 + 0.5**2, 0.9**2 + 0.1**2]])
    batch = make_batch(torch.ones(1, 2), [2.0], [0])
    delta, _ = method.scores(TokenStats(logp, logp, sum_p2=sum_p2), batch, CTX)
    # ||p - e_y|| = sqrt((1 - p_y)^2 + sum_{j != y} p_j^2) = sqrt(1 - 2 p_y + sum p^2); omega = 2
    expected = 2 * torch.tensor([[math.sqrt(0.5), math.sqrt(0.02)]])
    assert torch.allclose(delta, expected, atol=1e-6)
    with pytest.raises(ValueError, match="needs stats.sum_p2"):
        method.scores(TokenStats(logp, logp), batch, CTX)


def test_fold_aggregation_favours_short_rollouts_under_grpo_aggregation():
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0]])
    entropy = torch.tensor([[3.0] * 8, [1.0] + [0.0] * 7])
    batch = make_batch(mask, [1.0, 1.0], [0, 0])
    ctx = StepContext(clip_eps_low=0.2, clip_eps_high=0.28, aggregation="seq-mean-token-mean")
    raw = GMTS().token_weights(stats_of(entropy), batch, ctx)
    assert not bool(raw.weights[1, 0] > 0)  # H |A| = 1 < 3
    folded = GMTS(GMTS.Config(fold_aggregation=True)).token_weights(stats_of(entropy), batch, ctx)
    assert bool(folded.weights[1, 0] > 0)  # 1 / 1 > 3 / 8: Framework1's A / (G |o_i|)
    assert int((folded.weights > 0).sum()) == 1  # 9 tokens: remove ceil(7.2) = 8


def test_run_hooks_matches_the_count_rule_per_group():
    g = torch.Generator().manual_seed(11)
    mask = torch.tensor([[1.0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    batch = new_rollout_batch(torch.zeros(4, 6, dtype=torch.long), mask, torch.tensor([1.0, 0.0, 1.0, 0.0]),
                              torch.tensor([0, 0, 1, 1]), "group")
    entropy = torch.rand(4, 6, generator=g) + 0.1

    def stats_for(prepared):
        return stats_of(entropy[prepared.rows, :prepared.length])

    out = run_hooks(GMTS(), batch, stats_for, CTX)
    kept = out.weights > 0
    assert int(kept[:2].sum()) == 10 - 8 and int(kept[2:].sum()) == 7 - 6
    assert bool((kept <= (mask > 0)).all())
    assert out.denominator == float(mask.sum())
    assert torch.equal(out.advantages, batch.advantages)  # GMTS never changes advantages


@pytest.mark.parametrize("denominator", ["all", "selected"])
def test_gradient_matches_the_official_loss(denominator):
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    entropy = torch.tensor([[0.5, 2.0, 0.1, 1.0, 0.3], [1.5, 0.2, 0.4, 0.6, 3.0],
                            [0.7, 0.9, 2.5, 9.0, 9.0], [0.3, 0.2, 0.1, 1.2, 0.8]])
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.1, -0.3], [-0.3, -0.2, -1.5, -3.0, -0.4],
                         [-0.7, -0.4, -1.0, -1.0, -1.0], [-1.1, -0.9, -0.6, -0.2, -0.5]], requires_grad=True)
    shift = torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.0], [0.0, 0.1, 0.0, 0.0, 0.0],
                          [0.0, 0.0, 0.05, 0.0, 0.0], [0.0, 0.0, 0.0, 0.1, 0.0]])
    old_logp = logp.detach() - shift
    batch = make_batch(mask, [1.0, -1.0, 0.5, -0.5], [0, 0, 1, 1])
    stats = stats_of(entropy, logp, old_logp)
    out = GMTS(GMTS.Config(denominator=denominator)).token_weights(stats, batch, CTX)
    assert not out.weights.requires_grad
    surrogate = clipped_surrogate(logp, old_logp, batch.advantages, CTX.clip_eps_low, CTX.clip_eps_high)
    (trainer_grad,) = torch.autograd.grad((out.weights * surrogate).sum() / out.denominator, logp, retain_graph=True)
    # delta = H |r A| (no clipping at these ratios). Group 0 (10 tokens) keeps its 2 largest: 3.0 (1,4) and
    # 2.0 (0,1); group 1 (8 tokens) removes ceil(6.4) = 7 and keeps 2.5 * 1.05 * 0.5 (2,2)
    kept = [(1, 4), (0, 1), (2, 2)]
    total = sum(surrogate[i, t] for i, t in kept)
    direct = total / (mask.sum() if denominator == "all" else len(kept))  # official: A zeroed, / all tokens
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(trainer_grad, direct_grad, atol=1e-7)
    assert float(direct_grad.abs().sum()) > 0


@pytest.mark.parametrize("field,value,message", [
    ("remove_fraction", 1.5, "key 'method.remove_fraction': 1.5 is outside the allowed range [0.0, 1.0]"),
    ("scope", "micro", "key 'method.scope': 'micro' is not one of ['group', 'batch']"),
    ("denominator", "tokens", "key 'method.denominator': 'tokens' is not one of ['all', 'selected']"),
    ("score", "norm", "key 'method.score': 'norm' is not one of ['entropy', 'exact_gradient']"),
])
def test_config_range_checks(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GMTS.Config(**{field: value})
