"""Rows of a batch in chunks, each trimmed to its own longest row, and statistics stitched back to (B, T); and
the split of a generation batch into mini-batches of whole prompt groups.

The training forward runs ``train.forward_chunk_rows`` rows at a time (and the backward ``backward_chunk_rows``).
Rows are sorted by length first, so each chunk holds rows of similar length and is cut to its longest prompt and
longest kept completion: what a method truncated (NAT's prefix cutting) is not computed even when other rows of
the batch are longer. Pure torch: the trainer passes the function that computes one chunk's statistics.
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
