"""Compute accounting for matched budgets: analytic FLOPs and measured seconds per phase, tokens, samples, steps.

FLOP model (nanoGPT's ``estimate_mfu`` / PaLM App. B, written for causal decoders):

    forward FLOPs = 2 * N_body * positions            every position through the transformer layers
                  + 2 * N_head * logit_positions      the LM head, only where logits are computed
                  + 4 * n_layers * d_model * pairs    attention scores Q K^T and the weighted sum A V
    forward + backward = 3 * forward                  (backward ~ 2x forward)

N_body counts the weights of every matrix multiply below the LM head (attention and MLP projections; embedding
lookups are not multiplies), N_head = vocab x d_model. ``pairs`` = sum over positions of the keys a position
attends to: a causal row of width L has L (L + 1) / 2 pairs.

What is counted, phase by phase (the accounting counts what a method really skips or adds):
- generation: each rollout's real prompt tokens (prefill) and real generated tokens, logits for the generated
  ones, attention over the growing prefix (a KV cache): sum_t t pairs. Finished rollouts cost nothing more.
- old-policy forward (only with several optimizer steps per generation batch): what is computed, per row chunk.
- reference forward (only when beta > 0): what is computed, per row chunk.
- training forward + backward: what is computed, per row chunk, times 3. Padded (``train.padding_free`` off):
  the (rows, width) shape. Padding-free: the real tokens of the chunk's rows for the body (a prompt shared by
  several rows once, ``train.share_prompts``), and the attention pairs of the (rows, longest row) layout that
  attention runs in (``packed_forward_flops``). Rollouts a method drops
  (D3S) and positions it truncates (NAT prefix cutting) are never computed, so never counted; LM-head logits are
  counted only at the positions they are computed at (the scored completion tokens; NAT's URS: the sampled ones).
Distributed runs: each process counts its own rollouts and forwards for the current step; at the end of the step
the counts are summed over the processes (one all-reduce), so every process holds the same totals and stops at the
same step, and seconds are accelerator-seconds (summed over the training devices; GPUs of a separate vLLM server
are not counted).
Measured seconds: CUDA events on a GPU, ``time.process_time`` (CPU time of this process, all threads) on CPU; the
clock used is recorded. Peak memory: ``torch.cuda.max_memory_allocated`` on a GPU, the process's peak resident
set size on CPU (``ru_maxrss``).
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field, fields

import torch

from harness.config.choices import BUDGET_KINDS

# old_logp: the rollout policy's log-probs, one no-grad forward per generation batch when it feeds several optimizer
# steps (train.mini_batches x train.ppo_epochs > 1)
PHASES = ("generation", "old_logp", "reference", "train")


@dataclass(frozen=True)
class ModelShape:
    n_body: int  # matmul weights below the LM head
    n_head: int  # vocab x d_model
    n_layers: int
    d_model: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        head = model.get_output_embeddings()
        n_head = _full_numel(head.weight)
        n_linear = sum(_full_numel(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear))
        head_is_linear = isinstance(head, torch.nn.Linear)
        n_body = n_linear - (n_head if head_is_linear else 0)
        config = model.config
        return cls(n_body=n_body, n_head=n_head, n_layers=config.num_hidden_layers, d_model=config.hidden_size)


def _full_numel(weight: torch.Tensor) -> int:
    """Elements of the whole weight, also where ZeRO-3 left only a shard in place (it keeps the count)."""
    return int(getattr(weight, "ds_numel", weight.numel()))


def forward_flops(shape: ModelShape, positions: float, logit_positions: float, pairs: float) -> float:
    return 2.0 * shape.n_body * positions + 2.0 * shape.n_head * logit_positions + 4.0 * shape.n_layers * (
        shape.d_model * pairs)


def causal_pairs(width: int) -> int:
    return width * (width + 1) // 2


def generation_flops(shape: ModelShape, prompt_lengths: list[int], completion_lengths: list[int]) -> float:
    """Sampling with a KV cache: prefill the prompt, then one position per generated token."""
    total = 0.0
    for prompt, completion in zip(prompt_lengths, completion_lengths, strict=True):
        total += forward_flops(shape, prompt + completion, completion, causal_pairs(prompt + completion))
    return total


def padded_forward_flops(shape: ModelShape, rows: int, width: int, completion_width: int,
                         logit_positions: int | None = None) -> float:
    """One forward over a (rows, width) tensor whose last ``completion_width`` positions get logits, or only
    ``logit_positions`` of them when the LM head runs at selected positions (NAT's URS)."""
    logits = rows * completion_width if logit_positions is None else logit_positions
    return forward_flops(shape, rows * width, logits, rows * causal_pairs(width))


def packed_forward_flops(shape: ModelShape, positions: int, attention_rows: int, attention_width: int,
                         logit_positions: int) -> float:
    """One padding-free forward: ``positions`` real tokens through the body, causal attention computed over an
    (``attention_rows``, ``attention_width``) layout, logits at ``logit_positions``."""
    return forward_flops(shape, positions, logit_positions, attention_rows * causal_pairs(attention_width))


class PhaseClock:
    """Seconds per phase: CUDA events on a GPU (read once per step, one sync), process time on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.name = "cuda_events" if self.cuda else "process_time"
        self._pending: list[tuple[str, object, object]] = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.process_time()

    def start(self):
        return self._now()

    def stop(self, phase: str, started) -> None:
        self._pending.append((phase, started, self._now()))

    def collect(self) -> dict[str, float]:
        """Seconds per phase recorded since the last collect."""
        if self.cuda and self._pending:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for phase, begin, end in self._pending:
            seconds = begin.elapsed_time(end) / 1000.0 if self.cuda else end - begin
            out[phase] = out.get(phase, 0.0) + seconds
        self._pending.clear()
        return out


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


@dataclass
class BudgetLedger:
    """Running totals of a run; saved in trainer checkpoints so a resumed run continues the count."""

    steps: int = 0
    samples: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    forwarded_positions: int = 0  # computed positions of old-policy, reference and training forwards
    trained_positions: int = 0  # computed positions of the training forward
    weighted_tokens: int = 0  # completion tokens with a non-zero weight in the loss
    flops: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    step_seconds: float = 0.0  # the whole step by the same clock (phases + hooks, rewards, optimizer)

    def spent(self, kind: str) -> float:
        if kind == "steps":
            return float(self.steps)
        if kind == "samples":
            return float(self.samples)
        if kind == "tokens":  # every token the model processed: prompts, generations, scoring and training forwards
            return float(self.prompt_tokens + self.generated_tokens + self.forwarded_positions)
        if kind == "flops":
            return sum(self.flops.values())
        if kind == "accel_seconds":
            return self.step_seconds
        raise ValueError(f"budget kind must be one of {list(BUDGET_KINDS)}, got {kind!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def counters(self) -> list[float]:
        """Every additive quantity, in field order (per-phase dicts in PHASES order): what the processes of a
        distributed run sum up."""
        out: list[float] = []
        for f in fields(self):
            value = getattr(self, f.name)
            out += [value[p] for p in PHASES] if isinstance(value, dict) else [float(value)]
        return out

    def add_counters(self, values: list[float]) -> None:
        """Adds a ``counters()`` list (of this or another ledger, e.g. summed over processes)."""
        rest = iter(values)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                for phase in PHASES:
                    value[phase] += next(rest)
            else:  # integer counters stay integers
                setattr(self, f.name, value + (round(next(rest)) if isinstance(value, int) else next(rest)))

    @classmethod
    def from_dict(cls, data: dict) -> BudgetLedger:
        data = {k: ({p: v.get(p, 0.0) for p in PHASES} if isinstance(v, dict) else v) for k, v in data.items()}
        return cls(**data)  # a phase missing from an older ledger counts 0

    def summary(self) -> dict[str, float]:
        """Flat ``group/name`` scalars for metrics.jsonl and run.json."""
        out = {"budget/steps": self.steps, "budget/samples_total": self.samples,
               "budget/flops_total": self.spent("flops"), "budget/accel_seconds_total": self.step_seconds,
               "budget/tokens_total": self.spent("tokens"),
               "tokens/generated_total": self.generated_tokens, "tokens/prompt_total": self.prompt_tokens,
               "tokens/forwarded_total": self.forwarded_positions, "tokens/trained_total": self.trained_positions,
               "tokens/weighted_total": self.weighted_tokens}
        out.update({f"flops/{p}_total": v for p, v in self.flops.items()})
        out.update({f"seconds/{p}_total": v for p, v in self.seconds.items()})
        return out
