"""Rows of a batch in chunks, each trimmed to its own longest row or packed without padding, and statistics
stitched back to (B, T); and the split of a generation batch into mini-batches of whole prompt groups.

The training forward runs ``train.forward_chunk_rows`` rows at a time (and the backward ``backward_chunk_rows``),
and, with ``train.forward_chunk_tokens`` (``backward_chunk_tokens``), no more rows than fit that many padded tokens:
short rows run many to a chunk, long ones few (``chunk_plan``). Rows are sorted by length first, so each chunk holds
rows of similar length and is cut to its longest prompt and longest kept completion: what a method truncated (NAT's
prefix cutting) is not computed even when other rows of the batch are longer. With ``train.padding_free`` (the
default) a chunk is packed (``packed_rows``): its rows' real tokens are concatenated into one sequence, so the
projections and MLPs of every layer run on real tokens only and a method that shortens rows saves in proportion even
when a chunk holds rows of very different kept lengths (``harness.train.token_statistics.packed_attention_forward``
keeps attention within each row). With ``train.share_prompts`` (the default) the rollouts of one prompt in a chunk
share one copy of its prompt, so a GRPO group of G rollouts computes its prompt once, not G times. Pure torch: the
trainer passes the function that computes one chunk's statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Self

import torch


@dataclass(frozen=True)
class Sequences:
    """Rows of prompts and completions as the forwards read them: ``prompt_ids``/``prompt_mask`` (B, P) left-padded,
    ``completion_ids``/``completion_mask`` (B, T) right-padded (TRL's layout and dtypes). Subclasses add per-row
    fields (``harness.train.step_batch.StepBatch``); ``rows`` selects rows of every one of them."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def rows(self, index: torch.Tensor) -> Self:
        """The rows ``index`` (B',) of every per-row field: tensors, dicts of tensors (a method's extras); None
        stays None."""
        def select(value):
            if isinstance(value, dict):
                return {k: v[index] for k, v in value.items()}
            return None if value is None else value[index]
        return dataclasses.replace(self, **{f.name: select(getattr(self, f.name)) for f in dataclasses.fields(self)})


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

    Row i contributes its first ``c_i - 1`` completion tokens (``c_i``: position of its last real completion token
    + 1; the last completion token predicts nothing that is scored, so it is no input) and, unless an earlier row of
    the chunk has the same prompt (``share_prompts``: the rollouts of one prompt group), its real prompt tokens:
    a shared prompt is computed once, and each of its rows attends to that one copy.

    input_ids, position_ids: (1, N), N = the computed tokens, positions restart at 0 in every row (as in generation).
    gather: (b, W), W = max L_i, L_i = row i's prompt length + c_i - 1: index into the N tokens of row i's j-th
    token (its last one past L_i), the layout attention runs in. scatter: (N,) index of each token in the flattened
    (b, W) layout (a shared prompt token: in its first row). predict: (b, T') index into the N tokens of the hidden
    state that predicts completion token t of row i, valid where ``valid``."""

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


def packed_rows(chunk: RowChunk, share_prompts: bool = True) -> PackedRows:
    """The chunk's rows without padding. Each row's mask must be one contiguous run (left-padded prompt, completion
    mask a prefix, as TRL builds them and methods truncate them): a masked-out token inside a row would be attended
    to here, and not in the padded forward. ``share_prompts``: rows with equal real prompt tokens share one copy
    (exact: a prompt token attends only to the prompt before it, so its states are the same in every row)."""
    prompt_width = chunk.input_ids.shape[1] - chunk.completion_width
    mask = chunk.attention_mask
    prompt_lengths = mask[:, :prompt_width].sum(dim=1)  # p_i
    cols = torch.arange(chunk.completion_width, device=mask.device)
    completion_lengths = (mask[:, prompt_width:] * (cols + 1)).amax(dim=1).clamp(min=1)  # c_i
    lengths = prompt_lengths + completion_lengths - 1  # L_i
    columns = torch.arange(mask.shape[1], device=mask.device)
    first = prompt_width - prompt_lengths  # the row's first real column
    real = (columns >= first[:, None]) & (columns < (prompt_width + completion_lengths - 1)[:, None])  # (b, P'+T')
    if not bool(mask[real].all()):
        raise ValueError("padding-free forward: a row's attention mask is not one contiguous run of real tokens; "
                         "set train.padding_free=false to forward such rows padded")
    rows = torch.arange(len(lengths), device=mask.device)
    owner = _prompt_owners(chunk.input_ids[:, :prompt_width], mask[:, :prompt_width]) if share_prompts else rows
    owns_prompt = owner == rows
    take = real & ((columns >= prompt_width)[None, :] | owns_prompt[:, None])  # what row i contributes, in order
    counts = take.sum(dim=1)
    starts = torch.cumsum(counts, dim=0) - counts  # (b,) where row i's contribution begins
    prompt_start = starts[owner]  # where row i's prompt lies (in its owner's contribution)
    completion_start = starts + torch.where(owns_prompt, prompt_lengths, 0)

    def index(within: torch.Tensor) -> torch.Tensor:  # (b, n) token positions within each row -> packed indices
        in_prompt = within < prompt_lengths[:, None]
        return torch.where(in_prompt, prompt_start[:, None] + within,
                           completion_start[:, None] + within - prompt_lengths[:, None])

    width = int(lengths.max())
    within = torch.arange(width, device=mask.device)
    gather = index(torch.minimum(within[None, :], (lengths - 1)[:, None]))  # (b, W)
    rank = columns[None, :] - first[:, None]  # position of each column within its row
    scatter = (rows[:, None] * width + rank)[take]  # row-major, the order of input_ids[take]
    predict = index(prompt_lengths[:, None] - 1 + cols[None, :])  # (b, T')
    valid = cols[None, :] < completion_lengths[:, None]
    return PackedRows(chunk.input_ids[take][None], rank[take][None], gather, scatter, predict, valid)


def _prompt_owners(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """(b, P') left-padded prompts -> (b,) index of the first row with the same real prompt tokens."""
    keys = torch.where(prompt_mask.bool(), prompt_ids, -1)
    _, group = torch.unique(keys, dim=0, return_inverse=True)
    rows = torch.arange(len(group), device=group.device)
    first_row = torch.full((int(group.max()) + 1,), len(group), device=group.device)
    return first_row.scatter_reduce(0, group, rows, reduce="amin")[group]


def chunk_plan(inputs: Sequences, rows_per_chunk: int, tokens_per_chunk: int = 0) -> list[torch.Tensor]:
    """The row chunks of ``inputs`` as row indices, shortest rows first: a chunk takes the next row while it
    holds fewer than ``rows_per_chunk`` rows and, with ``tokens_per_chunk`` > 0, while its padded size (rows x
    (longest prompt + longest completion), the shape a padded forward computes and a bound of the packed one's)
    stays within ``tokens_per_chunk``; a row longer than that gets a chunk to itself. Pure arithmetic on the masks:
    every process knows its count before any forward."""
    prompt_lengths = inputs.prompt_mask.sum(dim=1)
    completion_lengths = _completion_lengths(inputs.completion_mask)
    order = torch.argsort(prompt_lengths + completion_lengths, stable=True)
    if not tokens_per_chunk:
        return list(order.split(rows_per_chunk))
    plan, start, prompt_width, completion_width = [], 0, 0, 0
    for end, (p, c) in enumerate(zip(prompt_lengths[order].tolist(), completion_lengths[order].tolist(), strict=True)):
        width = max(prompt_width, p) + max(completion_width, c)
        if end > start and (end - start == rows_per_chunk or (end - start + 1) * width > tokens_per_chunk):
            plan.append(order[start:end])
            start, prompt_width, completion_width = end, 0, 0
        prompt_width, completion_width = max(prompt_width, p), max(completion_width, c)
    return plan + [order[start:]]


def _completion_lengths(completion_mask: torch.Tensor) -> torch.Tensor:
    """(B,) position of each row's last real completion token + 1, at least 1."""
    positions = torch.arange(1, completion_mask.shape[1] + 1, device=completion_mask.device)
    return (completion_mask * positions).amax(dim=1).long().clamp(min=1)


def row_chunks(inputs: Sequences, plan: list[torch.Tensor]) -> Iterator[RowChunk]:
    """The chunks of ``plan`` (``chunk_plan``), each cut to its longest prompt and longest kept completion."""
    prompt_lengths = inputs.prompt_mask.sum(dim=1)
    completion_lengths = _completion_lengths(inputs.completion_mask)
    for rows in plan:
        prompt_width, completion_width = int(prompt_lengths[rows].max()), int(completion_lengths[rows].max())
        prompt_cols = slice(inputs.prompt_ids.shape[1] - prompt_width, None)  # prompts are left-padded
        input_ids = torch.cat([inputs.prompt_ids[rows, prompt_cols],
                               inputs.completion_ids[rows, :completion_width]], dim=1)
        attention_mask = torch.cat([inputs.prompt_mask[rows, prompt_cols],
                                    inputs.completion_mask[rows, :completion_width]], dim=1)
        yield RowChunk(rows, input_ids, attention_mask, completion_width)


def rows_not_packable(inputs: Sequences) -> int:
    """How many rows' masks are not one contiguous run (a left-padded prompt, a completion mask that is a prefix up
    to its last real token): what ``packed_rows`` refuses, known before any forward."""
    prompt_mask, completion_mask = inputs.prompt_mask.bool(), inputs.completion_mask.bool()
    prompt_ok = (prompt_mask[:, 1:] >= prompt_mask[:, :-1]).all(dim=1)  # once real, real to the end
    last = _completion_lengths(completion_mask)  # (B,)
    before_last = torch.arange(completion_mask.shape[1], device=last.device)[None, :] < last[:, None]
    completion_ok = (completion_mask | ~before_last).all(dim=1) | ~completion_mask.any(dim=1)
    return int((~(prompt_ok & completion_ok)).sum())


def statistics_by_row_chunks(inputs: Sequences, plan: list[torch.Tensor],
                             statistics_of: Callable[[RowChunk], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{name: (B, T)} assembled from ``statistics_of`` each chunk of ``plan`` ({name: (b, T')}), zero past each
    chunk's width."""
    T = inputs.completion_ids.shape[1]
    pieces, order = [], []
    for chunk in row_chunks(inputs, plan):
        stats = statistics_of(chunk)
        pieces.append({k: torch.nn.functional.pad(v, (0, T - chunk.completion_width)) for k, v in stats.items()})
        order.append(chunk.rows)
    inverse = torch.argsort(torch.cat(order))
    return {k: torch.cat([p[k] for p in pieces])[inverse] for k in pieces[0]}


def split_by_prompt_groups(batch: Sequences, group_index: torch.Tensor, groups: int, parts: int) -> list[Sequences]:
    """``batch`` -> ``parts`` batches of its kind (``Sequences.rows``), part j holding the rows
    whose ``group_index`` (B,), in [0, groups), lies in [j groups / parts, (j + 1) groups / parts): whole prompt
    groups, rows in their original order. A part may come out empty when a method dropped all its rollouts."""
    if groups % parts:
        raise ValueError(f"{parts} mini-batches do not divide {groups} prompt groups")
    part_of_row = torch.div(group_index, groups // parts, rounding_mode="floor")  # (B,)
    if bool(((group_index < 0) | (group_index >= groups)).any()):
        raise ValueError(f"group indices outside [0, {groups}): {group_index.unique().tolist()}")
    return [batch.rows(torch.nonzero(part_of_row == j).flatten()) for j in range(parts)]
