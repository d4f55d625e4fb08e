"""D3S (methods/d3s.py): max-variance rollout selection against brute force, the schedule, a hand-computed batch,
real removal of dropped rollouts, and the gradient of the harness loss against the loss written out directly."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate

from harness.train.hooks import prepare_batch, run_hooks, weigh_tokens
from methods.base import RolloutBatch, StepContext, TokenStats, aggregation_weights
from methods.d3s import D3S, keep_count, max_variance_subset
from methods.registry import get_method_class


def make_batch(advantages: list[float], group_ids: list[int], lengths: list[int], width: int) -> RolloutBatch:
    """A batch with the given rollout advantages broadcast over right-padded completions of the given lengths."""
    adv = torch.tensor(advantages, dtype=torch.float32)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        completion_ids=torch.arange(len(lengths) * width).reshape(len(lengths), width) % 7,
        completion_mask=mask,
        rewards=(adv > 0).float(),
        group_ids=torch.tensor(group_ids),
        rollout_advantages=adv,
        advantages=adv[:, None] * mask,
        keep=torch.ones(len(lengths), dtype=torch.bool),
    )


def variance(values) -> float:
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def best_variance(values, size: int) -> float:
    return max(variance(subset) for subset in combinations(values, size))


small_values = st.lists(st.integers(-4, 4).map(lambda v: v / 2), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(values=small_values, data=st.data())
def test_max_variance_subset_matches_brute_force(values, data):
    size = data.draw(st.integers(1, len(values)))
    picked = max_variance_subset(torch.tensor(values), size)
    assert len(set(picked.tolist())) == size
    assert variance([values[i] for i in picked]) == pytest.approx(best_variance(values, size), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(group_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       group_keep=st.sampled_from([0.25, 0.5, 0.75, 1.0]), data=st.data())
def test_per_group_pass_keeps_max_variance_subset(group_sizes, group_keep, data):
    group_ids = [g for g, size in enumerate(group_sizes) for _ in range(size)]
    advantages = data.draw(st.lists(st.integers(-4, 4).map(lambda v: v / 2), min_size=len(group_ids),
                                    max_size=len(group_ids)))
    method = D3S(D3S.Config(group_keep_start=group_keep, batch_keep_start=1.0))  # per-group pass only ("D1S")
    keep = method.on_rollouts(make_batch(advantages, group_ids, [2] * len(group_ids), 2), StepContext()).keep
    for g, size in enumerate(group_sizes):
        rows = [i for i in range(len(group_ids)) if group_ids[i] == g]
        kept = [advantages[i] for i in rows if keep[i]]
        assert len(kept) == keep_count(group_keep, size)
        assert variance(kept) == pytest.approx(best_variance([advantages[i] for i in rows], len(kept)), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(advantages=st.lists(st.integers(-4, 4).map(lambda v: v / 2), min_size=2, max_size=9),
       batch_keep=st.sampled_from([0.2, 0.5, 0.7, 1.0]))
def test_cross_group_pass_keeps_max_variance_subset_without_renormalising(advantages, batch_keep):
    group_ids = [i % 3 for i in range(len(advantages))]
    batch = make_batch(advantages, group_ids, [2] * len(advantages), 2)
    method = D3S(D3S.Config(group_keep_start=1.0, batch_keep_start=batch_keep))  # cross-group pass only
    out = method.on_rollouts(batch, StepContext())
    kept = [advantages[i] for i in range(len(advantages)) if out.keep[i]]
    assert len(kept) == keep_count(batch_keep, len(advantages))
    assert variance(kept) == pytest.approx(best_variance(advantages, len(kept)), abs=1e-9)
    torch.testing.assert_close(out.rollout_advantages, batch.rollout_advantages)  # no re-normalisation
    torch.testing.assert_close(out.advantages, batch.advantages)


def test_schedule_moves_linearly_from_start_to_end():
    method = D3S(D3S.Config(group_keep_start=0.6, group_keep_end=1.0, batch_keep_start=0.4, batch_keep_end=0.8,
                            token_keep_start=0.2, token_keep_end=1.0))
    assert method.schedule(0.0) == pytest.approx((0.6, 0.4, 0.2))
    assert method.schedule(0.5) == pytest.approx((0.8, 0.6, 0.6))
    assert method.schedule(1.0) == pytest.approx((1.0, 0.8, 1.0))
    assert method.schedule(1.7) == pytest.approx((1.0, 0.8, 1.0))  # progress is clamped to [0, 1]
    # realised counts relax with progress: kept rollouts and selected tokens never shrink
    torch.manual_seed(0)
    batch = make_batch(torch.randn(16).tolist(), [i // 4 for i in range(16)], [6] * 16, 6)
    entropy = torch.rand(16, 6)
    counts = []
    for progress in (0.0, 0.25, 0.5, 0.75, 1.0):
        out = run_hooks(D3S(), batch, lambda p: TokenStats(torch.zeros(p.batch.completion_mask.shape),
                                                           torch.zeros(p.batch.completion_mask.shape),
                                                           entropy=entropy[p.rows, :p.length]),
                        StepContext(progress=progress))
        counts.append((int(out.keep.sum()), int((out.weights > 0).sum())))
    assert counts[0] == (8, math.ceil(0.2 * 8 * 6))  # 50 % of rollouts, 20 % of their tokens
    assert counts[-1] == (16, 16 * 6)  # everything at the end
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(counts[:-1], counts[1:], strict=True))


def test_end_of_schedule_is_the_token_mean_baseline():
    torch.manual_seed(1)
    batch = make_batch(torch.randn(8).tolist(), [i // 4 for i in range(8)], [5, 3, 4, 5, 2, 5, 1, 4], 5)
    stats = TokenStats(torch.zeros(8, 5), torch.zeros(8, 5), entropy=torch.rand(8, 5))
    out = run_hooks(D3S(), batch, lambda p: stats, StepContext(progress=1.0))
    weights, denominator = aggregation_weights(batch.completion_mask, "token-mean", 1)
    torch.testing.assert_close(out.weights, weights)
    assert out.denominator == pytest.approx(float(denominator))


@pytest.mark.parametrize("seed", range(5))
def test_default_denominator_is_the_selected_token_mean_under_token_mean_and_the_baseline_at_the_end(seed):
    # the default sweep (tiny preset, token-mean) computes exactly what the earlier default "selected" computed
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (12,), generator=generator).tolist()
    batch = make_batch(torch.randn(12, generator=generator).tolist(), [i // 4 for i in range(12)], lengths, 6)
    entropy = torch.rand(12, 6, generator=generator)

    def run(config, aggregation, progress):
        return run_hooks(D3S(config), batch, lambda p: TokenStats(torch.zeros(p.batch.completion_mask.shape),
                                                                  torch.zeros(p.batch.completion_mask.shape),
                                                                  entropy=entropy[p.rows, :p.length]),
                         StepContext(progress=progress, aggregation=aggregation, max_completion_length=6))

    assert D3S.Config().denominator == "aggregation"
    for progress in (0.0, 0.3, 1.0):
        default = run(D3S.Config(), "token-mean", progress)
        selected = run(D3S.Config(denominator="selected"), "token-mean", progress)
        assert torch.equal(default.weights, selected.weights) and default.denominator == selected.denominator
    # under GRPO's seq-mean-token-mean the end of the schedule is the baseline's aggregation, "selected" is not
    weights, denominator = aggregation_weights(batch.completion_mask, "seq-mean-token-mean", 6)
    end = run(D3S.Config(), "seq-mean-token-mean", 1.0)
    torch.testing.assert_close(end.weights, weights)
    assert end.denominator == pytest.approx(float(denominator))
    end_selected = run(D3S.Config(denominator="selected"), "seq-mean-token-mean", 1.0)
    assert not torch.allclose(end_selected.weights / end_selected.denominator, weights / denominator)


def hand_batch() -> tuple[RolloutBatch, torch.Tensor]:
    # group 0: A = 1.5, 0.5, -0.5, -1.5; group 1: A = 0.9, 0.1, 0.0, -1.0; row 5 is the longest (length 5)
    batch = make_batch([1.5, 0.5, -0.5, -1.5, 0.9, 0.1, 0.0, -1.0], [0, 0, 0, 0, 1, 1, 1, 1],
                       [3, 4, 4, 2, 4, 5, 4, 3], 5)
    entropy = torch.zeros(8, 5)
    entropy[0, :3] = torch.tensor([0.1, 0.8, 0.3])
    entropy[3, :2] = torch.tensor([0.5, 0.2])
    entropy[7, :3] = torch.tensor([0.9, 0.4, 0.7])
    return batch, entropy


def test_hand_computed_case():
    # per group N_s = 0.5 * 4 = 2: group 0 keeps {1.5, -1.5} (rows 0, 3), group 1 keeps {0.9, -1.0} (rows 4, 7)
    #   (Var of {0.9, -1.0} = 0.9025 beats {0.9, 0.1} = 0.16 and {0.0, -1.0} = 0.25)
    # cross-group N = 0.375 * 8 = 3 of {1.5, -1.5, 0.9, -1.0}: Var over k smallest + 3-k largest
    #   k=0 {-1.0, 0.9, 1.5} 1.136; k=1 {-1.5, 0.9, 1.5} 1.68; k=2 {-1.5, -1.0, 1.5} 1.722; k=3 1.069 -> rows 0, 3, 7
    # tokens |A| * H: row 0: .15 1.2 .45; row 3: .75 .3; row 7: .9 .4 .7; K = 0.5 of 8 -> the top 4:
    #   (0,1) 1.2, (7,0) .9, (3,0) .75, (7,2) .7; denominator = 4 selected tokens
    batch, entropy = hand_batch()
    method = D3S(D3S.Config(group_keep_start=0.5, batch_keep_start=0.375, token_keep_start=0.5))
    out = run_hooks(method, batch, lambda p: TokenStats(torch.zeros(p.batch.completion_mask.shape),
                                                        torch.zeros(p.batch.completion_mask.shape),
                                                        entropy=entropy[p.rows, :p.length]), StepContext())
    assert out.keep.nonzero().flatten().tolist() == [0, 3, 7]
    expected = torch.zeros(8, 5)
    for i, t in [(0, 1), (7, 0), (3, 0), (7, 2)]:
        expected[i, t] = 1.0
    torch.testing.assert_close(out.weights, expected)
    assert out.denominator == 4.0
    assert out.metrics["tokens_selected_frac"] == pytest.approx(0.5)


def test_dropped_rollouts_are_removed_before_the_forward_pass():
    batch, _ = hand_batch()
    method = D3S(D3S.Config(group_keep_start=0.5, batch_keep_start=0.375))
    prepared = prepare_batch(method, batch, StepContext())
    assert prepared.rows.tolist() == [0, 3, 7]
    assert prepared.batch.completion_ids.shape == (3, 3)  # 3 of 8 rows; columns past the longest kept row cut
    assert prepared.batch.rollout_advantages.tolist() == [1.5, -1.5, -1.0]


@pytest.mark.parametrize("denominator", ["selected", "aggregation", "all"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_matches_the_loss_written_out(denominator, aggregation):
    torch.manual_seed(3)
    B, T, G = 8, 6, 4
    lengths = [6, 2, 5, 4, 3, 6, 1, 5]
    batch = make_batch(torch.randn(B).tolist(), [i // G for i in range(B)], lengths, T)
    entropy = torch.rand(B, T)
    old_logp = -torch.rand(B, T) * 3
    logp = (old_logp + 0.4 * torch.randn(B, T)).requires_grad_()  # some ratios fall outside the clip range
    method = D3S(D3S.Config(group_keep_start=0.75, batch_keep_start=0.5, token_keep_start=0.3,
                            denominator=denominator))
    ctx = StepContext(progress=0.0, aggregation=aggregation)

    # harness path: prepare, token statistics of the kept rows/columns, weights, sum(w * l) / D
    prepared = prepare_batch(method, batch, ctx)
    rows, length = prepared.rows, prepared.length
    stats = TokenStats(logp[rows, :length], old_logp[rows, :length], entropy=entropy[rows, :length])
    result = weigh_tokens(method, stats, prepared, ctx)
    surrogate = clipped_surrogate(stats.logp, stats.old_logp, prepared.batch.advantages)
    (grad_harness,) = torch.autograd.grad((result.weights * surrogate).sum() / result.denominator, logp)

    # D3S written out: brute-force max-Var subsets per group (3 of 4) then across the batch (4 of 6), top 30 % by
    # |A| * H among their tokens
    adv = batch.rollout_advantages.tolist()
    survivors = []
    for g in range(B // G):
        group = list(range(g * G, (g + 1) * G))
        survivors += max(combinations(group, 3), key=lambda s: variance([adv[i] for i in s]))
    kept = max(combinations(survivors, 4), key=lambda s: variance([adv[i] for i in s]))
    tokens = sorted(((abs(adv[i]) * float(entropy[i, t]), i, t) for i in kept for t in range(lengths[i])),
                    reverse=True)
    selected = [(i, t) for _, i, t in tokens[:math.ceil(0.3 * len(tokens))]]
    l_full = clipped_surrogate(logp, old_logp, batch.advantages)
    if denominator == "selected" or aggregation == "token-mean":
        loss = sum(l_full[i, t] for i, t in selected) / (len(selected) if denominator != "all"
                                                          else sum(lengths[i] for i in kept))
    elif denominator == "aggregation":  # GRPO over the selected tokens: mean over rows of the per-row mean
        rows_hit = sorted({i for i, _ in selected})
        loss = sum(sum(l_full[i, t] for j, t in selected if j == i) / sum(1 for j, _ in selected if j == i)
                   for i in rows_hit) / len(rows_hit)
    else:  # "all" under GRPO: (1/|kept|) sum_i (1/|o_i|) sum_{t selected} l
        loss = sum(l_full[i, t] / lengths[i] for i, t in selected) / len(kept)
    (grad_direct,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad_harness, grad_direct)
    assert sorted(rows.tolist()) == sorted(kept)


def test_registry_needs_and_config_checks():
    assert get_method_class("d3s") is D3S
    assert D3S.needs == frozenset({"entropy"})
    assert D3S.deviations
    with pytest.raises(ValueError, match=r"'method.token_keep_start': 1.5 is outside the allowed range \(0.0, 1.0\]"):
        D3S.Config(token_keep_start=1.5)
    with pytest.raises(ValueError, match="batch_keep_end"):
        D3S.Config(batch_keep_end=0.0)
    with pytest.raises(ValueError, match="denominator.*'selected'"):
        D3S.Config(denominator="tokens")
    batch, _ = hand_batch()
    with pytest.raises(ValueError, match="entropy"):
        D3S().token_weights(TokenStats(torch.zeros(8, 5), torch.zeros(8, 5)), batch, StepContext())
