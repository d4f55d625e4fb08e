"""sample_batch.json: the first prompt groups of a run's first generation batch, in the ``harness inspect`` format
with token strings, so the report colours what each method selects on these same rollouts.

A method with batch-wide statistics (an entropy quantile) selects over these groups, not the whole batch. Few groups,
all rollouts of each (the advantages need them): a paper preset's generation batch is thousands of rows of up to 20k
tokens, and one padded forward over it needed tens of GB, its JSON with token strings gigabytes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.data.files import write_json_atomic
from harness.train.actor import Actor
from harness.train.budget import OFF_BUDGET
from harness.train.row_chunks import Sequences
from methods.base import RolloutBatch

SAMPLE_BATCH_GROUPS = 4  # prompt groups of a process in sample_batch.json


def write_sample_batch(path: Path, actor: Actor, model, out: dict, batch: RolloutBatch, tokenizer, group_size: int,
                       seed: int, writes: bool) -> None:
    """The first ``SAMPLE_BATCH_GROUPS`` prompt groups of TRL's generated batch ``out`` (``batch``: its rollouts with
    the baseline's advantages) with their token statistics. The forward is the actor's (row chunks, padding-free
    when the preset is), run by every process on its own first groups (the same number of rows on each: collectives
    under ZeRO-3/FSDP), not counted in the budget and off its clock; the process that ``writes`` (the main one)
    writes its rows."""
    rows = min(SAMPLE_BATCH_GROUPS * group_size, out["completion_ids"].shape[0])
    inputs = Sequences(out["prompt_ids"][:rows], out["prompt_mask"][:rows], out["completion_ids"][:rows],
                       out["completion_mask"][:rows])
    clock = actor.accounting.clock
    started = clock.start()
    with torch.no_grad(), actor.accounting.uncounted():  # the phase name is moot: nothing is counted
        stats = actor.statistics(model, inputs, ("entropy", "sum_p2"), "train", backward=False)
    clock.stop(OFF_BUDGET, started)
    if not writes:
        return
    completion_ids = batch.completion_ids[:rows].tolist()
    write_json_atomic(path, {
        "completion_ids": completion_ids, "completion_mask": batch.completion_mask[:rows].int().tolist(),
        "rewards": batch.rewards[:rows].tolist(), "group_ids": batch.group_ids[:rows].tolist(),
        "logp": stats["logp"].cpu().tolist(), "entropy": stats["entropy"].cpu().tolist(),
        "sum_p2": stats["sum_p2"].cpu().tolist(), "progress": 0.0, "seed": seed,
        "special_token_ids": list(actor.special_token_ids), **actor.settings.method_record(),
        "prompts": tokenizer.batch_decode(inputs.prompt_ids, skip_special_tokens=True),
        "completion_tokens": [tokenizer.convert_ids_to_tokens(row) for row in completion_ids],
    }, indent=None)
