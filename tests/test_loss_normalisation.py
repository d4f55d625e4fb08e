"""Loss normalisation across processes and verl's legacy micro-batches (harness/train/micro_batches.py,
``Actor.normalised``).

The oracle of the micro-batch weighting is verl's dp_actor restated here from its equations (KTAE's verl,
dp_actor.py:265-333): each micro-batch's loss is ``agg_loss`` token-mean over its own response (x selection) mask,
``masked_mean`` = sum / (count + 1e-8), scaled by len(micro-batch) / ppo_mini_batch_size, the gradients summed.
The oracle of the global denominator: one loss over every process's rows, sum(w l) / sum of every process's parts."""

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_formulas import verl_micro_batch_loss

from harness.config.loading import resolve
from harness.config.rules import section_problems
from harness.config.schema import ConfigError, TrainConfig
from harness.train.actor import Actor
from harness.train.hooks import denominator_parts, loss_inputs_for, new_rollout_batch, prepare_batch, weigh_tokens
from harness.train.loss import LossConfig, loss_of_rows
from harness.train.micro_batches import (
    balanced_micro_batches,
    karmarkar_karp,
    micro_batch_count,
    micro_batch_row_scales,
)
from harness.train.row_chunks import Sequences
from methods.base import StepContext, TokenStats, aggregation_row_denominators, aggregation_weights
from methods.registry import get_method_class


def effective_weights(loss_of_per_token, shape):
    """d loss / d l: the weight each token's surrogate gets."""
    per_token = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss_of_per_token(per_token), per_token)
    return grad


# --- the partition: verl's rearrange_micro_batches ----------------------------------------------------------------

def test_audit_example_long_rollouts_share_a_micro_batch_and_weigh_less():
    # prompt + completion lengths [3000, 800, 850, 850, 850, 850] within 4096 tokens: ceil(7200 / 4096) = 2
    # micro-batches; Karmarkar-Karp pairs the 3000 with the 800 (3800) against the four 850s (3400), largest first
    lengths = [3000, 800, 850, 850, 850, 850]
    assert micro_batch_count(lengths, 4096) == 2
    assert balanced_micro_batches(lengths, 2) == [[0, 1], [2, 3, 4, 5]]
    prompts = [100, 50, 50, 50, 50, 50]
    completions = [a - b for a, b in zip(lengths, prompts, strict=True)]  # [2900, 750, 800, 800, 800, 800]
    mask = torch.tensor([[1.0] * c + [0.0] * (2900 - c) for c in completions])
    scales = micro_batch_row_scales([[0, 1], [2, 3, 4, 5]], aggregation_row_denominators(mask, "token-mean", 2900))
    # a token of micro-batch 1 weighs 2 / (6 x 3650), one of micro-batch 2 weighs 4 / (6 x 3200): ratio 0.44
    expected = torch.tensor([2 / (6 * 3650)] * 2 + [4 / (6 * 3200)] * 4)
    torch.testing.assert_close(scales, expected.float())
    assert float(scales[0] / scales[2]) == pytest.approx(0.438, abs=1e-3)
    ours = effective_weights(lambda terms: (mask * scales[:, None] * terms).sum(), mask.shape)
    verl = effective_weights(lambda terms: verl_micro_batch_loss(terms, mask, [[0, 1], [2, 3, 4, 5]], 6), mask.shape)
    torch.testing.assert_close(ours, verl, rtol=1e-6, atol=1e-12)


def test_ties_are_broken_as_verl_breaks_them():
    # by hand: equal lengths pop the later index first; [3] + [2] -> {3}, {2}; [1] + [0] -> {1}, {0}; the state
    # with the larger first set ({3}) absorbs the other reversed: {3, 0} and {2, 1}, the larger item list first
    assert karmarkar_karp([5, 5, 5, 5], 2) == [[3, 0], [2, 1]]
    assert balanced_micro_batches([5, 5, 5, 5], 2) == [[0, 3], [1, 2]]
    # [8, 6, 7, 4] in 3: {8}, {7} -> (8, 7, -); + {6} -> (8, 7, 6); {4} absorbs it reversed: {4, 6}, {7}, {8}
    assert balanced_micro_batches([8, 6, 7, 4], 3) == [[1, 3], [0], [2]]


def test_count_is_capped_at_the_rows_and_an_empty_batch_has_none():
    assert balanced_micro_batches([10, 10], 5) == [[1], [0]]  # equal lengths: the later index pops first
    assert balanced_micro_batches([], 3) == []
    assert micro_batch_count([4096, 1], 4096) == 2 and micro_batch_count([4096], 4096) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 12)), min_size=1, max_size=24),
       st.integers(0, 40), st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
       st.integers(0, 2**31 - 1))
def test_micro_batch_weights_are_verls_and_sum_to_the_nonempty_share(rows, extra, aggregation, seed):
    prompts, completions = zip(*rows, strict=True)
    width = max(max(completions), 1)
    mask = torch.tensor([[1.0] * c + [0.0] * (width - c) for c in completions])
    selected = mask * (torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.5)
    lengths = [p + c for p, c in rows]
    tokens = max(lengths) + extra  # verl requires a row to fit
    micro_batches = balanced_micro_batches(lengths, micro_batch_count(lengths, tokens))
    assert len(micro_batches) == min(len(rows), math.ceil(sum(lengths) / tokens))
    assert sorted(i for m in micro_batches for i in m) == list(range(len(rows)))
    assert all(m == sorted(m) and m for m in micro_batches)
    parts = aggregation_row_denominators(selected, aggregation, width)
    scales = micro_batch_row_scales(micro_batches, parts)
    weights, _ = aggregation_weights(selected, aggregation, width)
    ours = (weights * scales[:, None]).double()
    # the weights of one micro-batch add up to its rows' share of the batch, when it has a token to average over
    counted = sum(len(m) for m in micro_batches if float(selected[torch.tensor(m)].sum()) > 0)
    if aggregation == "token-mean":
        assert float(ours.sum()) == pytest.approx(counted / len(rows), rel=1e-5)
        verl = effective_weights(lambda terms: verl_micro_batch_loss(terms, selected, micro_batches, len(rows)),
                                 mask.shape)
        torch.testing.assert_close(ours, verl, rtol=1e-5, atol=1e-9)
    else:  # a rollout's weight does not depend on its micro-batch: the one mean over the batch
        whole, denominator = aggregation_weights(selected, aggregation, width)
        if aggregation == "seq-mean-token-mean":  # D_m = rollouts with a token: equal when all have one
            if bool((selected.sum(1) > 0).all()):
                torch.testing.assert_close(ours, (whole / denominator).double(), rtol=1e-5, atol=1e-9)
        else:
            torch.testing.assert_close(ours, (whole / denominator).double(), rtol=1e-5, atol=1e-9)


# --- the actor: one mean over every process, or verl's micro-batches -----------------------------------------------

def fake_actor(method, processes, others=None, micro_batch_tokens=0, beta=0.1):
    """An actor (no model, no trainer) whose all-reduce adds the other processes' local sums (``others``) and whose
    max over processes is this process's count; ``actor.logged`` holds what it logs."""
    train = TrainConfig(max_completion_length=8, loss_micro_batch_tokens=micro_batch_tokens, beta=beta)
    logged = {}
    fake_processes = SimpleNamespace(num_processes=processes, device=torch.device("cpu"),
                                     sum=lambda t: t + sum(others), max=lambda v: v)
    actor = Actor(method, train, None, fake_processes, lambda name, value: logged.setdefault(name, value), ())
    actor.logged = logged
    return actor


def process_batch(seed, rows, method, ctx):
    """One process's rows (different lengths per process), the method's prepared batch, weights and loss inputs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (rows,), generator=g)
    mask = (torch.arange(8)[None, :] < lengths[:, None]).float()
    batch = new_rollout_batch(torch.randint(4, 30, (rows, 8), generator=g), mask,
                              torch.randint(0, 2, (rows,), generator=g).float(), torch.arange(rows) // 4 + 10 * seed,
                              "group")
    prepared = prepare_batch(method, batch, ctx)
    shape = prepared.batch.completion_mask.shape
    features = torch.randn(*shape, 3, generator=g)
    stats = TokenStats(logp=torch.zeros(shape), old_logp=torch.zeros(shape), entropy=torch.rand(shape, generator=g),
                       sum_p2=torch.rand(shape, generator=g), ref_logp=-torch.rand(shape, generator=g))
    result = weigh_tokens(method, stats, prepared, ctx)
    inputs = loss_inputs_for(method, prepared.batch, result, ctx, None, old_logp=None, ref_logp=stats.ref_logp)
    prompt = torch.randint(1, 5, (shape[0],), generator=g)
    prompt_mask = (torch.arange(5)[None, :] < prompt[:, None]).long()
    raw = Sequences(prompt_mask, prompt_mask, prepared.batch.completion_ids, prepared.batch.completion_mask.long())
    return prepared, result, inputs, features, raw


def gradient(theta, features, inputs, config):
    """d loss / d theta for logp = features @ theta: a parameter every process shares, as DDP's are."""
    logp = features @ theta
    (grad,) = torch.autograd.grad(loss_of_rows(logp, inputs, config)[0], theta)
    return grad


@pytest.mark.parametrize("name", ["uniform", "entropy", "ktae", "nat", "d3s", "gmts", "rsi"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_mean_of_the_processes_gradients_is_the_gradient_of_one_mean(name, aggregation):
    method = get_method_class(name)()
    config = LossConfig(beta=0.1, kl_estimator="k1")
    theta = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    parts = []
    for index, rows in enumerate((8, 12)):  # the second process holds more and other rollouts
        ctx = StepContext(aggregation=aggregation, max_completion_length=8, beta=0.1, process_index=index, seed=3)
        parts.append(process_batch(index + 1, rows, method, ctx))
    sums = [torch.stack([r.row_denominators.sum(), hooks_kl_parts(r, p.batch, aggregation).sum()]).double()
            for p, r, _, _, _ in parts]
    grads = []
    for index, (prepared, result, inputs, features, raw) in enumerate(parts):
        actor = fake_actor(method, 2, others=[s for j, s in enumerate(sums) if j != index])
        ctx = StepContext(aggregation=aggregation, max_completion_length=8, beta=0.1, process_index=index, seed=3)
        normalised = actor.normalised(inputs, result, prepared.batch, raw, ctx)
        grads.append(gradient(theta, features, normalised, config))
    # one loss over both processes' rows: sum(w l) / D + beta sum(w_kl kl) / D_kl, D the sums of every row's part
    denominator = float(sum(s[0] for s in sums))
    kl_denominator = float(sum(s[1] for s in sums))

    def whole_loss(theta):
        total = 0.0
        for _, _, inputs, features, _ in parts:
            logp = features @ theta
            per_token = -inputs.advantages * torch.exp(logp - logp.detach())  # ratio 1: no clipping
            total = total + (inputs.weights * per_token).sum() / max(denominator, 1.0)
            total = total + 0.1 * (inputs.kl_weights * (logp - inputs.ref_logp)).sum() / max(kl_denominator, 1.0)
        return total

    (expected,) = torch.autograd.grad(whole_loss(theta), theta)
    torch.testing.assert_close((grads[0] + grads[1]) / 2, expected, rtol=1e-5, atol=1e-7)


def hooks_kl_parts(result, batch, aggregation):
    return denominator_parts(result, batch, StepContext(aggregation=aggregation, max_completion_length=8))[1]


def test_one_process_keeps_the_loss_inputs_exactly():
    method = get_method_class("entropy")()
    ctx = StepContext(max_completion_length=8, beta=0.1)
    prepared, result, inputs, _, raw = process_batch(1, 8, method, ctx)
    actor = fake_actor(method, 1)
    assert actor.normalised(inputs, result, prepared.batch, raw, ctx) is inputs
    assert actor.logged["loss/denominator"] == float(result.denominator)


@pytest.mark.parametrize("name", ["uniform", "entropy", "ktae", "nat"])
def test_micro_batch_loss_is_verls_over_the_selected_tokens(name):
    # entropy: the selection is the batch's, each micro-batch's mean is over its selected tokens (verl's agg_loss of
    # response_mask x entropy mask); KTAE and uniform: every token; the KL term over every token, as verl's kl_loss
    method = get_method_class(name)()
    ctx = StepContext(max_completion_length=8, beta=0.1, seed=5)
    prepared, result, inputs, features, raw = process_batch(2, 12, method, ctx)
    actor = fake_actor(method, 1, micro_batch_tokens=12)
    normalised = actor.normalised(inputs, result, prepared.batch, raw, ctx)
    lengths = (raw.prompt_mask.sum(1) + raw.completion_mask.sum(1)).tolist()
    micro_batches = balanced_micro_batches(lengths, math.ceil(sum(lengths) / 12))
    assert actor.logged["loss/micro_batches"] == len(micro_batches) > 2
    theta = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    config = LossConfig(beta=0.1, kl_estimator="k1")
    ours = gradient(theta, features, normalised, config)

    logp = features @ theta
    per_token = -inputs.advantages * torch.exp(logp - logp.detach())
    kl = logp - inputs.ref_logp
    if name == "nat":  # Horvitz-Thompson: each micro-batch divides by its rows' untruncated lengths
        hts = result.weights
        parts = prepared.batch.extras["nat_base_row_denominators"]
        loss = sum((hts[m] * (per_token[m] + 0.1 * kl[m])).sum() / parts[m].sum() * (len(m) / 12)
                   for m in map(torch.tensor, micro_batches))
    else:
        selected = result.weights  # 0/1 under token-mean
        loss = (verl_micro_batch_loss(per_token, selected, micro_batches, 12)
                + 0.1 * verl_micro_batch_loss(kl, prepared.batch.completion_mask, micro_batches, 12))
    (expected,) = torch.autograd.grad(loss, theta)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)


def test_micro_batches_need_the_methods_row_denominators():
    method = get_method_class("uniform")()
    ctx = StepContext(max_completion_length=8)
    prepared, result, inputs, _, raw = process_batch(1, 4, method, ctx)
    result.row_denominators = None
    with pytest.raises(ValueError, match="row_denominators"):
        fake_actor(method, 1, micro_batch_tokens=12).normalised(inputs, result, prepared.batch, raw, ctx)


def test_row_denominators_must_add_up_to_the_denominator():
    method = get_method_class("uniform")()
    ctx = StepContext(max_completion_length=8)
    prepared, result, _, _, _ = process_batch(1, 4, method, ctx)
    bad = type(method)()
    bad.token_weights = lambda stats, batch, ctx: type(result)(result.weights, result.denominator,
                                                              row_denominators=result.row_denominators + 1)
    stats = TokenStats(torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="add up to"):
        weigh_tokens(bad, stats, prepared, ctx)


def test_setting_must_hold_a_whole_rollout():
    assert section_problems(TrainConfig(max_completion_length=8, loss_micro_batch_tokens=9)) == []
    assert section_problems(TrainConfig(max_completion_length=8, loss_micro_batch_tokens=0)) == []
    problems = section_problems(TrainConfig(max_completion_length=8, loss_micro_batch_tokens=8))
    assert len(problems) == 1 and "train.loss_micro_batch_tokens" in problems[0]
    with pytest.raises(ConfigError, match="train.loss_micro_batch_tokens"):
        resolve({"name": "t", "preset": "tiny", "methods": ["uniform"], "seeds": [0]},
                ["train.max_completion_length=8", "train.loss_micro_batch_tokens=8"])


@pytest.mark.parametrize("chunk_rows", [0, 1])
def test_trainer_step_takes_verls_micro_batch_means(tiny_model_dir, tmp_path, chunk_rows):
    from test_trainer import direct_logp_entropy, grads, loss_inputs, make_trainer, policy_loss

    # raw_inputs: prompts of 3 tokens, completions of 5, 3, 4 and 1: rows of [8, 6, 7, 4] tokens, 25 in all; within
    # 12 tokens, 3 micro-batches: by hand (test_ties_are_broken_as_verl_breaks_them) rows {1, 3}, {0}, {2}
    trainer, model = make_trainer(tiny_model_dir, tmp_path, loss_micro_batch_tokens=12, backward_chunk_rows=chunk_rows)
    inputs = loss_inputs(trainer)
    model.zero_grad()
    trainer.accelerator.backward(policy_loss(trainer, model, inputs))
    ours = grads(model)

    model.zero_grad()
    logp, _ = direct_logp_entropy(model, inputs)
    per_token = -inputs.advantages * torch.exp(logp - logp.detach())
    verl_micro_batch_loss(per_token, inputs.completion_mask.float(), [[1, 3], [0], [2]], 4).backward()
    for a, b in zip(ours, grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
