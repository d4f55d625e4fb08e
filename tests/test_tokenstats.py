"""Chunked token statistics equal the naive full-softmax ones, values and gradients."""

import copy

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


# --- one call of the LM head module per forward (ZeRO-3 and FSDP gather its weight on each call) ---------------------

def per_chunk_head_calls(hidden, lm_head, targets, extras, temperature, chunk_size):
    """The statistics as computed before one head call per forward: the head module called on each chunk, under
    activation checkpointing with grad (so called again per chunk in backward). The reference for bit-identity."""
    from torch.utils.checkpoint import checkpoint

    def chunk_statistics(h, t):
        logits = lm_head(h).float() / temperature
        log_norm = torch.logsumexp(logits, dim=-1)
        out = [logits.gather(-1, t[:, None]).squeeze(-1) - log_norm]
        with torch.no_grad():
            probs = torch.softmax(logits.detach(), dim=-1)
            out += [log_norm.detach() - (probs * logits.detach()).sum(-1), (probs * probs).sum(-1)]
        return tuple(out)

    B, T, H = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(B * T, H), targets.reshape(B * T)
    pieces = [checkpoint(chunk_statistics, flat_hidden[s:s + chunk_size], flat_targets[s:s + chunk_size],
                         use_reentrant=False) for s in range(0, B * T, chunk_size)]
    return {name: torch.cat([p[i] for p in pieces]).reshape(B, T) for i, name in enumerate(extras)}


def statistics_and_gradients(compute, hidden, lm_head, targets, chunk_size, autocast):
    hidden = hidden.clone().requires_grad_(True)
    lm_head.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = compute(hidden, lm_head, targets, ("logp", "entropy", "sum_p2"), 0.7, chunk_size)
    weights = torch.linspace(-1.0, 2.0, out["logp"].numel()).reshape(out["logp"].shape)
    (out["logp"] * weights).sum().backward()
    return out, [hidden.grad, *(p.grad for p in lm_head.parameters())]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_size", [7, 64, 1000])
def test_one_head_call_gives_the_bits_of_per_chunk_head_calls(chunk_size, bias, autocast):
    # values and gradients (hidden, weight, bias) bit-identical to the per-chunk head calls, under bf16 autocast
    # too, with one chunk and with several; except the weight's and bias's gradients under autocast with several
    # chunks, which the per-chunk calls sum in bf16 and the one call in float32 (next test)
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(16, 97, bias=bias)
    hidden, targets = torch.randn(3, 40, 16), torch.randint(97, (3, 40))

    new, new_grads = statistics_and_gradients(ours, hidden, lm_head, targets, chunk_size, autocast)
    old, old_grads = statistics_and_gradients(per_chunk_head_calls, hidden, lm_head, targets, chunk_size, autocast)
    for name in old:
        assert torch.equal(new[name], old[name]), name
    assert len(new_grads) == len(old_grads) == 2 + bias
    summed_in_float32 = autocast and chunk_size < 120
    for i, (a, b) in enumerate(zip(new_grads, old_grads, strict=True)):
        assert torch.equal(a, b) or (summed_in_float32 and i > 0)


def ours(h, head, t, names, temperature, size):
    return token_statistics(h, head, t, names[1:], temperature, size)


@pytest.mark.parametrize("dtype", ["autocast", "bfloat16"])
def test_the_head_sums_its_weight_gradient_over_chunks_in_float32(dtype):
    # 2048 positions in 128 chunks: under bf16 autocast (float32 masters) or with bf16 weights (ZeRO-3's module),
    # autograd summed the chunks' weight gradients in bf16; against float64, the one call's weight and bias
    # gradients are several times closer (measured: 0.076 vs 0.38 and 0.028 vs 0.40 under autocast), the hidden
    # states' gradient the same bits
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(64, 512)
    hidden, targets = torch.randn(1, 2048, 64), torch.randint(512, (1, 2048))
    reference_head = copy.deepcopy(lm_head).double()
    _, reference = statistics_and_gradients(per_chunk_head_calls, hidden.double(), reference_head, targets, 16, False)
    autocast = dtype == "autocast"
    if not autocast:
        lm_head, hidden = lm_head.bfloat16(), hidden.bfloat16()
    _, new = statistics_and_gradients(ours, hidden, lm_head, targets, 16, autocast)
    _, old = statistics_and_gradients(per_chunk_head_calls, hidden, copy.deepcopy(lm_head), targets, 16, autocast)
    assert torch.equal(new[0], old[0])
    for ours_grad, bf16_sum, exact in zip(new[1:], old[1:], reference[1:], strict=True):
        assert ours_grad.dtype == bf16_sum.dtype == lm_head.weight.dtype
        ours_error = float((ours_grad.double() - exact).abs().max())
        assert ours_error < float((bf16_sum.double() - exact).abs().max()) / 3
        assert ours_error < 0.02 * float(exact.abs().max())


def test_the_head_module_is_called_once_in_forward_and_backward():
    # 120 positions in chunks of 7: one call (18 before: 18 chunks, each recomputed in backward: 36)
    lm_head = torch.nn.Linear(8, 13)
    calls = []
    lm_head.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    hidden = torch.randn(4, 30, 8, requires_grad=True)
    out = token_statistics(hidden, lm_head, torch.randint(13, (4, 30)), ("entropy",), chunk_size=7)
    out["logp"].sum().backward()
    assert calls == [torch.Size([120, 8])]
    assert "forward" not in vars(lm_head)  # its own forward again
    assert lm_head(torch.zeros(2, 8)).shape == (2, 13)


def test_no_logits_are_kept_for_backward():
    # the memory property: what the forward keeps for backward is O(N x H + chunk x V), never an (N, V) block
    V, H, N, chunk = 500, 8, 200, 16
    lm_head = torch.nn.Linear(H, V, bias=False)
    hidden = torch.randn(1, N, H, requires_grad=True)
    saved = []

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = token_statistics(hidden, lm_head, torch.randint(V, (1, N)), ("entropy", "sum_p2"), chunk_size=chunk)
    out["logp"].sum().backward()
    assert saved and max(saved) <= V * H  # the weight itself; an (N, V) block would be 100,000


def test_tied_embeddings_get_the_head_gradient_once_per_call():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.train.token_statistics import model_token_statistics

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    input_ids = torch.randint(50, (2, 9), generator=torch.Generator().manual_seed(4))
    attention_mask = torch.ones_like(input_ids)
    ours = model_token_statistics(model, input_ids, attention_mask, 5, ("entropy",), 0.8, 3)
    reference = full_logits_statistics(model, input_ids, attention_mask, 5, 0.8)
    torch.testing.assert_close(ours["logp"], reference["logp"])
    params = [p for p in model.parameters() if p.requires_grad]
    for a, b in zip(torch.autograd.grad(ours["logp"].sum(), params),
                    torch.autograd.grad(reference["logp"].sum(), params), strict=True):
        torch.testing.assert_close(a, b)
