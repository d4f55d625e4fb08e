"""Entropy (80/20): top-k count, ties, denominators, the run_hooks path and the loss gradient."""

import math
import re
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate

from harness.train.hooks import new_rollout_batch, run_hooks
from methods.base import AGGREGATIONS, StepContext, TokenStats
from methods.entropy import Entropy, ets_threshold_mask, official_top_k, quantile, quantile_entropy_mask
from methods.uniform import Uniform


def make_batch(mask: torch.Tensor, group_size: int = 2):
    B, T = mask.shape
    rewards = torch.arange(B, dtype=torch.float32) % 2
    group_ids = torch.arange(B) // group_size
    return new_rollout_batch(torch.zeros(B, T, dtype=torch.long), mask, rewards, group_ids, "group")


def stats_of(logp, entropy, old_logp=None):
    return TokenStats(logp=logp, old_logp=logp.detach() if old_logp is None else old_logp, entropy=entropy)


@settings(max_examples=60, deadline=None)
@given(n_tokens=st.integers(1, 60), rho_percent=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_keeps_exactly_ceil_rho_n_highest(n_tokens, rho_percent, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(6, 12)
    mask.view(-1)[torch.randperm(72, generator=g)[:n_tokens]] = 1.0
    entropy = torch.randperm(72, generator=g).float().view(6, 12) / 10  # distinct values
    rho = rho_percent / 100
    method = Entropy(Entropy.Config(rho=rho))
    out = method.token_weights(stats_of(torch.zeros(6, 12), entropy), make_batch(mask), StepContext())
    selected = out.weights > 0
    k = max(1, math.ceil(Fraction(rho_percent, 100) * n_tokens))  # exact ceil(rho n)
    assert int(selected.sum()) == k
    assert bool((selected <= (mask > 0)).all())
    unselected = (mask > 0) & ~selected
    if bool(unselected.any()):
        assert float(entropy[selected].min()) > float(entropy[unselected].max())
    assert float(out.denominator) == k  # verl: token-mean over the selected tokens
    assert torch.equal(out.weights, selected.float())


def test_official_k_absorbs_float_error():
    # 25 * 0.28 = 7.000000000000001: math.ceil keeps 8, the official int(n rho + 0.9999) keeps ceil(7) = 7
    assert math.ceil(25 * 0.28) == 8
    assert official_top_k(25, 0.28) == 7
    assert official_top_k(10, 0.2) == 2 and official_top_k(11, 0.2) == 3 and official_top_k(1, 0.2) == 1
    assert official_top_k(3, 0.01) == 1  # at least one token


def test_selection_is_over_the_whole_batch_not_per_rollout():
    entropy = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
    mask = torch.ones(2, 5)
    out = Entropy().token_weights(stats_of(torch.zeros(2, 5), entropy), make_batch(mask), StepContext())
    expected = torch.tensor([[1.0, 1.0, 0, 0, 0], [0, 0, 0, 0, 0]])  # k = ceil(0.2 * 10) = 2
    assert torch.equal(out.weights, expected)


def test_padding_is_never_selected():
    entropy = torch.tensor([[1.0, 9.0], [2.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    out = Entropy(Entropy.Config(rho=0.5)).token_weights(stats_of(torch.zeros(2, 2), entropy), make_batch(mask),
                                                          StepContext())
    assert torch.equal(out.weights, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))  # k = ceil(1.5) = 2 of 3 real tokens


def test_empty_batch_selects_nothing():
    out = Entropy().token_weights(stats_of(torch.zeros(2, 3), torch.ones(2, 3)), make_batch(torch.zeros(2, 3)),
                                  StepContext())
    assert float(out.weights.sum()) == 0.0 and float(out.denominator) == 1.0


def test_trl_semantics_keeps_ties_and_keeps_all_token_denominator():
    # 10 tokens, rho = 0.2: threshold = quantile(H, 0.8) = 2.0 falls on a 4-way tie; every tie is kept
    entropy = torch.tensor([[2.0, 2.0, 2.0, 2.0, 1.0], [0.5, 0.5, 0.1, 0.2, 0.3]])
    mask = torch.ones(2, 5)
    method = Entropy(Entropy.Config(semantics="trl"))
    out = method.token_weights(stats_of(torch.zeros(2, 5), entropy), make_batch(mask), StepContext())
    assert torch.equal(out.weights > 0, entropy >= 2.0)
    assert int((out.weights > 0).sum()) == 4  # more than ceil(0.2 * 10) = 2
    assert float(out.denominator) == 10.0  # unchanged: all completion tokens
    verl = Entropy().token_weights(stats_of(torch.zeros(2, 5), entropy), make_batch(mask), StepContext())
    assert int((verl.weights > 0).sum()) == 2 and float(verl.denominator) == 2.0


def test_ets_removes_the_lowest_80_percent_by_threshold_keeps_ties_and_drops_zero_entropy():
    # 10 real tokens, rho = 0.2: r = int(10 * 0.8) = 8; tau = the 8th lowest = 2.0, tied with two more: 3 kept (> 2)
    entropy = torch.tensor([[0.0, 0.1, 0.2, 0.3, 2.0, 9.0], [0.4, 0.5, 0.6, 2.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1.0]])  # the 9.0 is padding
    selected, threshold = ets_threshold_mask(entropy, mask, 0.2)
    assert threshold == 2.0
    assert selected.tolist() == [[False, False, False, False, True, False], [False, False, False, True, True, True]]
    out = Entropy(Entropy.Config(semantics="ets")).token_weights(
        stats_of(torch.zeros(2, 6), entropy), make_batch(mask, group_size=1), StepContext())
    assert torch.equal(out.weights > 0, selected)
    assert float(out.denominator) == 11.0  # every completion token: unselected ones only lose their advantage


def test_ets_never_keeps_a_zero_entropy_token():
    # 5 tokens, r = int(5 * 0.8) = 4: tau = the 4th lowest = 0.0, so H >= tau holds for all; H = 0 is still dropped
    entropy = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.5]])
    selected, threshold = ets_threshold_mask(entropy, torch.ones(1, 5), 0.2)
    assert threshold == 0.0 and selected.tolist() == [[False, False, False, False, True]]


@settings(max_examples=40, deadline=None)
@given(n_tokens=st.integers(1, 40), rho_percent=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_ets_matches_a_loop_restatement_of_framework1(n_tokens, rho_percent, seed):
    # Framework1: threshold = sorted(H)[int(n * selected_percent) - 1]; H < threshold -> 0; kept = H != 0
    g = torch.Generator().manual_seed(seed)
    entropy = torch.round(torch.rand(1, n_tokens, generator=g) * 4) / 4  # quarter steps: many ties and zeros
    rho = rho_percent / 100
    values = sorted(entropy[0].tolist())
    threshold = values[int(n_tokens * (1 - rho)) - 1]
    expected = [h if h >= threshold else 0.0 for h in entropy[0].tolist()]
    selected, _ = ets_threshold_mask(entropy, torch.ones(1, n_tokens), rho)
    assert selected[0].tolist() == [h != 0 for h in expected]


def test_trl_threshold_is_torch_quantile_over_real_tokens():
    g = torch.Generator().manual_seed(3)
    entropy = torch.rand(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    selected, threshold = quantile_entropy_mask(entropy, mask, 0.3)
    expected = torch.quantile(entropy[mask > 0], 0.7)
    assert threshold == pytest.approx(float(expected), abs=0)
    assert torch.equal(selected, (entropy >= expected) & (mask > 0))


def test_quantile_fallback_matches_torch(monkeypatch):
    import methods.entropy as module

    values = torch.rand(1001, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(module, "QUANTILE_MAX_NUMEL", 10)
    for q in (0.0, 0.13, 0.8, 0.95, 1.0):
        assert float(quantile(values, q)) == pytest.approx(float(torch.quantile(values, q)), rel=1e-6)


@pytest.mark.parametrize("semantics,denominator,expected", [
    ("verl", "auto", 2.0), ("verl", "all", 6.0), ("trl", "auto", 6.0), ("trl", "selected", 2.0),
])
def test_denominator_switch(semantics, denominator, expected):
    entropy = torch.tensor([[3.0, 1.0, 0.5], [2.5, 0.1, 0.2]])
    method = Entropy(Entropy.Config(rho=0.3, semantics=semantics, denominator=denominator))
    out = method.token_weights(stats_of(torch.zeros(2, 3), entropy), make_batch(torch.ones(2, 3)), StepContext())
    assert float(out.denominator) == expected
    assert torch.equal(out.weights > 0, entropy >= 2.5)


def test_selected_denominator_under_seq_mean_token_mean():
    # GRPO aggregation over the selected mask: (1/B') sum_i (1/|S_i|) sum_{t in S_i} l
    entropy = torch.tensor([[3.0, 2.0, 0.0, 0.0], [2.5, 0.1, 0.2, 0.3], [0.0, 0.0, 0.0, 0.0]])
    method = Entropy(Entropy.Config(rho=0.25))  # 12 tokens -> k = 3: (0,0), (0,1), (1,0)
    ctx = StepContext(aggregation="seq-mean-token-mean")
    out = method.token_weights(stats_of(torch.zeros(3, 4), entropy), make_batch(torch.ones(3, 4)), ctx)
    expected = torch.zeros(3, 4)
    expected[0, :2] = 0.5
    expected[1, 0] = 1.0
    assert torch.equal(out.weights, expected)
    assert float(out.denominator) == 2.0  # rollouts with a selected token


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("semantics", ["verl", "trl"])
def test_rho_one_equals_uniform_through_run_hooks(aggregation, semantics):
    g = torch.Generator().manual_seed(7)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    entropy = torch.rand(4, 5, generator=g)
    logp = -torch.rand(4, 5, generator=g)
    batch = make_batch(mask)
    ctx = StepContext(aggregation=aggregation, max_completion_length=5)

    def stats_for(prepared):
        rows, length = prepared.rows, prepared.length
        return stats_of(logp[rows, :length], entropy[rows, :length])

    out = run_hooks(Entropy(Entropy.Config(rho=1.0, semantics=semantics)), batch, stats_for, ctx)
    uniform = run_hooks(Uniform(), batch, stats_for, ctx)
    assert torch.equal(out.weights, uniform.weights)
    assert out.denominator == uniform.denominator
    assert torch.equal(out.advantages, uniform.advantages)


@pytest.mark.parametrize("semantics", ["verl", "trl"])
def test_gradient_matches_the_paper_loss(semantics):
    ctx = StepContext(clip_eps_low=0.2, clip_eps_high=0.28)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    entropy = torch.tensor([[0.9, 0.1, 0.5, 2.0], [1.5, 0.3, 0.2, 9.0], [0.05, 1.2, 9.0, 9.0],
                            [0.4, 0.6, 0.7, 0.8]])
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.1], [-0.3, -0.2, -1.5, -3.0], [-0.7, -0.4, -1.0, -1.0],
                         [-1.1, -0.9, -0.6, -0.2]], requires_grad=True)
    old_logp = logp.detach() + torch.tensor([[0.1, -0.4, 0.0, 0.3], [-0.5, 0.2, 0.1, 0.0], [0.4, -0.1, 0.0, 0.0],
                                             [0.0, 0.05, -0.3, 0.2]])
    batch = make_batch(mask)
    out = Entropy(Entropy.Config(semantics=semantics)).token_weights(stats_of(logp, entropy, old_logp), batch, ctx)
    assert not out.weights.requires_grad
    surrogate = clipped_surrogate(logp, old_logp, batch.advantages, ctx.clip_eps_low, ctx.clip_eps_high)
    (trainer_grad,) = torch.autograd.grad((out.weights * surrogate).sum() / out.denominator, logp, retain_graph=True)
    # 13 real tokens, rho = 0.2 -> k = ceil(2.6) = 3: H = 2.0 (0,3), 1.5 (1,0), 1.2 (2,1); TRL's threshold
    # quantile(H, 0.8) lies between 0.9 and 1.2, so it keeps the same three
    top = [(0, 3), (1, 0), (2, 1)]
    terms = torch.stack([surrogate[i, t] for i, t in top])
    direct = terms.mean() if semantics == "verl" else terms.sum() / mask.sum()  # Eq. 6 / TRL's unchanged normaliser
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(trainer_grad, direct_grad, atol=1e-7)
    assert float(direct_grad.abs().sum()) > 0


@pytest.mark.parametrize("field,value,message", [
    ("rho", 1.5, "key 'method.rho': 1.5 is outside the allowed range (0.0, 1.0]"),
    ("rho", 0.0, "key 'method.rho': 0.0 is outside the allowed range (0.0, 1.0]"),
    ("rho", math.nan, "key 'method.rho': nan is outside the allowed range (0.0, 1.0]"),
    ("semantics", "openrlhf", "key 'method.semantics': 'openrlhf' is not one of ['verl', 'trl', 'ets']"),
    ("denominator", "tokens", "key 'method.denominator': 'tokens' is not one of ['auto', 'selected', 'all']"),
])
def test_config_range_checks(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Entropy.Config(**{field: value})


def test_missing_entropy_fails_loudly():
    with pytest.raises(ValueError, match="needs stats.entropy"):
        Entropy().token_weights(TokenStats(torch.zeros(1, 2), torch.zeros(1, 2)), make_batch(torch.ones(2, 2)),
                                StepContext())
