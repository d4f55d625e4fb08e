"""Rows of a batch in chunks, each trimmed to its own longest row or packed without padding, and statistics
stitched back to (B, T); and the split of a generation batch into mini-batches of whole prompt groups.

The training forward runs ``train.forward_chunk_rows`` rows at a time (and the backward ``backward_chunk_rows``).
Rows are sorted by length first, so each chunk holds rows of similar length and is cut to its longest prompt and
longest kept completion: what a method truncated (NAT's prefix cutting) is not computed even when other rows of
the batch are longer. With ``train.padding_free`` (the default) a chunk is packed (``packed_rows``): its rows'
real tokens are concatenated into one sequence, so the projections and MLPs of every layer run on real tokens only
and a method that shortens rows saves in proportion even when a chunk holds rows of very different kept lengths
(``harness.train.token_statistics.packed_attention_forward`` keeps attention within each row). Pure torch: the
trainer passes the function that computes one chunk's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class RowChunk:
    """rows: (b,) indices into the batch; input_ids, attention_mask: (b, P' + T') prompt and completion columns,
    P' = the chunk's longest prompt, T' = ``completion_width``, its longest kept completion."""

    rows: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_width: int


@dataclass
class PackedRows:
    """One row chunk's real tokens as a single sequence (verl's remove-padding, TRL's ``padding_free``).

    Row i contributes its real prompt tokens and its first ``c_i - 1`` completion tokens (``c_i``: position of its
    last real completion token + 1; the last completion token predicts nothing that is scored, so it is no input).

    input_ids, position_ids: (1, N), N = sum of the rows' lengths L_i, positions restart at 0 in every row (as in
    generation). gather: (b, W), W = max L_i: index into the N tokens of row i's j-th token (its last one past L_i),
    the layout attention runs in. scatter: (N,) index of each token in the flattened (b, W) layout. predict: (b, T')
    index into the N tokens of the hidden state that predicts completion token t of row i, valid where ``valid``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    gather: torch.Tensor
    scatter: torch.Tensor
    predict: torch.Tensor
    valid: torch.Tensor

    @property
    def positions(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def attention_width(self) -> int:
        return int(self.gather.shape[1])


def packed_rows(chunk: RowChunk) -> PackedRows:
    """The chunk's rows without padding. Each row's mask must be one contiguous run (left-padded prompt, completion
    mask a prefix, as TRL builds them and methods truncate them): a masked-out token inside a row would be attended
    to here, and not in the padded forward."""
    prompt_width = chunk.input_ids.shape[1] - chunk.completion_width
    mask = chunk.attention_mask
    prompt_lengths = mask[:, :prompt_width].sum(dim=1)
    cols = torch.arange(chunk.completion_width, device=mask.device)
    completion_lengths = (mask[:, prompt_width:] * (cols + 1)).amax(dim=1).clamp(min=1)  # c_i
    lengths = prompt_lengths + completion_lengths - 1  # L_i
    columns = torch.arange(mask.shape[1], device=mask.device)
    first = prompt_width - prompt_lengths  # the row's first real column
    take = (columns >= first[:, None]) & (columns < (prompt_width + completion_lengths - 1)[:, None])  # (b, P'+T')
    if not bool(mask[take].all()):
        raise ValueError("padding-free forward: a row's attention mask is not one contiguous run of real tokens; "
                         "set train.padding_free=false to forward such rows padded")
    starts = torch.cumsum(lengths, dim=0) - lengths  # (b,)
    rank = columns[None, :] - first[:, None]  # position of each column within its row
    width = int(lengths.max())
    within = torch.arange(width, device=mask.device)
    gather = starts[:, None] + torch.minimum(within[None, :], (lengths - 1)[:, None])  # (b, W)
    rows = torch.arange(len(lengths), device=mask.device)[:, None].expand_as(take)
    scatter = (rows * width + rank)[take]  # row-major, the order of input_ids[take]
    predict = starts[:, None] + prompt_lengths[:, None] - 1 + cols[None, :]  # (b, T')
    valid = cols[None, :] < completion_lengths[:, None]
    return PackedRows(chunk.input_ids[take][None], rank[take][None], gather, scatter, predict, valid)


def row_chunks(inputs: dict, rows_per_chunk: int) -> Iterator[RowChunk]:
    """Chunks of at most ``rows_per_chunk`` rows of TRL's batch dict (left-padded ``prompt_ids``/``prompt_mask``,
    right-padded ``completion_ids``/``completion_mask``), shortest rows first."""
    prompt_lengths = inputs["prompt_mask"].sum(dim=1)
    positions = torch.arange(1, inputs["completion_mask"].shape[1] + 1, device=prompt_lengths.device)
    completion_lengths = (inputs["completion_mask"] * positions).amax(dim=1).long().clamp(min=1)
    order = torch.argsort(prompt_lengths + completion_lengths, stable=True)
    for rows in order.split(rows_per_chunk):
        prompt_width, completion_width = int(prompt_lengths[rows].max()), int(completion_lengths[rows].max())
        prompt_cols = slice(inputs["prompt_ids"].shape[1] - prompt_width, None)  # prompts are left-padded
        input_ids = torch.cat([inputs["prompt_ids"][rows, prompt_cols],
                               inputs["completion_ids"][rows, :completion_width]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"][rows, prompt_cols],
                                    inputs["completion_mask"][rows, :completion_width]], dim=1)
        yield RowChunk(rows, input_ids, attention_mask, completion_width)


def statistics_by_row_chunks(inputs: dict, rows_per_chunk: int,
                             statistics_of: Callable[[RowChunk], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{name: (B, T)} assembled from ``statistics_of`` each chunk ({name: (b, T')}), zero past each chunk's width."""
    T = inputs["completion_ids"].shape[1]
    pieces, order = [], []
    for chunk in row_chunks(inputs, rows_per_chunk):
        stats = statistics_of(chunk)
        pieces.append({k: torch.nn.functional.pad(v, (0, T - chunk.completion_width)) for k, v in stats.items()})
        order.append(chunk.rows)
    inverse = torch.argsort(torch.cat(order))
    return {k: torch.cat([p[k] for p in pieces])[inverse] for k in pieces[0]}


def split_by_prompt_groups(batch: dict, group_index: torch.Tensor, groups: int, parts: int) -> list[dict]:
    """A batch dict (tensors with rows first; 0-dim tensors are shared) -> ``parts`` dicts, part j holding the rows
    whose ``group_index`` (B,), in [0, groups), lies in [j groups / parts, (j + 1) groups / parts): whole prompt
    groups, rows in their original order. A part may come out empty when a method dropped all its rollouts."""
    if groups % parts:
        raise ValueError(f"{parts} mini-batches do not divide {groups} prompt groups")
    part_of_row = torch.div(group_index, groups // parts, rounding_mode="floor")  # (B,)
    if bool(((group_index < 0) | (group_index >= groups)).any()):
        raise ValueError(f"group indices outside [0, {groups}): {group_index.unique().tolist()}")
    out = []
    for j in range(parts):
        rows = torch.nonzero(part_of_row == j).flatten()
        out.append({k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in batch.items()})
    return out
