"""NAT (methods/nat.py): Horvitz-Thompson unbiasedness by Monte Carlo, inclusion probabilities, the truncated
forward of a tiny Llama, and the gradient of the harness loss against the loss written out directly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import clipped_surrogate

from harness.train.hooks import kl_weights_of, prepare_batch, weigh_tokens
from harness.train.loss import LossConfig, LossInputs, kl_estimate, loss_of_rows
from methods.base import RolloutBatch, StepContext, TokenStats, aggregation_weights
from methods.nat import NAT, random_prefix_cut, uniform_random_sample
from methods.registry import get_method_class, registered_methods

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MAX_COMPLETION_LENGTH = 10


def make_batch(lengths: list[int], width: int, vocab: int = 50, seed: int = 0) -> RolloutBatch:
    """Right-padded random completions of the given lengths (pad id 0), advantages +-1 per rollout."""
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    ids = torch.randint(1, vocab, (len(lengths), width), generator=generator) * mask.long()
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(lengths))])
    return RolloutBatch(
        completion_ids=ids,
        completion_mask=mask,
        rewards=(adv > 0).float(),
        group_ids=torch.zeros(len(lengths), dtype=torch.long),
        rollout_advantages=adv,
        advantages=adv[:, None] * mask,
        keep=torch.ones(len(lengths), dtype=torch.bool),
    )


def test_hand_computed_inclusion_for_a_short_rollout():
    # |o| = 4 in a width-6 row: pi_t = (4 - t + 1) / 4 = 1, 3/4, 1/2, 1/4; padding gets 1 (weight 0 there anyway)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    sample, inclusion = random_prefix_cut(mask, torch.Generator().manual_seed(0))
    torch.testing.assert_close(inclusion, torch.tensor([[1.0, 0.75, 0.5, 0.25, 1.0, 1.0]]))
    cut = int(sample.sum())
    assert 1 <= cut <= 4 and sample[0, :cut].eq(1).all() and sample[0, cut:].eq(0).all()
    _, inclusion = uniform_random_sample(mask, 0.5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(inclusion, torch.tensor([[0.5, 0.5, 0.5, 0.5, 1.0, 1.0]]))


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=5), seed=st.integers(0, 2**31),
       scheme=st.sampled_from(["rpc", "urs"]), q=st.sampled_from([0.1, 0.5, 1.0]))
def test_inclusion_probabilities_are_positive_and_rpc_keeps_a_prefix(lengths, seed, scheme, q):
    batch = make_batch(lengths, 12)
    out = NAT(NAT.Config(scheme=scheme, q=q)).before_forward(batch, StepContext(seed=seed))
    inclusion, sample = out.extras["nat_inclusion"], out.extras["nat_sample"]
    assert (inclusion > 0).all() and (inclusion <= 1).all()
    assert (sample <= batch.completion_mask).all()
    if scheme == "rpc":
        cut = sample.sum(dim=1)
        lengths_t = torch.tensor(lengths, dtype=torch.float32)
        assert ((cut >= 1) | (lengths_t == 0)).all() and (cut <= lengths_t).all()
        prefix = (torch.arange(12)[None, :] < cut[:, None]).float()
        torch.testing.assert_close(sample, prefix)
        torch.testing.assert_close(out.completion_mask, prefix)  # the forward sees only prompt + y[:c]
    else:
        torch.testing.assert_close(out.completion_mask, batch.completion_mask)  # URS cannot shorten


@pytest.mark.parametrize("scheme", ["rpc", "urs"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_monte_carlo_mean_of_the_ht_loss_equals_the_full_loss(scheme, aggregation):
    lengths, width = [7, 1, 10, 3, 5], 10
    batch = make_batch(lengths, width)
    surrogate = torch.randn(len(lengths), width, generator=torch.Generator().manual_seed(1)) + 0.5
    full_weights, full_denominator = aggregation_weights(batch.completion_mask, aggregation, MAX_COMPLETION_LENGTH)
    full_loss = float((full_weights * surrogate).sum() / full_denominator)

    method = NAT(NAT.Config(scheme=scheme))
    estimates, kept = [], []
    for draw in range(3000):
        ctx = StepContext(seed=draw, step=draw % 11, aggregation=aggregation,
                          max_completion_length=MAX_COMPLETION_LENGTH)
        prepared = prepare_batch(method, batch, ctx)
        result = weigh_tokens(method, TokenStats(torch.zeros(1), torch.zeros(1)), prepared, ctx)
        estimates.append(float((result.weights * surrogate[prepared.rows, :prepared.length]).sum()
                               / result.denominator))
        kept.append(result.metrics["tokens_kept_frac"])
    estimates = torch.tensor(estimates, dtype=torch.float64)
    standard_error = float(estimates.std() / len(estimates) ** 0.5)
    assert abs(float(estimates.mean()) - full_loss) < 4 * standard_error
    assert 0.4 < sum(kept) / len(kept) < 0.7  # about half of the tokens in both schemes


@pytest.mark.parametrize("scheme", ["rpc", "urs"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_monte_carlo_mean_of_the_ht_kl_term_equals_the_full_token_kl_term(scheme, aggregation):
    # the harness's own loss (harness.train.loss) at beta = 1 with zero advantages: the loss is the KL term alone
    lengths, width = [7, 1, 10, 3, 5], 10
    batch = make_batch(lengths, width).replace(advantages=torch.zeros(len(lengths), width))
    generator = torch.Generator().manual_seed(4)
    logp = -torch.rand(len(lengths), width, generator=generator) * 3
    ref_logp = logp + torch.randn(len(lengths), width, generator=generator)
    config = LossConfig(beta=1.0)
    full_weights, full_denominator = aggregation_weights(batch.completion_mask, aggregation, MAX_COMPLETION_LENGTH)
    full_kl = float(loss_of_rows(logp, LossInputs(batch.advantages, batch.completion_mask, full_weights,
                                                  full_denominator, full_weights, full_denominator,
                                                  ref_logp=ref_logp), config)[0])

    method = NAT(NAT.Config(scheme=scheme))
    estimates = []
    for draw in range(3000):
        ctx = StepContext(seed=draw, step=draw % 11, aggregation=aggregation,
                          max_completion_length=MAX_COMPLETION_LENGTH)
        prepared = prepare_batch(method, batch, ctx)
        rows, length = prepared.rows, prepared.length
        result = weigh_tokens(method, TokenStats(torch.zeros(1), torch.zeros(1)), prepared, ctx)
        kl_weights, kl_denominator = kl_weights_of(result, prepared.batch, ctx)  # what the trainer uses
        inputs = LossInputs(prepared.batch.advantages, prepared.batch.completion_mask, result.weights,
                            result.denominator, kl_weights, kl_denominator, ref_logp=ref_logp[rows, :length])
        estimates.append(float(loss_of_rows(logp[rows, :length], inputs, config)[0]))
    estimates = torch.tensor(estimates, dtype=torch.float64)
    standard_error = float(estimates.std() / len(estimates) ** 0.5)
    assert abs(float(estimates.mean()) - full_kl) < 4 * standard_error
    if scheme == "rpc":  # the baseline's KL weights over the cut mask, used before, miss the KL of the late tokens
        biased = []
        for draw in range(300):
            ctx = StepContext(seed=draw, aggregation=aggregation, max_completion_length=MAX_COMPLETION_LENGTH)
            prepared = prepare_batch(method, batch, ctx)
            cut_weights, cut_denominator = aggregation_weights(prepared.batch.completion_mask, aggregation,
                                                               MAX_COMPLETION_LENGTH)
            kl = kl_estimate(logp, ref_logp, "k3")[prepared.rows, :prepared.length]
            biased.append(float((cut_weights * kl).sum() / cut_denominator))
        assert abs(sum(biased) / len(biased) - full_kl) > 8 * standard_error


def test_other_methods_keep_the_baseline_kl_weights_over_every_token():
    batch = make_batch([4, 2, 6], 6)
    stats = TokenStats(torch.zeros(3, 6), torch.zeros(3, 6), entropy=torch.rand(3, 6), sum_p2=torch.rand(3, 6),
                       ref_logp=torch.zeros(3, 6))
    for name in registered_methods():
        if name == "nat":
            continue
        for aggregation in AGGREGATIONS:
            ctx = StepContext(aggregation=aggregation, max_completion_length=MAX_COMPLETION_LENGTH)
            method = get_method_class(name)()
            prepared = prepare_batch(method, batch, ctx)
            result = weigh_tokens(method, stats_of_rows(stats, prepared), prepared, ctx)
            assert result.kl_weights is None and result.kl_denominator is None, name
            weights, denominator = kl_weights_of(result, prepared.batch, ctx)
            expected = aggregation_weights(prepared.batch.completion_mask, aggregation, MAX_COMPLETION_LENGTH)
            torch.testing.assert_close(weights, expected[0])
            torch.testing.assert_close(denominator, expected[1])


def stats_of_rows(stats: TokenStats, prepared) -> TokenStats:
    def cut(x):
        return x[prepared.rows, :prepared.length]

    return TokenStats(cut(stats.logp), cut(stats.old_logp), cut(stats.entropy), cut(stats.sum_p2), cut(stats.ref_logp))


def test_q_one_urs_is_the_full_loss_exactly():
    batch = make_batch([4, 2, 6], 6)
    ctx = StepContext(aggregation="seq-mean-token-mean")
    method = NAT(NAT.Config(scheme="urs", q=1.0))
    prepared = prepare_batch(method, batch, ctx)
    result = weigh_tokens(method, TokenStats(torch.zeros(1), torch.zeros(1)), prepared, ctx)
    weights, denominator = aggregation_weights(batch.completion_mask, ctx.aggregation, 1)
    torch.testing.assert_close(result.weights, weights)
    torch.testing.assert_close(result.denominator, denominator)


def test_rpc_really_shortens_the_forward_and_is_reproducible():
    batch = make_batch([9, 6, 8, 9], 12)
    lengths = []
    for seed in range(20):
        prepared = prepare_batch(NAT(), batch, StepContext(seed=seed))
        assert prepared.batch.completion_ids.shape[1] == prepared.length == int(prepared.batch.completion_mask
                                                                                .sum(dim=1).max())
        lengths.append(prepared.length)
    assert min(lengths) < 9 and max(lengths) <= 9  # the padding columns past 9 always go, often more
    again = prepare_batch(NAT(), batch, StepContext(seed=3))
    torch.testing.assert_close(again.batch.completion_mask, prepare_batch(NAT(), batch, StepContext(seed=3))
                               .batch.completion_mask)
    assert prepare_batch(NAT(NAT.Config(scheme="urs")), batch, StepContext(seed=0)).length == 9


@pytest.mark.parametrize("scheme", ["rpc", "urs"])
def test_each_process_draws_its_own_mask_and_process_zero_draws_as_a_single_process_run(scheme):
    batch = make_batch([9, 6, 8, 9, 7, 5, 9, 4], 12)
    method = NAT(NAT.Config(scheme=scheme))

    def draw(**ctx):
        return method.before_forward(batch, StepContext(seed=3, step=7, **ctx)).extras["nat_sample"]

    # the draw before processes were told apart: a generator seeded by (seed, step) alone
    mask, generator = batch.completion_mask, torch.Generator().manual_seed(3 * 1_000_003 + 7)
    single = (random_prefix_cut(mask, generator) if scheme == "rpc" else uniform_random_sample(mask, 0.5, generator))[0]
    assert torch.equal(draw(), single) and torch.equal(draw(process_index=0), single)
    others = [draw(process_index=k) for k in (1, 2, 3)]
    assert all(not torch.equal(other, single) for other in others)
    assert not torch.equal(others[0], others[1]) and not torch.equal(others[1], others[2])
    assert torch.equal(draw(process_index=2), others[1])  # still reproducible per process


def completion_logp(model, prompt_ids, completion_ids, completion_mask):
    """log pi(y_t | prompt, y_<t), (B, T): logits at position P - 1 + t predict completion token t."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([torch.ones_like(prompt_ids), completion_mask.long()], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, P + T, V)
    logits = logits[:, prompt_ids.shape[1] - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


def test_truncated_forward_gives_the_full_forward_logp_at_kept_positions():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    batch = make_batch([12, 7, 4], 12)
    prompt_ids = torch.randint(1, 50, (3, 5))
    # a seed whose longest cut is short of the longest completion, so columns are really dropped
    seed = next(s for s in range(100) if prepare_batch(NAT(), batch, StepContext(seed=s)).length < 8)
    prepared = prepare_batch(NAT(), batch, StepContext(seed=seed))
    kept = prepared.batch.completion_mask.bool()
    with torch.no_grad():
        full = completion_logp(model, prompt_ids, batch.completion_ids, batch.completion_mask)
        truncated = completion_logp(model, prompt_ids[prepared.rows], prepared.batch.completion_ids,
                                    prepared.batch.completion_mask)
    assert truncated.shape == (3, prepared.length) and prepared.length < 12
    torch.testing.assert_close(truncated[kept], full[:, :prepared.length][kept])


@pytest.mark.parametrize("scheme", ["rpc", "urs"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_matches_the_loss_written_out(scheme, aggregation):
    torch.manual_seed(2)
    lengths, width = [8, 3, 6, 1], 8
    batch = make_batch(lengths, width)
    old_logp = -torch.rand(4, width) * 3
    logp = (old_logp + 0.4 * torch.randn(4, width)).requires_grad_()
    method = NAT(NAT.Config(scheme=scheme))
    ctx = StepContext(seed=5, step=2, aggregation=aggregation)

    prepared = prepare_batch(method, batch, ctx)
    rows, length = prepared.rows, prepared.length
    stats = TokenStats(logp[rows, :length], old_logp[rows, :length])
    result = weigh_tokens(method, stats, prepared, ctx)
    surrogate = clipped_surrogate(stats.logp, stats.old_logp, prepared.batch.advantages)
    (grad_harness,) = torch.autograd.grad((result.weights * surrogate).sum() / result.denominator, logp)

    # NAT written out; only the random draw (the cut c_i, or the Bernoulli mask) is read from the method
    l_full = clipped_surrogate(logp, old_logp, batch.advantages)
    sample = prepared.batch.extras["nat_sample"]
    terms = []
    for i, n in enumerate(lengths):
        per_token = 1.0 if aggregation == "token-mean" else 1.0 / n  # w_{i,t} of the untruncated completion
        if scheme == "rpc":
            cut = int(sample[i].sum())
            terms += [l_full[i, t] * per_token * n / (n - t) for t in range(cut)]  # 1/pi = |o| / (|o| - t + 1)
        else:
            terms += [l_full[i, t] * per_token / 0.5 for t in range(length) if sample[i, t] > 0]
    denominator = sum(lengths) if aggregation == "token-mean" else len(lengths)  # the full-sequence denominator
    (grad_direct,) = torch.autograd.grad(sum(terms) / denominator, logp)
    torch.testing.assert_close(grad_harness, grad_direct)


def test_registry_needs_and_config_checks():
    assert get_method_class("nat") is NAT
    assert NAT.needs == frozenset()
    assert NAT.deviations
    with pytest.raises(ValueError, match=r"key 'method.q': 0.0 is outside the allowed range \(0.0, 1.0\]"):
        NAT.Config(q=0.0)
    with pytest.raises(ValueError, match=r"key 'method.scheme': 'bernoulli' is not one of \['rpc', 'urs'\]"):
        NAT.Config(scheme="bernoulli")
    batch = make_batch([3], 3)
    with pytest.raises(ValueError, match="before_forward"):
        NAT().token_weights(TokenStats(torch.zeros(1, 3), torch.zeros(1, 3)), batch, StepContext())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("scheme", ["rpc", "urs"])
def test_a_mini_batch_divides_by_its_own_rows_as_the_baseline_does(aggregation, scheme):
    """train.mini_batches splits the prepared batch by rows: each mini-batch's D is its rows' part of the untruncated
    denominator, the baseline aggregation of those rows (it was the whole generation batch's D, halving NAT's loss
    against every other method's with 2 mini-batches)."""
    ctx = StepContext(seed=3, aggregation=aggregation, max_completion_length=MAX_COMPLETION_LENGTH)
    batch = make_batch([3, 7, 10, 5], MAX_COMPLETION_LENGTH)
    method = NAT(NAT.Config(scheme=scheme))
    prepared = prepare_batch(method, batch, ctx)
    for rows in (torch.tensor([0, 1]), torch.tensor([2, 3])):
        mini = prepared.batch.select_rows(rows)
        zeros = torch.zeros_like(mini.completion_mask)
        result = weigh_tokens(method, TokenStats(logp=zeros, old_logp=zeros), prepared.__class__(mini, rows, 0), ctx)
        _, baseline = aggregation_weights(batch.completion_mask[rows], aggregation, MAX_COMPLETION_LENGTH)
        assert float(result.denominator) == float(baseline) == float(result.row_denominators.sum())
