"""Per-token statistics of sampled completions, computed in chunks of positions inside the model's own forward.

logp, entropy and sum_p2 need the softmax over the whole vocabulary at every completion position. Materialising
(B, T, V) float32 logits is the memory trap (V = 152k for Qwen: 0.6 MB per position). Instead the LM head is
applied to ``chunk_size`` positions at a time; the chunk's logits are reduced to the statistics and discarded.
With grad, each chunk runs under activation checkpointing so that backward recomputes its logits instead of keeping
them: peak memory grows with chunk_size x V, not with B x T x V. This holds for a single chunk too: the trainer runs
several row chunks before one backward, and a kept (T x V) block per row chunk would add up (measured: 8 one-row
chunks of 256 positions kept 2.3x the activations of one checkpointed chunk, bench/nat_savings.py). The price is
one more LM-head matmul per position in backward.

Where the chunks run: for the duration of one call the model's LM head is swapped for ``StatisticsHead``, which
calls the original head module chunk by chunk and returns the statistics in place of logits. So the model (and
whatever wraps it) runs its own forward: DistributedDataParallel still all-reduces the gradients, and under
DeepSpeed ZeRO-3 or FSDP the head's weights are gathered by the wrapper's hooks exactly as for a normal forward
(the head module is called, its weight is never read directly).

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


def _position_chunk_statistics(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor,
                               temperature: float, extras: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """(N, H) hidden, (N,) targets -> logp (N,) [, entropy (N,)] [, sum_p2 (N,)] for one chunk of positions
    (flattened over rows; the trainer's row chunks are ``harness.train.row_chunks``)."""
    logits = lm_head(hidden).float() / temperature  # (N, V)
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


def token_statistics(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, extras: tuple[str, ...],
                     temperature: float = 1.0, chunk_size: int = 256) -> dict[str, torch.Tensor]:
    """(B, T, H) hidden states and (B, T) sampled token ids -> {"logp": (B, T), "entropy"?: (B, T), ...}.

    ``extras`` is a subset of EXTRA_STATISTICS; temperature divides the logits as at sampling time.
    """
    extras = _ordered(extras)
    B, T, H = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(B * T, H), targets.reshape(B * T)
    pieces = []
    for start in range(0, B * T, chunk_size):
        args = (flat_hidden[start:start + chunk_size], lm_head, flat_targets[start:start + chunk_size], temperature,
                extras)
        use_checkpoint = torch.is_grad_enabled() and flat_hidden.requires_grad
        pieces.append(checkpoint(_position_chunk_statistics, *args, use_reentrant=False) if use_checkpoint
                      else _position_chunk_statistics(*args))
    names = ("logp", *extras)
    return {name: torch.cat([p[i] for p in pieces]).reshape(B, T) for i, name in enumerate(names)}


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
        names = ("logp", *self.extras)
        if self.shifted:
            hidden = hidden[:, :-1, :]
        if self.positions is None:
            stats = token_statistics(hidden, self.head, self.targets, self.extras, self.temperature, self.chunk_size)
            return torch.stack([stats[name] for name in names], dim=-1)
        positions = self.positions
        empty = not bool(positions.any())  # a CPU-GPU sync point, once per row chunk
        if empty:
            # the head still runs (on one position, result unused): under ZeRO-3/FSDP every process must call it to
            # gather its weights, and backward must reach the weights (a zero gradient) as DDP expects
            positions = torch.zeros_like(positions)
            positions.view(-1)[0] = True
        # the N picked positions as one row: (1, N, H) -> (N, n), scattered back into zeros (B, T, n)
        stats = token_statistics(hidden[positions][None], self.head, self.targets[positions][None], self.extras,
                                 self.temperature, self.chunk_size)
        picked = torch.stack([stats[name][0] for name in names], dim=-1)
        out = picked.new_zeros(*positions.shape, len(names))
        return out + 0.0 * picked.sum() if empty else out.index_put((positions,), picked)


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
