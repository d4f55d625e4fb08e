"""Row chunks sized by rows and tokens (harness/train/row_chunks.py ``chunk_plan``), and the padding-free check that
every process makes before its forwards (``rows_not_packable``)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.train.row_chunks import RowChunk, Sequences, chunk_plan, packed_rows, row_chunks, rows_not_packable


def batch(prompt_lengths: list[int], completion_lengths: list[int]) -> Sequences:
    """Left-padded prompts and right-padded completions of the given lengths."""
    P, T = max(prompt_lengths), max(completion_lengths)
    prompt_mask = torch.tensor([[0] * (P - p) + [1] * p for p in prompt_lengths])
    completion_mask = torch.tensor([[1] * c + [0] * (T - c) for c in completion_lengths])
    return Sequences(5 * prompt_mask, prompt_mask, 7 * completion_mask, completion_mask)


def plan_lists(inputs, rows, tokens=0):
    return [chunk.tolist() for chunk in chunk_plan(inputs, rows, tokens)]


def test_rows_alone_split_the_length_order_as_before():
    inputs = batch([3, 3, 3, 3], [5, 3, 4, 1])  # lengths 8, 6, 7, 4
    assert plan_lists(inputs, 2) == [[3, 1], [2, 0]]
    assert plan_lists(inputs, 16) == [[3, 1, 2, 0]]


def test_a_token_cap_packs_short_rows_together_and_long_ones_alone():
    # by hand: row 3 (3+1) alone is 4 tokens; with row 1: 2 x (3+3) = 12 <= 12; with row 2 too: 3 x 7 = 21 > 12;
    # row 2 with row 0: 2 x 8 = 16 > 12
    inputs = batch([3, 3, 3, 3], [5, 3, 4, 1])
    assert plan_lists(inputs, 16, 12) == [[3, 1], [2], [0]]
    assert plan_lists(inputs, 1, 12) == [[3], [1], [2], [0]]  # the row cap still holds
    assert plan_lists(inputs, 16, 3) == [[3], [1], [2], [0]]  # a row longer than the cap runs alone
    assert plan_lists(inputs, 16, 100) == [[3, 1, 2, 0]]


def test_the_width_counts_the_longest_prompt_and_the_longest_completion_of_the_chunk():
    # rows (prompt 5, completion 1) and (prompt 1, completion 5): each 6 tokens, padded together 2 x (5 + 5) = 20
    inputs = batch([5, 1], [1, 5])
    assert plan_lists(inputs, 16, 19) == [[0], [1]]
    assert plan_lists(inputs, 16, 20) == [[0, 1]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9)), min_size=1, max_size=24),
       st.integers(1, 8), st.integers(0, 60))
def test_every_row_once_each_chunk_within_its_caps_and_full(rows, rows_per_chunk, tokens_per_chunk):
    inputs = batch([p for p, _ in rows], [c for _, c in rows])
    plan = chunk_plan(inputs, rows_per_chunk, tokens_per_chunk)
    assert sorted(torch.cat(plan).tolist()) == list(range(len(rows)))
    order = torch.cat(plan).tolist()
    lengths = [rows[i][0] + rows[i][1] for i in order]
    assert lengths == sorted(lengths)  # shortest first, as the rows-only plan

    def padded(chunk):
        return len(chunk) * (max(rows[i][0] for i in chunk) + max(rows[i][1] for i in chunk))

    chunks = [chunk.tolist() for chunk in plan]
    for chunk, following in zip(chunks, chunks[1:] + [None], strict=True):
        assert len(chunk) <= rows_per_chunk
        if tokens_per_chunk and len(chunk) > 1:
            assert padded(chunk) <= tokens_per_chunk
        if following is not None:  # greedy: the next row did not fit
            grown = chunk + following[:1]
            assert len(grown) > rows_per_chunk or (tokens_per_chunk and padded(grown) > tokens_per_chunk)
    if not tokens_per_chunk:
        assert chunks == [c.tolist() for c in torch.argsort(torch.tensor(lengths_of(rows)), stable=True)
                          .split(rows_per_chunk)]


def lengths_of(rows):
    return [p + c for p, c in rows]


def test_chunks_of_a_plan_cut_to_their_longest_row():
    inputs = batch([3, 1, 2], [2, 4, 1])
    chunks = list(row_chunks(inputs, chunk_plan(inputs, 16, 10)))
    assert [(c.rows.tolist(), c.completion_width, tuple(c.input_ids.shape)) for c in chunks] == [
        ([2, 0], 2, (2, 5)), ([1], 4, (1, 5))]


@pytest.mark.parametrize("edit, unpackable", [
    (None, 0),
    (lambda b: b.completion_mask[1].copy_(torch.tensor([1, 0, 1, 0])), 1),  # a hole before the last real token
    (lambda b: b.prompt_mask[0].copy_(torch.tensor([1, 0, 1])), 1),  # a hole in a left-padded prompt
    (lambda b: b.completion_mask[2].zero_(), 0),  # no completion token: the prompt alone, packable
    (lambda b: (b.completion_mask[0].copy_(torch.tensor([0, 1, 1, 0])),
                b.prompt_mask[1].copy_(torch.tensor([0, 1, 0]))), 2),
])
def test_rows_not_packable_counts_what_packed_rows_refuses(edit, unpackable):
    inputs = batch([3, 2, 1], [4, 3, 2])
    if edit is not None:
        edit(inputs)
    assert rows_not_packable(inputs) == unpackable
    refused = 0
    for row in range(3):  # each row untrimmed, as packed_rows would see it in any chunk
        ids = torch.cat([inputs.prompt_ids[row:row + 1], inputs.completion_ids[row:row + 1]], dim=1)
        mask = torch.cat([inputs.prompt_mask[row:row + 1], inputs.completion_mask[row:row + 1]], dim=1)
        try:
            packed_rows(RowChunk(torch.tensor([row]), ids, mask, inputs.completion_ids.shape[1]))
        except ValueError:
            refused += 1
    assert refused == unpackable
