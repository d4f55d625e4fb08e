"""DAPO's dynamic sampling (``train.dynamic_sampling``): which prompt groups a step trains on, when generation
stops, which process trains which group, and where every round's prompts come from. Pure torch; the trainer
(``harness/train/trl/trainer.py``) generates, and ``GroupExchange`` moves the groups between processes.

As verl's DAPO recipe (``RayDAPOTrainer.fit``, ``algorithm.filter_groups``): a group whose rollouts all have the
same accuracy (all correct or all wrong) carries no signal and is dropped; generation continues in rounds of
``prompts_per_round`` prompts (verl's ``data.gen_batch_size``), each the next batch of the one prompt stream, until
the groups with signal of all processes together reach ``prompts_per_step`` (verl's ``data.train_batch_size``); the
first ``prompts_per_step`` of them in generation order are trained and the surplus is discarded. The filter reads
the correctness reward alone, as the DAPO, 80/20 and KTAE scripts do (``filter_groups.metric=acc``): groups that
differ only in the overlong penalty are dropped too.

Several processes (``GroupCollector``): every process draws the same round from the stream and generates its
contiguous share of it, so generation order = stream order = (round, process, group). TRL gathers every process's
rewards, so all processes count the groups with signal of the whole round, take the same decision to stop, and
pick the same trained groups: the first ``prompts_per_step`` with signal in that order, as verl's single controller
does with the whole batch. Process p trains groups ``[p Q / P, (p + 1) Q / P)`` of that list (Q = prompts_per_step,
P = processes): whole groups, the same number on every process (mini-batches need equal counts), in order, as
verl's data-parallel dispatch splits the kept batch in contiguous chunks (verl, with ``trainer.balance_batch``, also
reorders single rollouts over ranks by length first; here a process keeps whole groups, whose advantages it
computes). A group generated on one process and trained on another moves once, at the end of the step
(``outgoing`` -> ``GroupExchange`` -> ``batch``); rewards and correctness do not move (the gather has them).
Each process holds on CPU only the groups that can still be trained (compact rows: int32 ids, bool masks, padding
columns of the group cut), at most Q with signal and Q without over all processes.

Rounds run out (``max_generation_rounds``, verl's ``max_num_gen_batches``): verl stops the run with an error. Here
the step trains every group with signal it collected, completed to ``prompts_per_step`` by the first zero-variance
groups in generation order (their GRPO advantage is 0, as without dynamic sampling), in generation order, so every
mini-batch keeps its size on every process; the step's metrics say so (``dynamic_sampling/rounds_exhausted``,
``groups_filled``) and the trainer logs a warning.

The prompt stream (``PromptStream``) replaces TRL's sampler as the source of prompts while dynamic sampling is on:
seeded permutations of the training prompts, a new one per pass (seeded by the run seed), read in rounds of
``prompts_per_round``; a round never straddles two passes (the last ``n mod prompts_per_round`` prompts of a pass
are skipped, as verl's dataloader drops its last partial batch), so no prompt repeats within a pass and a pass is
what verl calls an epoch (``dynamic_sampling/epoch`` logs the passes read). TRL's sampler still yields one batch per
step, which keeps transformers' step count and resume skip, but its prompts are not generated. The stream's cursor
is saved in each trainer checkpoint, so a resumed run draws the same prompts. Differences from verl's dataloader:
another permutation for the same seed (verl: a torch ``RandomSampler`` seeded by ``data.seed``); rounds continue
across passes until the budget stops the run (verl: ``total_epochs`` passes of the dataloader or
``total_training_steps``); without dynamic sampling the prompts come from TRL's sampler, in another order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)

ROLLOUT_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")  # the columns a step keeps
GroupKey = tuple[int, int, int]  # (round, process, group index among the process's groups of the round)
# one round: this process's generated batch (TRL's dict), every process's summed rewards and correctness (N_all,)
Round = tuple[dict, torch.Tensor, torch.Tensor]


def sampled_step(generate_round: Callable[[list[dict]], Round], stream: PromptStream, dataset: Sequence[dict],
                 collector: GroupCollector, prompts_per_round: int, max_rounds: int, exchange: GroupExchange,
                 log: Callable[[str, float], None], step: int, warn: bool) -> tuple[dict, torch.Tensor]:
    """One dynamically sampled step: rounds of ``prompts_per_round`` prompts of the stream (``stream_rows``), each
    generated and scored by ``generate_round``, until the groups with signal of all processes reach prompts_per_step
    (``collector.full``) or ``max_rounds`` rounds; then the trained groups move to the processes that train them
    (``exchange``). Logs the step's counts (``log``; ``warn``: this process warns when the rounds ran out of step
    ``step``). Returns this process's trained groups' rollouts (ROLLOUT_TENSORS, on the rounds' device) and summed
    rewards."""
    while True:
        rows = stream_rows(stream, dataset, prompts_per_round, collector.processes, collector.process_index,
                           collector.group_size)
        out, rewards_all, correct_all = generate_round(rows)
        collector.add_round({k: out[k].cpu() for k in ROLLOUT_TENSORS}, rewards_all, correct_all)
        if collector.full or collector.rounds >= max_rounds:
            break
    metrics = collector.metrics()
    for name, value in metrics.items():
        log(f"dynamic_sampling/{name}", float(value))
    log("dynamic_sampling/epoch", stream.passes)
    if not collector.full and warn:
        logger.warning(f"step {step}: dynamic sampling ran out of its {max_rounds} rounds with "
                       f"{metrics['groups_kept']} of {collector.groups_per_step} groups with signal; "
                       f"{metrics['groups_filled']} zero-variance groups complete the step "
                       "(train.dynamic_sampling.max_generation_rounds)")
    rollouts, rewards = collector.batch(exchange(collector, collector.processes))
    device = out["completion_ids"].device
    return {k: v.to(device) for k, v in rollouts.items()}, rewards


def stream_rows(stream: PromptStream, dataset: Sequence[dict], prompts: int, processes: int, process_index: int,
                repeats: int) -> list[dict]:
    """This process's rows for the next ``prompts`` prompts of the stream (all processes draw the same ones and
    each takes its contiguous share), each prompt repeated ``repeats`` (num_generations) times as TRL's sampler
    does."""
    drawn = stream.take(prompts)
    share = len(drawn) // processes
    return [dict(dataset[i]) for i in drawn[process_index * share:(process_index + 1) * share]
            for _ in range(repeats)]


def groups_with_signal(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) scores of consecutive groups of ``group_size`` rollouts -> (N / group_size,) bool: not all equal."""
    grouped = scores.reshape(-1, group_size)
    return grouped.amax(dim=1) > grouped.amin(dim=1)


class PromptStream:
    """The prompts of dynamic sampling's rounds: seeded permutations of ``n`` prompts, one per pass, read from
    position ``cursor`` (counted over passes, skipped prompts included) on; ``take`` never straddles two passes.
    The permutation of pass p depends only on (seed, p), so the cursor is the whole state: saved in checkpoints, it
    reproduces the stream on resume."""

    def __init__(self, n: int, seed: int, cursor: int = 0):
        if n < 1:
            raise ValueError("dynamic sampling needs at least one training prompt")
        self.n, self.seed, self.cursor = n, seed, cursor
        self._pass, self._order = -1, torch.empty(0, dtype=torch.long)

    def _permutation(self, index: int) -> torch.Tensor:
        if index != self._pass:
            digest = hashlib.sha256(f"dynamic_sampling:{self.seed}:{index}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            self._pass, self._order = index, torch.randperm(self.n, generator=generator)
        return self._order

    @property
    def passes(self) -> float:
        """Passes over the prompts read so far (verl's epochs)."""
        return self.cursor / self.n

    def take(self, count: int) -> list[int]:
        """The next ``count`` prompt indices (the same on every process), all from one pass: when the rest of the
        current pass is shorter, it is skipped (verl's ``drop_last``)."""
        if count > self.n:
            raise ValueError(f"a round of {count} prompts exceeds the {self.n} training prompts")
        if self.cursor % self.n + count > self.n:
            self.cursor += self.n - self.cursor % self.n
        start = self.cursor % self.n
        self.cursor += count
        return self._permutation((self.cursor - 1) // self.n)[start:start + count].tolist()


@dataclass
class GroupCollector:
    """The groups a step trains, over all processes, collected round by round (the same decisions on every
    process); this process's own groups that may be trained are held as compact CPU rows.

    ``groups_per_step`` = prompts_per_step (all processes together, a multiple of ``processes``)."""

    groups_per_step: int
    processes: int
    process_index: int
    group_size: int
    pad_token_id: int
    _rewards: list[torch.Tensor] = field(default_factory=list)  # per round (P, groups, group_size), all processes
    # the first groups_per_step groups with signal and without, all processes, in generation order: the candidates
    _first: dict[bool, list[GroupKey]] = field(default_factory=lambda: {True: [], False: []})
    _generated: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # groups with signal / without
    _held: dict[GroupKey, dict[str, torch.Tensor]] = field(default_factory=dict)  # this process's candidates
    _dtypes: dict[str, torch.dtype] = field(default_factory=dict)

    def __post_init__(self):
        if self.groups_per_step % self.processes:
            raise ValueError(f"{self.groups_per_step} groups per step do not split over {self.processes} processes")

    @property
    def rounds(self) -> int:
        return len(self._rewards)

    @property
    def full(self) -> bool:
        """The groups with signal of all processes reach groups_per_step: no further round."""
        return self._generated[True] >= self.groups_per_step

    def add_round(self, rollouts: dict[str, torch.Tensor], rewards_all: torch.Tensor, scores_all: torch.Tensor) -> None:
        """One round: this process's ``rollouts`` (ROLLOUT_TENSORS rows of its groups, in order), and the summed
        rewards and the accuracy of every process's rollouts (N_all,), in process order (TRL's gather)."""
        signal = groups_with_signal(scores_all, self.group_size).reshape(self.processes, -1)
        index = self.rounds
        self._rewards.append(rewards_all.reshape(self.processes, signal.shape[1], self.group_size))
        self._dtypes = self._dtypes or {k: rollouts[k].dtype for k in ROLLOUT_TENSORS}
        for p in range(self.processes):
            for g, has_signal in enumerate(signal[p].tolist()):
                self._generated[has_signal] += 1
                first = self._first[has_signal]
                if len(first) < self.groups_per_step:  # a candidate: fewer than groups_per_step of its kind before it
                    first.append((index, p, g))
                    if p == self.process_index:
                        self._held[(index, p, g)] = self._compact(rollouts, g)

    def _compact(self, rollouts: dict[str, torch.Tensor], g: int) -> dict[str, torch.Tensor]:
        """The rows of group ``g``: ids int32, masks bool, without the padding columns all its rows share (prompts
        are left-padded, completions right-padded; ``concat_rollouts`` pads them again)."""
        rows = slice(g * self.group_size, (g + 1) * self.group_size)
        out = {}
        for side in ("prompt", "completion"):
            ids, mask = rollouts[f"{side}_ids"][rows], rollouts[f"{side}_mask"][rows].bool()
            used = (mask | (ids != self.pad_token_id)).any(dim=0).nonzero().flatten()
            if len(used) == 0:
                columns = slice(0, 1)
            elif side == "prompt":
                columns = slice(int(used[0]), None)
            else:
                columns = slice(0, int(used[-1]) + 1)
            out[f"{side}_ids"], out[f"{side}_mask"] = ids[:, columns].to(torch.int32), mask[:, columns].clone()
        return out

    def chosen(self) -> list[GroupKey]:
        """The trained groups in generation order: the first groups_per_step with signal, completed (rounds ran out)
        by the first zero-variance groups."""
        with_signal = self._first[True]
        return sorted(with_signal + self._first[False][:self.groups_per_step - len(with_signal)])

    def assigned(self, process: int) -> list[GroupKey]:
        """The groups ``process`` trains: its contiguous share of ``chosen``."""
        share = self.groups_per_step // self.processes
        return self.chosen()[process * share:(process + 1) * share]

    def outgoing(self) -> dict[int, dict[GroupKey, dict[str, torch.Tensor]]]:
        """process -> the compact rows of the groups it trains that this process generated (never itself)."""
        out: dict[int, dict] = {}
        for q in range(self.processes):
            mine = {k: self._held[k] for k in self.assigned(q) if k[1] == self.process_index}
            if q != self.process_index and mine:
                out[q] = mine
        return out

    def sources(self) -> list[int]:
        """The processes that send this one groups (in ``outgoing``)."""
        return sorted({k[1] for k in self.assigned(self.process_index)} - {self.process_index})

    def batch(self, received: dict[GroupKey, dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """This process's trained groups, in generation order: ({ROLLOUT_TENSORS}, (rows,) summed rewards).
        ``received``: what the other processes sent (their ``outgoing`` for this one)."""
        keys = self.assigned(self.process_index)
        parts = [self._held[k] if k[1] == self.process_index else received[k] for k in keys]
        rollouts = concat_rollouts(parts, self.pad_token_id)
        rollouts = {k: v.to(self._dtypes[k]) for k, v in rollouts.items()}
        return rollouts, torch.cat([self._rewards[r][p, g] for r, p, g in keys])

    def metrics(self) -> dict[str, float]:
        """Per step, over all processes: groups generated, with signal, kept (trained with signal), filled (trained
        without, rounds ran out), moved (trained on another process than the one that generated them), rounds,
        rounds_exhausted (0/1)."""
        kept = len(self._first[True])
        share = self.groups_per_step // self.processes
        return {
            "groups_generated": self._generated[True] + self._generated[False],
            "groups_with_signal": self._generated[True],
            "groups_kept": kept,
            "groups_filled": self.groups_per_step - kept,
            "groups_moved": sum(k[1] != i // share for i, k in enumerate(self.chosen())),
            "rounds": self.rounds,
            "rounds_exhausted": float(not self.full),
        }


def concat_rollouts(parts: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Rows of several TRL batches in one: prompts left-padded and completions right-padded to the widest."""
    prompt_width = max(p["prompt_ids"].shape[1] for p in parts)
    completion_width = max(p["completion_ids"].shape[1] for p in parts)

    def padded(key: str, width: int, value: int, left: bool) -> torch.Tensor:
        pieces = []
        for part in parts:
            missing = width - part[key].shape[1]
            pieces.append(torch.nn.functional.pad(part[key], (missing, 0) if left else (0, missing), value=value))
        return torch.cat(pieces)

    return {
        "prompt_ids": padded("prompt_ids", prompt_width, pad_token_id, left=True),
        "prompt_mask": padded("prompt_mask", prompt_width, 0, left=True),
        "completion_ids": padded("completion_ids", completion_width, pad_token_id, left=False),
        "completion_mask": padded("completion_mask", completion_width, 0, left=False),
    }


class GroupExchange:
    """Moves the trained groups of a dynamically sampled step to the processes that train them."""

    def __init__(self):
        self._group = None  # a CPU (gloo) process group, made at the first exchange

    def __call__(self, collector: GroupCollector, processes: int) -> dict:
        """The trained groups this process did not generate, from the processes that did: point-to-point sends over
        a CPU (gloo) process group, each group once, to the one process that trains it, as pickled compact rows
        (int32 ids and bool masks without the group's shared padding columns: 5 bytes per token). Two phases, the
        payload sizes, then the payloads. Cost per step: the moved groups (``dynamic_sampling/groups_moved``) x
        num_generations x their padded prompt + completion tokens x 5 bytes, over all processes; a process receives
        at most its prompts_per_step / processes groups. paper-8020 (512 groups of 16, up to ~22.5k tokens, 8
        processes): at most ~0.9 GB moved per step when every group moves and every rollout has the maximum length,
        at most ~115 MB received per process, plus a pickled copy on each side while it is sent; no GPU memory."""
        if processes == 1:
            return {}
        import pickle

        import torch.distributed as dist

        if self._group is None and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # every process reaches its first exchange together
        group = self._group
        sends = {q: torch.frombuffer(bytearray(pickle.dumps(rows)), dtype=torch.uint8)
                 for q, rows in collector.outgoing().items()}
        sources = collector.sources()

        def exchange(outgoing: dict[int, torch.Tensor], incoming: dict[int, torch.Tensor]) -> None:
            works = [dist.isend(t, q, group=group) for q, t in outgoing.items()]
            works += [dist.irecv(t, p, group=group) for p, t in incoming.items()]
            for work in works:
                work.wait()

        sizes = {p: torch.zeros(1, dtype=torch.int64) for p in sources}
        exchange({q: torch.tensor([len(t)], dtype=torch.int64) for q, t in sends.items()}, sizes)
        payloads = {p: torch.empty(int(sizes[p]), dtype=torch.uint8) for p in sources}
        exchange(sends, payloads)
        received = {}
        for p in sources:
            received.update(pickle.loads(payloads[p].numpy().tobytes()))
        return received
