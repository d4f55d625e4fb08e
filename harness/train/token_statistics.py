"""Per-token statistics of sampled completions, computed in chunks of positions inside the model's own forward.

logp, entropy and sum_p2 need the softmax over the whole vocabulary at every completion position. Materialising
(B, T, V) float32 logits is the memory trap (V = 152k for Qwen: 0.6 MB per position). Instead the LM head's matmul
runs on ``chunk_size`` positions at a time; the chunk's logits are reduced to the statistics and discarded. With
grad, each chunk runs under activation checkpointing, so that backward recomputes its logits instead of keeping
them: peak memory grows with chunk_size x V, not with B x T x V. This holds for a single chunk too: the trainer
runs several row chunks before one backward, and a kept (T x V) block per row chunk would add up (measured: 8
one-row chunks of 256 positions kept 2.3x the activations of one checkpointed chunk, bench/nat_savings.py). The
price is one more LM-head matmul per position in backward.

Where the chunks run: for the duration of one call the model's LM head is swapped for ``StatisticsHead``, which
calls the original head module ONCE, on all the (N, H) hidden states that reach it, with that module's ``forward``
replaced for the call by the chunked statistics (``_one_head_call``). So the model (and whatever wraps it) runs its
own forward, and the head's weights are only ever read inside a call of the head module: DistributedDataParallel
still all-reduces the gradients, and under DeepSpeed ZeRO-3 or FSDP the wrapper's hooks gather the head's weight for
that call (and once more for its backward) exactly as for a normal forward.

Why exactly one head call per model forward: ZeRO-3 gathers a module's parameters on every call of the module (an
all-gather over all processes; FSDP likewise per unit), so the number of calls must be the same on every process.
The number of chunks is not: it follows the process's own token count (ceil(N / chunk_size)), which differs
between processes whenever their completions differ in length. Calling the head once per chunk (and again per
chunk when activation checkpointing recomputed it in backward) made the processes issue different numbers of
all-gathers: gloo aborts on a size mismatch, NCCL hangs or pairs up the wrong tensors (measured on CPU with 2
processes: ZeRO-3 aborted in the first backward, no-grad passes hung). The same reason makes ``generate`` need
``synced_gpus`` under ZeRO-3. TRL 1.16's fused LM-head loss reads the weight outside the module instead, gathering
it by hand (``trl.trainer.utils``, ``deepspeed.zero.GatheredParameters``, again in its backward); verl's fused PPO
kernel (``_fused_linear_for_ppo_fwd``) likewise takes the head's weight as an argument. The row chunks of the
trainer make the same agreement one level up: ``Actor.statistics`` runs as many model forwards on every process
(``harness.train.actor``).

Numerics: inside the one call the chunks run exactly what the per-chunk head calls ran (``F.linear`` on the head's
weight and bias, as nn.Linear computes it, under the same checkpointing), so values and the hidden states' gradients
are the same bits as before, under autocast too (the matmul in the autocast dtype, as nn.Linear's). In float32 the
weight's per-chunk gradients reach it one by one, summed by autograd. Where the head computes in bf16 (autocast over
float32 masters, or ZeRO-3's bf16 module) autograd would sum them in bf16, rounding the running sum at every chunk
(thousands per forward at the papers' lengths), so there ``HeadInFloat32Sum`` sums them in float32 and rounds once
(against float64 on 128 chunks: 5x closer for the weight, 14x for the bias; tests/test_tokenstats.py). Tied
embeddings: the head's weight is the embedding's, and its gradient adds to the embedding's as before. Backward
under ZeRO-3: its pre-backward hook on the head's output gathers the weight once before any chunk is recomputed;
the post-backward hook on the head's input releases it after the last.

Padding-free (``train.padding_free``, ``packed_model_token_statistics``): a row chunk's real tokens run as one
sequence (``harness.train.row_chunks.packed_rows``); the LM head gets only the hidden states that predict completion
tokens (``logits_to_keep`` as an index). The model's attention implementation is switched (once, for good) from
``sdpa`` to ``PACKED_ATTENTION`` (registered in transformers' attention and mask interfaces): a call that carries
the chunk's ``packed_layout`` gathers queries, keys and values into the chunk's (rows, longest row) layout, runs
causal SDPA there and scatters the output back; every other call (generation, the padded forward) is transformers'
own sdpa, mask included. The choice depends on the call's arguments, not on state: activation checkpointing
recomputes a layer in backward, after the forward has returned, and must take the same path.
Why not a block-diagonal mask over the packed sequence: on CPU there is no varlen kernel, and SDPA with an (N, N)
mask computes all N^2 pairs of the packed length (8 rows of 137 tokens: 8x the pairs of the rows apart).
Projections and MLPs, nearly all the FLOPs of a small model, see the N real tokens; attention, the rest, sees each
row causally up to the chunk's longest row, as it did padded.

Only ``logp`` carries a gradient. ``entropy`` and ``sum_p2`` are computed from the same logits without grad and
only when asked for (the uniform baseline asks for none of them, see ``Method.needs``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from harness.train.row_chunks import PackedRows
from methods.base import LOGIT_STATISTICS

EXTRA_STATISTICS = LOGIT_STATISTICS  # entropy, sum_p2: named once, in the Method interface
# config attributes of models that transform the head's logits after the head; the statistics would miss that
UNSUPPORTED_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def _position_chunk_statistics(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               targets: torch.Tensor, temperature: float,
                               extras: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """(N, H) hidden, (N,) targets -> logp (N,) [, entropy (N,)] [, sum_p2 (N,)] for one chunk of positions
    (flattened over rows; the trainer's row chunks are ``harness.train.row_chunks``), through the head's weight
    (V, H) and bias (V,) or None, as nn.Linear computes it."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature  # (N, V)
    log_norm = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm
    out = [logp]
    if extras:
        with torch.no_grad():
            logits = logits.detach()
            probs = torch.softmax(logits, dim=-1)
            if "entropy" in extras:
                out.append(log_norm.detach() - (probs * logits).sum(-1))  # H = log Z - E_p[z]
            if "sum_p2" in extras:
                out.append((probs * probs).sum(-1))
    return tuple(out)


def _chunked_statistics(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        targets: torch.Tensor, temperature: float, extras: tuple[str, ...],
                        chunk_size: int) -> tuple[torch.Tensor, ...]:
    """(N, H) hidden, (N,) targets -> (logp, *extras), each (N,), ``chunk_size`` positions at a time. With grad,
    each chunk runs under activation checkpointing (non-reentrant: backward recomputes its logits under the
    forward's autocast state), so no chunk's logits outlive it; where the head computes in a lower precision than
    float32 (autocast, or bf16 weights), ``HeadInFloat32Sum`` does the same and sums the weight's per-chunk
    gradients in float32."""
    compute = _head_compute_dtype(hidden, weight)
    if compute != torch.float32 and torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        stacked = HeadInFloat32Sum.apply(hidden, weight, bias, targets, temperature, extras, chunk_size, compute)
        return tuple(stacked[:, i] for i in range(1 + len(extras)))
    pieces = []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (hidden[start:start + chunk_size], weight, bias, targets[start:start + chunk_size], temperature,
                extras)
        use_checkpoint = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        pieces.append(checkpoint(_position_chunk_statistics, *args, use_reentrant=False) if use_checkpoint
                      else _position_chunk_statistics(*args))
    return tuple(torch.cat([piece[i] for piece in pieces]) for i in range(1 + len(extras)))


def _head_compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype nn.Linear's matmul runs in here: autocast's where autocast is on, else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


class HeadInFloat32Sum(torch.autograd.Function):
    """The chunked head of ``_chunked_statistics`` with the weight's (and bias's) gradient summed over the chunks in
    float32. Per chunk, the values and gradients are what a checkpointed nn.Linear chunk gives (the matmul in
    ``compute``, autocast's dtype or the weight's: inputs cast as autocast casts them); autograd would sum the
    chunks' weight gradients in ``compute`` (into autocast's cached bf16 copy of the weight, or into a bf16
    weight under ZeRO-3), rounding the running sum at every chunk: thousands of chunks per forward at the papers'
    lengths. Here each chunk's bf16 product is added to a float32 sum, rounded once to the weight's dtype. Like
    checkpointing, backward recomputes each chunk's logits (one more head matmul per position); the weight is read
    in backward as its module's hooks left it (ZeRO-3 gathers it again before the head's backward)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, extras, chunk_size, compute):
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk_size, ctx.compute = temperature, chunk_size, compute
        device = hidden.device.type
        with torch.autocast(device, enabled=False):
            w, b = weight.to(compute), None if bias is None else bias.to(compute)
            pieces = [torch.stack(_position_chunk_statistics(hidden[i:i + chunk_size].to(compute), w, b,
                                                             targets[i:i + chunk_size], temperature, extras), -1)
                      for i in range(0, hidden.shape[0], chunk_size)]
        return torch.cat(pieces)

    @staticmethod
    def backward(ctx, grad_stacked):
        hidden, weight, bias, targets = ctx.saved_tensors
        chunk_size, compute = ctx.chunk_size, ctx.compute
        grad_logp = grad_stacked[:, 0]  # the extras carry no gradient
        weight_sum = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        bias_sum = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        grad_hidden = []
        with torch.enable_grad(), torch.autocast(hidden.device.type, enabled=False):
            w = weight.detach().to(compute).requires_grad_()
            b = None if bias is None else bias.detach().to(compute).requires_grad_()
            for i in range(0, hidden.shape[0], chunk_size):
                h = hidden[i:i + chunk_size].detach().requires_grad_()
                logp = _position_chunk_statistics(h.to(compute), w, b, targets[i:i + chunk_size], ctx.temperature,
                                                  ())[0]
                grads = torch.autograd.grad(logp, [h, w] + ([] if b is None else [b]), grad_logp[i:i + chunk_size])
                grad_hidden.append(grads[0])
                weight_sum += grads[1].float()
                if b is not None:
                    bias_sum += grads[2].float()
        needs = ctx.needs_input_grad
        return (torch.cat(grad_hidden) if needs[0] else None, weight_sum.to(weight.dtype) if needs[1] else None,
                None if bias is None or not needs[2] else bias_sum.to(bias.dtype), None, None, None, None, None)


@contextmanager
def _forward_replaced(module: torch.nn.Module, forward):
    """``module.forward`` is ``forward`` inside the block (an instance attribute, so hooks registered on the module,
    ZeRO-3's and FSDP's among them, still run around it), the module's own after."""
    own = module.__dict__.get("forward")  # a forward some wrapper already set on the instance, if any
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _one_head_call(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, extras: tuple[str, ...],
                   temperature: float, chunk_size: int) -> torch.Tensor:
    """(N, H) hidden, (N,) targets -> (N, 1 + len(extras)) statistics from ONE call of ``lm_head`` (an nn.Linear or
    a module with its ``weight`` and ``bias``), whose forward computes them chunk by chunk from its parameters as
    gathered for that call."""
    def statistics_forward(states: torch.Tensor) -> torch.Tensor:
        outs = _chunked_statistics(states, lm_head.weight, getattr(lm_head, "bias", None), targets, temperature,
                                   extras, chunk_size)
        return torch.stack(outs, dim=-1)

    with _forward_replaced(lm_head, statistics_forward):
        return lm_head(hidden)


def token_statistics(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, extras: tuple[str, ...],
                     temperature: float = 1.0, chunk_size: int = 256) -> dict[str, torch.Tensor]:
    """(B, T, H) hidden states and (B, T) sampled token ids -> {"logp": (B, T), "entropy"?: (B, T), ...}, from one
    call of ``lm_head``, ``chunk_size`` positions at a time inside it.

    ``extras`` is a subset of EXTRA_STATISTICS; temperature divides the logits as at sampling time.
    """
    extras = _ordered(extras)
    B, T, H = hidden.shape
    stacked = _one_head_call(hidden.reshape(B * T, H), lm_head, targets.reshape(B * T), extras, temperature,
                             chunk_size)
    out = {"logp": stacked[:, 0].reshape(B, T)}
    out.update({name: stacked[:, i].detach().reshape(B, T) for i, name in enumerate(extras, start=1)})
    return out


def _ordered(extras: tuple[str, ...]) -> tuple[str, ...]:
    unknown = set(extras) - set(EXTRA_STATISTICS)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}; allowed: {list(EXTRA_STATISTICS)}")
    return tuple(name for name in EXTRA_STATISTICS if name in extras)  # fixed order


class StatisticsHead(torch.nn.Module):
    """Stands in for the LM head during one forward: (B, T + 1, H) hidden states of the kept positions ->
    (B, T, n) statistics of the T completion tokens (the last position predicts nothing sampled).

    ``positions`` (B, T) bool, optional: only these positions reach the LM head; the statistics are 0 elsewhere
    (the layers below still run at every position: a later position's hidden state needs the earlier ones)."""

    def __init__(self, head: torch.nn.Module, targets: torch.Tensor, extras: tuple[str, ...], temperature: float,
                 chunk_size: int, positions: torch.Tensor | None = None, shifted: bool = True):
        super().__init__()
        self.head = head
        self.targets, self.extras, self.temperature, self.chunk_size = targets, extras, temperature, chunk_size
        self.positions = positions
        self.shifted = shifted  # False: hidden (1, M, H) holds exactly the M predicting states (the packed forward)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.shifted:
            hidden = hidden[:, :-1, :]
        if self.positions is None:
            B, T, H = hidden.shape
            return self._statistics(hidden.reshape(B * T, H), self.targets.reshape(B * T)).reshape(B, T, -1)
        positions = self.positions
        empty = not bool(positions.any())  # a CPU-GPU sync point, once per row chunk
        if empty:
            # the head still runs (on one position, result unused): under ZeRO-3/FSDP every process must call it to
            # gather its weights, and backward must reach the weights (a zero gradient) as DDP expects
            positions = torch.zeros_like(positions)
            positions.view(-1)[0] = True
        # the N picked positions: (N, H) -> (N, n), scattered back into zeros (B, T, n)
        picked = self._statistics(hidden[positions], self.targets[positions])
        out = picked.new_zeros(*positions.shape, picked.shape[-1])
        return out + 0.0 * picked.sum() if empty else out.index_put((positions,), picked)

    def _statistics(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(N, H), (N,) -> (N, n): one call of the original head, whatever N (module docstring)."""
        return _one_head_call(hidden, self.head, targets, self.extras, self.temperature, self.chunk_size)


def unwrapped(model) -> torch.nn.Module:
    """The transformers model inside a DDP wrapper or DeepSpeed engine (both keep it in ``.module``)."""
    return getattr(model, "module", model)


@contextmanager
def _head_swapped(model, head: torch.nn.Module):
    inner = unwrapped(model)
    original = inner.get_output_embeddings()
    inner.set_output_embeddings(head)
    try:
        yield
    finally:
        inner.set_output_embeddings(original)


def check_plain_logits(model) -> None:
    config = unwrapped(model).config
    used = [name for name in UNSUPPORTED_LOGIT_TRANSFORMS if getattr(config, name, None) not in (None, 1.0)]
    if used:
        raise ValueError(f"model config sets {used}: its logits are transformed after the LM head, which the token "
                         "statistics (harness/train/token_statistics.py) do not reproduce; this model is not supported")


def model_token_statistics(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                           extras: tuple[str, ...], temperature: float = 1.0, chunk_size: int = 256,
                           positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Statistics of the last ``logits_to_keep`` tokens of ``input_ids`` under ``model`` (wrapped or not);
    ``positions`` (B, logits_to_keep) bool: the LM head runs only there, statistics 0 elsewhere (None: everywhere)."""
    extras = _ordered(extras)
    check_plain_logits(model)
    original = unwrapped(model).get_output_embeddings()
    if positions is not None:
        positions = positions.to(device=input_ids.device, dtype=torch.bool)
    head = StatisticsHead(original, input_ids[:, -logits_to_keep:], extras, temperature, chunk_size, positions)
    with _head_swapped(model, head):
        stacked = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1,
                        use_cache=False).logits
    out = {"logp": stacked[..., 0]}
    out.update({name: stacked[..., i].detach() for i, name in enumerate(extras, start=1)})
    return out


# --- padding-free forward ----------------------------------------------------------------------------------------

PACKED_ATTENTION = "harness_packed"


@dataclass
class PackedLayout:
    """What ``packed_attention_forward`` needs, passed down through the model's forward kwargs; ``calls`` counts
    the attention calls, so a model whose attention bypasses transformers' AttentionInterface (and would attend
    across rows) is refused."""

    gather: torch.Tensor  # (b, W) index into the N packed tokens
    scatter: torch.Tensor  # (N,) index into the flattened (b, W) layout
    calls: int = 0


def packed_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             packed_layout: PackedLayout | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """With ``packed_layout``: (1, heads, N, d) packed query/key/value -> (1, N, heads, d), causal attention within
    each row (``attention_mask`` is the placeholder, unused). Padded slots of the (b, W) layout repeat the row's last
    token; causally no real query reaches them, and their outputs are dropped by the scatter. Without: sdpa."""
    if packed_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError("padding-free forward: sliding-window and soft-capped attention are not supported; set "
                         "train.padding_free=false")
    packed_layout.calls += 1
    gather = packed_layout.gather
    b, width = gather.shape

    def padded(states: torch.Tensor) -> torch.Tensor:  # (1, h, N, d) -> (b, h, W, d)
        return states[0][:, gather].transpose(0, 1)

    out, _ = sdpa_attention_forward(module, padded(query), padded(key), padded(value), None, dropout=dropout,
                                    scaling=scaling, is_causal=True)  # (b, W, heads, d)
    return out.reshape(b * width, *out.shape[2:])[packed_layout.scatter][None], None


AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # unpacked calls get sdpa's mask


def _enable_packed_attention(model) -> None:
    config = unwrapped(model).config
    if config._attn_implementation == PACKED_ATTENTION:
        return
    if config._attn_implementation != "sdpa":
        raise ValueError(f"padding-free forward needs a model loaded with attn_implementation='sdpa', this one uses "
                         f"{config._attn_implementation!r}; set train.padding_free=false")
    config._attn_implementation = PACKED_ATTENTION


def packed_model_token_statistics(model, packed: PackedRows, completion_ids: torch.Tensor, extras: tuple[str, ...],
                                  temperature: float = 1.0, chunk_size: int = 256,
                                  positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``model_token_statistics`` of one packed row chunk: {name: (b, T')} for ``completion_ids`` (b, T'), 0 past
    each row's completion and outside ``positions`` (b, T') bool (the LM head runs only there). Switches the model's
    attention implementation to ``PACKED_ATTENTION`` (sdpa for every unpacked call)."""
    extras = _ordered(extras)
    check_plain_logits(model)
    wanted = packed.valid if positions is None else packed.valid & positions.to(packed.valid.device, torch.bool)
    empty = not bool(wanted.any())
    if empty:  # the head still runs on one position (see StatisticsHead), result unused
        wanted = torch.zeros_like(wanted)
        wanted.view(-1)[0] = True
    index = packed.predict[wanted]  # (M,) states that predict the wanted tokens, in row-major order
    head = StatisticsHead(unwrapped(model).get_output_embeddings(), completion_ids[wanted][None], extras,
                          temperature, chunk_size, shifted=False)
    layout = PackedLayout(packed.gather, packed.scatter)
    _enable_packed_attention(model)
    # a 4D mask passes transformers' mask creation as it is (no (N, N) mask built from the restarting positions);
    # the packed attention ignores it
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=packed.input_ids.device)
    with _head_swapped(model, head):
        picked = model(input_ids=packed.input_ids, attention_mask=placeholder, position_ids=packed.position_ids,
                       logits_to_keep=index, use_cache=False, packed_layout=layout).logits[0]  # (M, n)
    if layout.calls == 0:
        raise ValueError(f"model {type(unwrapped(model)).__name__} does not dispatch attention through "
                         "transformers' AttentionInterface, so a packed forward would attend across rows; set "
                         "train.padding_free=false")
    out = picked.new_zeros(*wanted.shape, picked.shape[-1])
    stacked = out + 0.0 * picked.sum() if empty else out.index_put((wanted,), picked)
    result = {"logp": stacked[..., 0]}
    result.update({name: stacked[..., i].detach() for i, name in enumerate(extras, start=1)})
    return result
