"""Per-token statistics of sampled completions, computed in chunks of positions from the last hidden states.

logp, entropy and sum_p2 need the softmax over the whole vocabulary at every completion position. Materialising
(B, T, V) float32 logits is the memory trap (V = 152k for Qwen: 0.6 MB per position). Instead the LM head is
applied to ``chunk_size`` positions at a time; the chunk's logits are reduced to the statistics and discarded.
With more than one chunk, each chunk runs under activation checkpointing so that backward recomputes its logits
instead of keeping them: peak memory grows with chunk_size x V, not with B x T x V.

Only ``logp`` carries a gradient. ``entropy`` and ``sum_p2`` are computed from the same logits without grad and
only when asked for (the uniform baseline asks for none of them, see ``Method.needs``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

EXTRA_STATISTICS = ("entropy", "sum_p2")


def completion_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             logits_to_keep: int) -> torch.Tensor:
    """(B, L) prompt+completion -> (B, T) x H final hidden states at the positions that predict the T completion
    tokens. The model itself is called (not its inner decoder), so a DistributedDataParallel wrapper still
    all-reduces the gradients; ``logits_to_keep=1`` keeps its LM head to a single position."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1,
                use_cache=False)
    return out.hidden_states[-1][:, -logits_to_keep - 1:-1, :]


def _chunk_statistics(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      targets: torch.Tensor, temperature: float, extras: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """(N, H) hidden, (N,) targets -> logp (N,) [, entropy (N,)] [, sum_p2 (N,)] for one chunk."""
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


def token_statistics(hidden: torch.Tensor, lm_head: torch.nn.Linear, targets: torch.Tensor, extras: tuple[str, ...],
                     temperature: float = 1.0, chunk_size: int = 256) -> dict[str, torch.Tensor]:
    """(B, T, H) hidden states and (B, T) sampled token ids -> {"logp": (B, T), "entropy"?: (B, T), ...}.

    ``extras`` is a subset of EXTRA_STATISTICS; temperature divides the logits as at sampling time.
    """
    unknown = set(extras) - set(EXTRA_STATISTICS)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}; allowed: {list(EXTRA_STATISTICS)}")
    extras = tuple(name for name in EXTRA_STATISTICS if name in extras)  # fixed order
    B, T, H = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(B * T, H), targets.reshape(B * T)
    n_chunks = max(1, -(-B * T // chunk_size))
    pieces = []
    for start in range(0, B * T, chunk_size):
        args = (flat_hidden[start:start + chunk_size], lm_head.weight, lm_head.bias,
                flat_targets[start:start + chunk_size], temperature, extras)
        use_checkpoint = n_chunks > 1 and torch.is_grad_enabled() and flat_hidden.requires_grad
        pieces.append(checkpoint(_chunk_statistics, *args, use_reentrant=False) if use_checkpoint
                      else _chunk_statistics(*args))
    names = ("logp", *extras)
    return {name: torch.cat([p[i] for p in pieces]).reshape(B, T) for i, name in enumerate(names)}


def model_token_statistics(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                           extras: tuple[str, ...], temperature: float = 1.0,
                           chunk_size: int = 256) -> dict[str, torch.Tensor]:
    """Statistics of the last ``logits_to_keep`` tokens of ``input_ids`` under ``model``."""
    hidden = completion_hidden_states(model, input_ids, attention_mask, logits_to_keep)
    targets = input_ids[:, -logits_to_keep:]
    lm_head = getattr(model, "module", model).get_output_embeddings()  # DDP wraps the model in .module
    return token_statistics(hidden, lm_head, targets, extras, temperature, chunk_size)
