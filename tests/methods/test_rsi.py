"""RSI: the selected tokens are exactly those with surprisal / entropy in the band; H = 0; denominators; gradient."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate

from harness.train.hooks import new_rollout_batch, run_hooks
from methods.base import AGGREGATIONS, StepContext, TokenStats
from methods.rsi import RSI, relative_surprisal_index
from methods.uniform import Uniform

CTX = StepContext(clip_eps_low=0.2, clip_eps_high=0.28)


def make_batch(mask):
    B, T = mask.shape
    rewards = torch.arange(B, dtype=torch.float32) % 2
    return new_rollout_batch(torch.zeros(B, T, dtype=torch.long), mask, rewards, torch.arange(B) // 2, "group")


@pytest.mark.parametrize("seed", range(5))
def test_rsi_is_the_local_ratio_of_gradient_norm_and_entropy_variations(seed):
    # docs/methods.md "RSI" (derived): under a perturbation of the selected logit,
    # d ln||p - e_y|| / d ln H = 1/(1 - RSI)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(7, generator=g, dtype=torch.float64) * 2
    y = int(torch.randint(0, 7, (1,), generator=g))

    def log_norm_and_log_entropy(delta):
        z = logits.clone()
        z[y] += delta
        p = torch.softmax(z, 0)
        return torch.log(torch.linalg.vector_norm(p - torch.nn.functional.one_hot(torch.tensor(y), 7))), \
            torch.log(-(p * torch.log(p)).sum())

    h = 1e-6
    (n1, e1), (n0, e0) = log_norm_and_log_entropy(h), log_norm_and_log_entropy(-h)
    p = torch.softmax(logits, 0)
    rsi = relative_surprisal_index(torch.log(p[y]).view(1, 1), -(p * torch.log(p)).sum().view(1, 1))
    assert float((n1 - n0) / (e1 - e0)) == pytest.approx(float(1 / (1 - rsi)), rel=1e-5)


def test_hand_cases_and_inclusive_band_ends():
    # RSI = -logp / H: 1.0, 3.0, 0.25, 0.5 (kept: lower end), 2.0 (kept: upper end), 0.4, 1.9
    logp = torch.tensor([[-1.0, -3.0, -0.25, -0.5, -2.0, -0.4, -1.9]])
    entropy = torch.ones(1, 7)
    out = RSI().token_weights(TokenStats(logp, logp, entropy=entropy), make_batch(torch.ones(1, 7)), CTX)
    assert torch.equal(out.weights > 0, torch.tensor([[True, False, False, True, True, False, True]]))
    assert float(out.denominator) == 7.0  # default "all": the baseline's denominator


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 12.0), st.floats(0.0, 5.0), st.booleans()), min_size=1, max_size=24),
       st.floats(0.0, 3.0), st.floats(0.0, 3.0))
def test_selected_tokens_are_exactly_those_in_the_band(tokens, low, width):
    surprisal = torch.tensor([[s for s, _, _ in tokens]])
    entropy = torch.tensor([[h for _, h, _ in tokens]])
    mask = torch.tensor([[float(m) for _, _, m in tokens]])
    logp = -surprisal
    method = RSI(RSI.Config(low=low, high=low + width))
    out = method.token_weights(TokenStats(logp, logp, entropy=entropy), make_batch(mask), CTX)
    for t, (s, h, m) in enumerate(tokens):
        s32, h32 = (float(torch.tensor(v, dtype=torch.float32)) for v in (s, h))  # the stats are float32
        ratio = s32 / h32 if h32 > 0 else None
        inside = m and ratio is not None and low <= ratio <= low + width
        assert bool(out.weights[0, t] > 0) == inside, (s, h, m, ratio)


def test_zero_entropy_is_never_kept():
    logp = torch.tensor([[0.0, -1.0, 0.0]])
    entropy = torch.tensor([[0.0, 0.0, 1e-3]])  # 0/0, 1/0 undefined; 0/1e-3 = 0 is below the band
    method = RSI(RSI.Config(low=0.0, high=math.inf))
    out = method.token_weights(TokenStats(logp, logp, entropy=entropy), make_batch(torch.ones(1, 3)), CTX)
    assert torch.equal(out.weights > 0, torch.tensor([[False, False, True]]))
    assert out.metrics["rsi_undefined_frac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("denominator,expected", [("all", 6.0), ("selected", 2.0)])
def test_denominator_switch(denominator, expected):
    logp = torch.tensor([[-1.0, -5.0, -0.1], [-1.5, -9.0, -0.05]])
    out = RSI(RSI.Config(denominator=denominator)).token_weights(
        TokenStats(logp, logp, entropy=torch.ones(2, 3)), make_batch(torch.ones(2, 3)), CTX)
    assert float(out.denominator) == expected
    assert torch.equal(out.weights, torch.tensor([[1.0, 0, 0], [1, 0, 0]]))


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_unbounded_band_equals_uniform_through_run_hooks(aggregation):
    g = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    entropy = torch.rand(4, 4, generator=g) + 0.01
    logp = -torch.rand(4, 4, generator=g)
    ctx = StepContext(aggregation=aggregation, max_completion_length=4)

    def stats_for(prepared):
        rows, length = prepared.rows, prepared.length
        return TokenStats(logp[rows, :length], logp[rows, :length], entropy=entropy[rows, :length])

    out = run_hooks(RSI(RSI.Config(low=0.0, high=None)), make_batch(mask), stats_for, ctx)
    uniform = run_hooks(Uniform(), make_batch(mask), stats_for, ctx)
    assert torch.equal(out.weights, uniform.weights) and out.denominator == uniform.denominator
    assert out.metrics["rsi_above_frac"] == 0.0


def test_a_config_file_says_no_upper_end_with_null(tmp_path):
    """A config file cannot hold infinity (every number must be finite): `high: null` is the unbounded band."""
    from harness.config.loading import load_method

    (tmp_path / "rsi-open.yaml").write_text("method: rsi\nlow: 0.5\nhigh: null\n")
    spec = load_method("rsi-open", search_dirs=[str(tmp_path)])
    assert spec.params.high is None
    logp = torch.tensor([[-0.4, -1.0, -50.0]])
    out = RSI(spec.params).token_weights(TokenStats(logp, logp, entropy=torch.ones(1, 3)), make_batch(torch.ones(1, 3)),
                                         CTX)
    assert torch.equal(out.weights > 0, torch.tensor([[False, True, True]]))  # 0.4 < low; 1.0 and 50 kept


@pytest.mark.parametrize("denominator", ["all", "selected"])
def test_gradient_matches_the_masked_loss(denominator):
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    entropy = torch.tensor([[1.0, 0.5, 2.0, 0.2], [1.0, 1.0, 0.1, 1.0], [0.3, 2.0, 1.0, 1.0], [1.0, 4.0, 0.5, 1.0]])
    logp = torch.tensor([[-1.0, -0.1, -2.5, -1.0], [-0.6, -3.0, -0.08, -1.0], [-0.3, -0.9, -1.0, -1.0],
                         [-1.9, -1.0, -0.2, -0.55]], requires_grad=True)
    old_logp = logp.detach() + torch.tensor([[0.1, 0.0, -0.2, 0.3], [-0.4, 0.0, 0.1, 0.0], [0.05, -0.3, 0.0, 0.0],
                                             [0.0, 0.2, 0.0, -0.1]])
    batch = make_batch(mask)
    out = RSI(RSI.Config(denominator=denominator)).token_weights(TokenStats(logp, old_logp, entropy=entropy),
                                                                  batch, CTX)
    assert not out.weights.requires_grad
    surrogate = clipped_surrogate(logp, old_logp, batch.advantages, CTX.clip_eps_low, CTX.clip_eps_high)
    (trainer_grad,) = torch.autograd.grad((out.weights * surrogate).sum() / out.denominator, logp, retain_graph=True)
    # RSI in [0.5, 2]: (0,0) 1.0, (0,2) 1.25, (0,3) 5 no, (0,1) 0.2 no; (1,0) 0.6, (1,1) 3 no, (1,2) 0.8;
    # (2,0) 1.0, (2,1) 0.45 no; (3,0) 1.9, (3,1) 0.25 no, (3,2) 0.4 no, (3,3) 0.55
    band = [(0, 0), (0, 2), (1, 0), (1, 2), (2, 0), (3, 0), (3, 3)]
    total = sum(surrogate[i, t] for i, t in band)
    direct = total / (mask.sum() if denominator == "all" else len(band))
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(trainer_grad, direct_grad, atol=1e-7)
    assert float(direct_grad.abs().sum()) > 0


@pytest.mark.parametrize("kwargs,message", [
    ({"low": -0.1}, "key 'method.low': -0.1 is outside the allowed range [0.0, inf)"),
    ({"low": 1.0, "high": 0.5}, "method.high must be >= method.low = 1.0 or null, got 0.5"),
    ({"high": math.nan}, "method.high must be >= method.low"),
    ({"denominator": "tokens"}, "key 'method.denominator': 'tokens' is not one of ['all', 'selected']"),
])
def test_config_range_checks(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RSI.Config(**kwargs)
