"""The pure policy loss (harness/train/loss.py): hand-computed cases, verl's compute_policy_loss re-implemented
independently as the oracle, KL estimators by hand, clip fractions, row chunks adding up to the batch."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import verl_policy_loss

from harness.train.loss import (
    KL_ESTIMATORS,
    LossConfig,
    LossInputs,
    clipped_surrogate,
    combine_row_metrics,
    kl_estimate,
    loss_of_rows,
    policy_loss,
    ratio_of,
)


def test_hand_computed_tokens():
    # four tokens: (r, A) = (1.5, 1) clipped high; (0.5, -1) clipped low; (4, -1) dual-clipped at c = 3; (1, 2) free
    logp = torch.log(torch.tensor([[1.5, 0.5, 4.0, 1.0]])).requires_grad_()
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    per_token, regions = clipped_surrogate(ratio_of(logp, old), adv, 0.2, 0.28, clip_ratio_c=3.0)
    # max(-1.5, -1.28) = -1.28; max(0.5, 0.8) = 0.8; min(max(4, 1.28), 3) = 3; max(-2, -2) = -2
    torch.testing.assert_close(per_token, torch.tensor([[-1.28, 0.8, 3.0, -2.0]]))
    assert regions.high.tolist() == [[True, False, False, False]]
    assert regions.low.tolist() == [[False, True, False, False]]
    assert regions.dual.tolist() == [[False, False, True, False]]
    # sum(w l) / D with w = (1, 1, 1, 0.5) and D = 2: (-1.28 + 0.8 + 3 - 1) / 2
    mask = torch.ones(1, 4)
    loss, metrics = policy_loss(logp, old, adv, mask, torch.tensor([[1.0, 1.0, 1.0, 0.5]]), 2.0,
                                LossConfig(clip_ratio_c=3.0))
    assert float(loss.detach()) == pytest.approx((-1.28 + 0.8 + 3.0 - 1.0) / 2)
    loss.backward()
    # only the free token has a gradient: d(-A r)/dlogp = -A r = -2, times w / D = 0.25
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0, -0.5]]))
    assert {k: float(v) for k, v in metrics.items()} == {"clip_ratio/region_mean": 0.5, "clip_ratio/low_mean": 0.25,
                                                         "clip_ratio/high_mean": 0.25, "clip_ratio/dual_mean": 0.25}


def test_without_dual_clip_a_negative_advantage_is_unbounded():
    logp, old, adv = torch.log(torch.tensor([[4.0]])), torch.zeros(1, 1), torch.tensor([[-1.0]])
    per_token, regions = clipped_surrogate(ratio_of(logp, old), adv, 0.2, 0.28)
    assert float(per_token) == pytest.approx(4.0) and not regions.dual.any()


def test_the_log_ratio_is_clamped_at_20():
    ratio = ratio_of(torch.tensor([[100.0, -100.0, 3.0]]), torch.zeros(1, 3))
    torch.testing.assert_close(ratio, torch.exp(torch.tensor([[20.0, -20.0, 3.0]])))
    assert torch.isfinite(ratio).all()


def test_clip_fractions_count_only_masked_tokens():
    # the clipped token at position 2 is padding: fractions over the 2 real tokens
    logp = torch.log(torch.tensor([[1.5, 1.0, 1.5]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), mask, mask, mask.sum(), LossConfig())
    assert float(metrics["clip_ratio/high_mean"]) == 0.5 and float(metrics["clip_ratio/region_mean"]) == 0.5


def random_case(seed: int, B: int = 5, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(B, T, generator=g) * 0.6
    log_ratio[0, :3] = torch.tensor([25.0, -30.0, 21.0])  # beyond the +-20 clamp
    old = -torch.rand(B, T, generator=g) * 5
    adv = torch.randn(B, T, generator=g) * 2
    adv[1, :] = -torch.rand(T, generator=g) - 0.1  # a row of A < 0 ...
    log_ratio[1, :4] = torch.tensor([1.5, 2.0, 3.0, 0.5])  # ... some with r = exp(.) beyond c = 3
    mask = (torch.rand(B, T, generator=g) < 0.8).float()
    mask[:, 0] = 1.0
    return old + log_ratio, old, adv, mask


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), clip_low=st.floats(0.05, 0.3), clip_high=st.floats(0.05, 0.4),
       clip_ratio_c=st.one_of(st.none(), st.floats(1.5, 10.0)))
def test_loss_matches_verl_compute_policy_loss(seed, clip_low, clip_high, clip_ratio_c):
    logp, old, adv, mask = random_case(seed)
    logp_ours = logp.clone().requires_grad_()
    logp_verl = logp.clone().requires_grad_()
    config = LossConfig(clip_eps_low=clip_low, clip_eps_high=clip_high, clip_ratio_c=clip_ratio_c)
    ours, metrics = policy_loss(logp_ours, old, adv, mask, mask, mask.sum(), config)  # token-mean
    c = math.inf if clip_ratio_c is None else clip_ratio_c
    theirs, clipfrac, clipfrac_lower = verl_policy_loss(old, logp_verl, adv, mask, clip_low, clip_high, c)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(logp_ours.grad, logp_verl.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(metrics["clip_ratio/region_mean"], clipfrac)
    torch.testing.assert_close(metrics["clip_ratio/dual_mean"], clipfrac_lower)


def test_the_random_cases_reach_every_region():
    # the verl comparison above is only worth something if its inputs clip low, high, dual and beyond +-20
    logp, old, adv, mask = random_case(0)
    _, regions = clipped_surrogate(ratio_of(logp, old), adv, 0.2, 0.28, clip_ratio_c=3.0)
    assert regions.low.any() and regions.high.any() and regions.dual.any()
    assert ((logp - old).abs() > 20).any()


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0, -0.5, -40.0]), torch.tensor([-1.5, -1.0, -0.5, -1.0])
    d = ref - logp  # (-0.5, 1.0, 0.0, 39.0)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([0.5, -1.0, 0.0, -39.0]))
    k3 = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0, math.exp(39.0) - 39.0 - 1])
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), k3)
    assert torch.equal(kl_estimate(logp, ref, "k3"), torch.exp(d) - d - 1)
    low_var = kl_estimate(logp, ref, "low_var_kl")
    torch.testing.assert_close(low_var[:3], k3[:3])
    assert float(low_var[3]) == 10.0  # log-ratio clamped to 20, then e^20 - 21 clamped to 10
    with pytest.raises(ValueError, match=r"kl_estimator must be one of \['k1', 'k3', 'low_var_kl'\]"):
        kl_estimate(logp, ref, "k2")
    from harness.config import choices

    assert sorted(KL_ESTIMATORS) == sorted(choices.KL_ESTIMATORS)  # what train.kl_estimator accepts is implemented


@pytest.mark.parametrize("estimator", ["k1", "k3", "low_var_kl"])
def test_kl_term_is_beta_times_its_own_aggregation(estimator):
    logp, old, adv, mask = random_case(3)
    ref = old + 0.3
    kl_weights, kl_denominator = mask / mask.sum(1, keepdim=True), torch.tensor(5.0)  # seq-mean-token-mean
    weights = mask * torch.rand(mask.shape, generator=torch.Generator().manual_seed(1))
    base, _ = policy_loss(logp, old, adv, mask, weights, 3.0, LossConfig())
    with_kl, metrics = policy_loss(logp, old, adv, mask, weights, 3.0, LossConfig(beta=0.1, kl_estimator=estimator),
                                   ref, kl_weights, kl_denominator)
    kl = kl_estimate(logp, ref, estimator)
    torch.testing.assert_close(with_kl, base + 0.1 * (kl_weights * kl).sum() / kl_denominator)
    torch.testing.assert_close(metrics["kl"], (kl * mask).sum() / mask.sum())
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        policy_loss(logp, old, adv, mask, weights, 3.0, LossConfig(beta=0.1))


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        clipped_surrogate(torch.ones(1, 1), -torch.ones(1, 1), 0.2, 0.28, clip_ratio_c=1.0)


def test_row_chunks_add_up_to_the_whole_batch():
    # the backward-chunked path: each chunk's loss over the whole batch's denominators; the sum is the batch's loss
    logp, old, adv, mask = random_case(7, B=6)
    inputs = LossInputs(adv, mask, mask * 0.5, mask.sum(), mask, mask.sum(), old_logp=old, ref_logp=old - 0.2)
    config = LossConfig(clip_ratio_c=3.0, beta=0.05, kl_estimator="low_var_kl")
    whole, whole_metrics = loss_of_rows(logp, inputs, config)
    parts, total = [], torch.zeros(())
    for rows in (torch.tensor([4, 0]), torch.tensor([1, 5, 2]), torch.tensor([3])):
        width = int(mask[rows].nonzero()[:, 1].max()) + 1
        chunk = inputs.rows(rows, width)
        loss, metrics = loss_of_rows(logp[rows, :width], chunk, config)
        total = total + loss
        parts.append((metrics, chunk.mask.sum()))
    torch.testing.assert_close(total, whole)
    combined = combine_row_metrics(parts)
    assert combined.keys() == whole_metrics.keys()
    for name, value in whole_metrics.items():
        torch.testing.assert_close(combined[name], value)


def test_old_logp_defaults_to_the_current_policy():
    # the first pass over a batch: r = 1 exactly, gradient -A w / D, nothing clipped
    logp, _, adv, mask = random_case(5)
    logp = logp.requires_grad_()
    loss, metrics = loss_of_rows(logp, LossInputs(adv, mask, mask, mask.sum()), LossConfig())
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv * mask / mask.sum())
    assert float(metrics["clip_ratio/region_mean"]) == 0.0
