"""verl's legacy micro-batch loss weighting (``train.loss_micro_batch_tokens`` > 0), as pure functions of row lengths.

verl's legacy actor (``use_dynamic_bsz``: the KTAE and 80/20 runs) does not take one mean over a mini-batch:
it splits each data-parallel rank's mini-batch into micro-batches of at most ``max_token_len`` tokens, takes the
aggregation (``token-mean``) over each micro-batch's own tokens, scales it by the micro-batch's share of the rank's
mini-batch rows and accumulates the gradients. With the method's weights w and the per-rollout parts d_i of its
denominator (``methods.base.TokenWeights.row_denominators``), rollout i of micro-batch I_m of a process holding R rows
gets the weight

    w_{i,t} |I_m| / (R max(D_m, 1)),   D_m = sum_{j in I_m} d_j                                  (loss = sum w' l)

Under token-mean D_m is the micro-batch's (selected) tokens, so a token's weight is ~ rows / tokens of its
micro-batch: tokens of long rollouts weigh less than under one mean. Under seq-mean-token-mean and
seq-mean-token-sum-norm d_i does not depend on the other rows and the weighting equals the one mean exactly (under
seq-mean-token-mean when every rollout has a token to count). DDP then averages the gradients over the processes, as
verl's FSDP does over its ranks.

Source, verl as KTAE vendors it (github.com/xiaolizh1/KTAE @ea9fb77, the code of the paper-ktae runs):

- verl/workers/actor/dp_actor.py:265-267: with use_dynamic_bsz each mini-batch is split by
  ``rearrange_micro_batches`` with max_token_len = ppo_max_token_len_per_gpu x ulysses_sequence_parallel_size;
  :298-309 and :320-322: the policy loss and the KL loss are ``agg_loss`` over the micro-batch's response mask;
  :328-330: loss x len(micro-batch) / ppo_mini_batch_size (the rank's rows of the mini-batch, normalised per GPU in
  verl/workers/fsdp_workers.py:117-118); :333: backward per micro-batch, gradients accumulate until the step.
- verl/trainer/ppo/core_algos.py:352-377 ``agg_loss``: token-mean = ``masked_mean`` (verl/utils/torch_functional.py
  :118-120, sum / (count + 1e-8): an empty micro-batch selection adds 0, as max(D_m, 1) here).
- verl/utils/seqlen_balancing.py:224-256 ``rearrange_micro_batches``: row lengths = attention-mask sums (prompt +
  response tokens); k = ceil(total / max_token_len), then the largest k of all data-parallel ranks (all_reduce MAX,
  :236-239); the micro-batches are the partitions of ``get_seqlen_balanced_partitions(lengths, k, equal_size=False)``
  in their order. :152-183: ``karmarkar_karp``, each partition's rows then sorted by index. :25-130
  ``karmarkar_karp``: the largest differencing method (Karmarkar and Karp 1982) for k parts.

Written here from that description (``karmarkar_karp`` below follows the same steps and tie-breaks, so it returns the
same partitions in the same order; verl 0.7, the 80/20 code, only orders the micro-batches differently, which changes
no weight). A token's weight |I_m| / (R_p D_m), averaged over P processes of R_p = R / P rows each, is
|I_m| / (R D_m) whatever P is: a run on fewer GPUs than the paper's weighs tokens alike. Departures: the rows a
process holds are its whole prompt groups in generation order (verl first spreads the rows over the ranks balanced by
length, ``_balance_batch``, then cuts contiguous mini-batches), so other rows share a micro-batch; R is the rows this
process holds in the mini-batch (verl: the configured per-GPU mini-batch size, the same unless a method drops
rollouts); k is capped at the process's rows (verl asserts it); a row longer than max_token_len forms an over-long
micro-batch (verl asserts that the padded width fits).
"""

from __future__ import annotations

import heapq

import torch


class _Part:
    """One set of a partial partition: its (index, length) items in the order added, and their sum."""

    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []
        self.total = 0

    def key(self) -> tuple:
        # verl's Set order: by sum, then by item count, then by the item lists
        return self.total, len(self.items), self.items


class _State:
    """k parts, largest first; the heap pops the state with the largest spread first, then the largest first part."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]) -> None:
        self.parts = sorted(parts, key=_Part.key, reverse=True)  # stable: equal (empty) parts keep their order

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.parts[0].key() < self.parts[0].key()

    def absorb(self, other: _State) -> None:
        """Pair this state's i-th largest part with the other's i-th smallest, then re-sort."""
        for mine, theirs in zip(self.parts, reversed(other.parts), strict=True):
            mine.items.extend(theirs.items)
            mine.total += theirs.total
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def karmarkar_karp(lengths: list[int], parts: int) -> list[list[int]]:
    """The largest differencing method: row indices of ``parts`` sets with balanced length sums, largest set first,
    each set's indices in the order they were merged (``get_seqlen_balanced_partitions`` sorts them)."""
    heap: list[_State] = []
    for length, index in sorted((length, index) for index, length in enumerate(lengths)):
        first = _Part()
        first.items.append((index, length))
        first.total = length
        heapq.heappush(heap, _State([first] + [_Part() for _ in range(parts - 1)]))
    while len(heap) > 1:
        largest = heapq.heappop(heap)
        largest.absorb(heapq.heappop(heap))
        heapq.heappush(heap, largest)
    return [[index for index, _ in part.items] for part in heap[0].parts] if heap else []


def micro_batch_count(lengths: list[int], max_tokens: int) -> int:
    """k = ceil(sum of lengths / max_tokens): verl's micro-batches of one rank before the max over ranks."""
    return -(-sum(lengths) // max_tokens)


def balanced_micro_batches(lengths: list[int], count: int) -> list[list[int]]:
    """Row indices of each micro-batch, in verl's order: ``count`` (at most the rows) Karmarkar-Karp partitions of
    ``lengths`` (prompt + completion tokens per row), each sorted by row index."""
    count = min(count, len(lengths))
    if count < 1:
        return []
    return [sorted(part) for part in karmarkar_karp(lengths, count)]


def micro_batch_row_scales(micro_batches: list[list[int]], row_denominators: torch.Tensor) -> torch.Tensor:
    """(B,) the factor of each row's weights: |I_m| / (R max(D_m, 1)) for the rows of micro-batch I_m, R = B rows,
    D_m = the sum of ``row_denominators`` (B,) over I_m. The loss is then sum(w l x scale) with no denominator."""
    rows = row_denominators.shape[0]
    if sorted(i for members in micro_batches for i in members) != list(range(rows)):
        raise ValueError(f"the micro-batches {micro_batches} do not hold each of the {rows} rows once")
    parts = row_denominators.detach().to(torch.float64).cpu()
    scales = torch.zeros(rows, dtype=torch.float64)
    for members in micro_batches:
        index = torch.tensor(members, dtype=torch.long)
        scales[index] = len(members) / (rows * max(float(parts[index].sum()), 1.0))
    return scales.to(device=row_denominators.device, dtype=torch.float32)
