"""DAPO's dynamic sampling (``train.dynamic_sampling``): which prompt groups a step trains on, when generation
stops, and where the extra prompts come from. Pure torch; the trainer (``harness/train/adapter.py``) generates.

As verl's DAPO recipe (``RayDAPOTrainer.fit``, ``algorithm.filter_groups``): a group whose rollouts all have the
same accuracy (all correct or all wrong) carries no signal and is dropped; generation continues in rounds of
``prompts_per_round`` prompts (verl's ``data.gen_batch_size``) until ``prompts_per_step`` groups with signal are
collected; the first ones in generation order are trained, the surplus is discarded. The filter reads the
correctness reward alone, as the DAPO, 80/20 and KTAE scripts do (``filter_groups.metric=acc``): groups that differ
only in the overlong penalty are dropped too.

Choices where the harness differs from verl (each stated in the README):
- Several processes: each keeps its own ``prompts_per_step / processes`` groups from the rollouts it generated
  (verl keeps the first groups of the whole batch and rebalances them over the ranks). Rollouts never move between
  processes; every process knows every process's accuracy (TRL gathers the rewards), so all of them take the same
  decision to generate another round.
- Rounds run out (``max_generation_rounds``): verl stops the run with an error. Here the step trains on every group
  with signal it collected, completed to ``prompts_per_step`` by zero-variance groups in generation order (what the
  step would have trained without dynamic sampling: their GRPO advantage is 0), so every mini-batch keeps its size
  on every process; the step's metrics say so (``dynamic_sampling/rounds_exhausted``, ``groups_filled``).
- Extra prompts: the first round is the sampler's batch (TRL's ``RepeatSampler``, untouched, so the step count,
  epochs and transformers' resume skip stay right), plus ``prompts_per_round - prompts_per_step`` prompts from a
  second stream; later rounds take all their prompts from it. The stream (``PromptStream``) walks seeded
  permutations of the training prompts (seeded by the run seed, another permutation each pass); its position is
  saved in each trainer checkpoint, so a resumed run draws the same extra prompts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

ROLLOUT_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")  # the columns a step keeps


def groups_with_signal(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) scores of consecutive groups of ``group_size`` rollouts -> (N / group_size,) bool: not all equal."""
    grouped = scores.reshape(-1, group_size)
    return grouped.amax(dim=1) > grouped.amin(dim=1)


class PromptStream:
    """Prompt indices for rounds after the sampler's batch: seeded permutations of ``n`` prompts, one per pass, read
    from position ``cursor`` on. The permutation of pass p depends only on (seed, p), so the cursor is the whole
    state: saved in checkpoints, it reproduces the stream on resume."""

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

    def take(self, count: int) -> list[int]:
        """The next ``count`` prompt indices (the same on every process)."""
        out = []
        for position in range(self.cursor, self.cursor + count):
            out.append(int(self._permutation(position // self.n)[position % self.n]))
        self.cursor += count
        return out


@dataclass
class _Group:
    order: tuple[int, int]  # (round, group index among the process's groups of that round): generation order
    rollouts: dict[str, torch.Tensor]  # ROLLOUT_TENSORS rows of the group
    rewards: torch.Tensor  # (group_size,) summed rewards


@dataclass
class GroupCollector:
    """The groups one process trains on, collected round by round. ``quota`` = prompts_per_step / processes."""

    quota: int
    processes: int
    process_index: int
    group_size: int
    rounds: int = 0
    generated: int = 0  # groups generated, all processes
    with_signal: int = 0  # of which with signal, all processes (kept + surplus)
    _kept_per_process: list[int] = field(default_factory=list)
    _kept: list[_Group] = field(default_factory=list)
    _fillers: list[_Group] = field(default_factory=list)  # zero-variance groups, used only when rounds run out

    def __post_init__(self):
        self._kept_per_process = [0] * self.processes

    @property
    def full(self) -> bool:
        """Every process holds its quota of groups with signal: no further round."""
        return min(self._kept_per_process) >= self.quota

    def add_round(self, rollouts: dict[str, torch.Tensor], rewards: torch.Tensor, scores_all: torch.Tensor) -> None:
        """One round: this process's ``rollouts`` (rows of its groups, in order) and summed ``rewards`` (its rows),
        and ``scores_all`` (N_all,), the accuracy of every process's rollouts in process order."""
        signal = groups_with_signal(scores_all, self.group_size).reshape(self.processes, -1)
        self.rounds += 1
        self.generated += signal.numel()
        self.with_signal += int(signal.sum())
        for p in range(self.processes):
            room = self.quota - self._kept_per_process[p]
            self._kept_per_process[p] += min(room, int(signal[p].sum()))
            if p != self.process_index:
                continue
            for g, has_signal in enumerate(signal[p].tolist()):
                if has_signal and room > 0:
                    self._kept.append(self._group(rollouts, rewards, g))
                    room -= 1
                elif not has_signal and len(self._fillers) < self.quota:
                    self._fillers.append(self._group(rollouts, rewards, g))

    def _group(self, rollouts: dict, rewards: torch.Tensor, g: int) -> _Group:
        rows = slice(g * self.group_size, (g + 1) * self.group_size)
        return _Group((self.rounds, g), {k: rollouts[k][rows] for k in ROLLOUT_TENSORS}, rewards[rows])

    def metrics(self) -> dict[str, float]:
        """Per step, over all processes: groups generated, with signal, kept (trained with signal), filled (trained
        without, rounds ran out), rounds, rounds_exhausted (0/1)."""
        kept = sum(min(k, self.quota) for k in self._kept_per_process)
        return {
            "groups_generated": self.generated,
            "groups_with_signal": self.with_signal,
            "groups_kept": kept,
            "groups_filled": self.quota * self.processes - kept,
            "rounds": self.rounds,
            "rounds_exhausted": float(not self.full),
        }

    def batch(self, pad_token_id: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The trained groups, in generation order: ({ROLLOUT_TENSORS}, (rows,) summed rewards). Kept groups first,
        completed with fillers when rounds ran out."""
        chosen = self._kept + self._fillers[: self.quota - len(self._kept)]
        chosen.sort(key=lambda group: group.order)
        return concat_rollouts([g.rollouts for g in chosen], pad_token_id), torch.cat([g.rewards for g in chosen])


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
