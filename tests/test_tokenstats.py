"""Chunked token statistics equal the naive full-softmax ones, values and gradients."""

import pytest
import torch

from harness.train.token_statistics import token_statistics


def naive(hidden, lm_head, targets, temperature):
    logits = lm_head(hidden).float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    p = logp_all.exp()
    return {"logp": logp_all.gather(-1, targets[..., None]).squeeze(-1), "entropy": -(p * logp_all).sum(-1),
            "sum_p2": (p * p).sum(-1)}


@pytest.mark.parametrize("chunk_size", [1, 5, 12, 1000])
def test_chunked_statistics_match_full_softmax(chunk_size):
    torch.manual_seed(0)
    B, T, H, V = 3, 4, 8, 11
    lm_head = torch.nn.Linear(H, V, bias=False)
    hidden = torch.randn(B, T, H, requires_grad=True)
    targets = torch.randint(V, (B, T))
    chunked = token_statistics(hidden, lm_head, targets, ("entropy", "sum_p2"), 0.7, chunk_size)
    reference = naive(hidden, lm_head, targets, 0.7)
    for name in ("logp", "entropy", "sum_p2"):
        torch.testing.assert_close(chunked[name], reference[name].detach() if name != "logp" else reference[name])
    grad_chunked = torch.autograd.grad(chunked["logp"].sum(), (hidden, lm_head.weight))
    grad_reference = torch.autograd.grad(reference["logp"].sum(), (hidden, lm_head.weight))
    for a, b in zip(grad_chunked, grad_reference, strict=True):
        torch.testing.assert_close(a, b)


def test_only_logp_unless_asked_and_extras_carry_no_grad():
    lm_head = torch.nn.Linear(4, 7)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    targets = torch.randint(7, (2, 3))
    assert set(token_statistics(hidden, lm_head, targets, ())) == {"logp"}
    out = token_statistics(hidden, lm_head, targets, ("entropy",), chunk_size=2)
    assert out["logp"].requires_grad and not out["entropy"].requires_grad


def test_unknown_statistic_is_rejected():
    with pytest.raises(ValueError, match="allowed"):
        token_statistics(torch.zeros(1, 1, 2), torch.nn.Linear(2, 3), torch.zeros(1, 1, dtype=torch.long),
                         ("perplexity",))


def full_logits_statistics(model, input_ids, attention_mask, width, temperature):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -width - 1:-1]
    return naive_from_logits(logits, input_ids[:, -width:], temperature)


def naive_from_logits(logits, targets, temperature):
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    p = logp_all.exp()
    return {"logp": logp_all.gather(-1, targets[..., None]).squeeze(-1), "entropy": -(p * logp_all).sum(-1),
            "sum_p2": (p * p).sum(-1)}


@pytest.mark.parametrize("chunk_size", [3, 256])
def test_statistics_inside_the_model_forward_match_full_logits(tiny_model_dir, chunk_size):
    from harness.model.checkpoints import load_policy
    from harness.train.token_statistics import model_token_statistics

    model, _ = load_policy(tiny_model_dir)
    head = model.get_output_embeddings()
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 30, (3, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # a left-padded prompt
    ours = model_token_statistics(model, input_ids, attention_mask, 5, ("entropy", "sum_p2"), 0.8, chunk_size)
    assert model.get_output_embeddings() is head  # the LM head is put back
    reference = full_logits_statistics(model, input_ids, attention_mask, 5, 0.8)
    for name in ("logp", "entropy", "sum_p2"):
        torch.testing.assert_close(ours[name], reference[name].detach() if name != "logp" else reference[name])
    assert not ours["entropy"].requires_grad
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(ours["logp"].sum(), params)
    expected = torch.autograd.grad(reference["logp"].sum(), params)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("picked", ["some", "none"])
def test_lm_head_only_at_given_positions(tiny_model_dir, picked):
    from harness.model.checkpoints import load_policy
    from harness.train.token_statistics import model_token_statistics

    model, _ = load_policy(tiny_model_dir)
    calls = []
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    input_ids = torch.randint(4, 30, (3, 9), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones_like(input_ids)
    positions = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) < (0.5 if picked == "some" else 0.0)
    ours = model_token_statistics(model, input_ids, attention_mask, 5, ("entropy",), 0.8, 4, positions)
    # the head saw the picked positions only (one, result unused, when none is picked), in chunks of 4
    assert sum(calls) == max(int(positions.sum()), 1)
    reference = full_logits_statistics(model, input_ids, attention_mask, 5, 0.8)
    for name in ("logp", "entropy"):
        torch.testing.assert_close(ours[name][positions], reference[name].detach()[positions])
        assert ours[name][~positions].eq(0).all()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(ours["logp"].sum(), params)  # every parameter reached, as DDP expects
    expected = torch.autograd.grad((reference["logp"] * positions).sum(), params)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_models_that_transform_logits_after_the_head_are_refused(tiny_model_dir):
    from harness.model.checkpoints import load_policy
    from harness.train.token_statistics import model_token_statistics

    model, _ = load_policy(tiny_model_dir)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        model_token_statistics(model, torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4), 2, ())
