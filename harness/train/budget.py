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

import hashlib
import json
import resource
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from harness.config.choices import BUDGET_KINDS
from harness.data.files import write_json_atomic

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


OFF_BUDGET = "off_budget"  # a PhaseClock phase whose seconds the step's are reduced by (diagnostics)
LEDGER_FILE = "harness_budget.json"  # the budget ledger, saved in each resumable trainer checkpoint
DIGEST_STEPS = 8  # the first optimizer steps whose rollout and weight digests run.json lists (`harness verify`)


def tensors_sha256(named: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 over tensors' names, dtypes, shapes and bytes, in the given order: equal iff bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in named:
        _add_tensor(digest, name, tensor)
    return digest.hexdigest()


def _add_tensor(digest, name: str, tensor: torch.Tensor) -> None:
    data = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{name}|{data.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(data.view(torch.uint8).numpy().tobytes())


def weights_sha256(model: torch.nn.Module) -> str:
    """The digest of a model's full trainable weights (``tensors_sha256`` of them, sorted by name). Under DeepSpeed
    ZeRO-3 or FSDP2 a process holds only a shard (ZeRO-3's ``p.data`` is empty: hashing it gave one constant digest
    per run); there each weight is gathered in turn, a collective that every process runs in the same order, so
    every process gets the whole model's digest with one gathered weight in memory at a time."""
    digest = hashlib.sha256()
    for name, parameter in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        with _gathered(parameter) as full:
            _add_tensor(digest, name, full)
    return digest.hexdigest()


@contextmanager
def _gathered(parameter: torch.nn.Parameter):
    """The whole of one parameter: gathered from its ZeRO-3 partitions or FSDP2 shards, else itself."""
    if hasattr(parameter, "ds_id"):  # a DeepSpeed ZeRO-3 parameter
        import deepspeed

        with deepspeed.zero.GatheredParameters([parameter]):
            yield parameter.data
    elif hasattr(parameter, "full_tensor"):  # an FSDP2 DTensor
        yield parameter.full_tensor()
    else:
        yield parameter


@dataclass
class RunDigests:
    """What makes a run's divergence from a replay visible: a sha256 chain over the completion token ids of every
    generation batch in order (``rollouts``: each link hashes the previous link and one batch), for each of the
    first ``DIGEST_STEPS`` optimizer steps that chain and the weights after the step (``first_steps``), and at each
    budget checkpoint the chain and the full weights saved (``checkpoints``, the main process's). Each process
    digests its own rollouts; run.json records the main process's."""

    rollouts: str = ""
    first_steps: list[dict] = field(default_factory=list)
    checkpoints: dict[str, dict] = field(default_factory=dict)

    def add_rollouts(self, completion_ids: torch.Tensor) -> None:
        """One generation batch (B, T) of this process, padding included, chained to the batches before it."""
        self.rollouts = hashlib.sha256((self.rollouts + tensors_sha256([("completion_ids", completion_ids)]))
                                       .encode()).hexdigest()

    def close_step(self, step: int, model: torch.nn.Module) -> None:
        if step <= DIGEST_STEPS:
            self.first_steps.append({"step": step, "rollouts_sha256": self.rollouts,
                                     "weights_sha256": weights_sha256(model)})


class StepAccounting:
    """The budget of a run as it trains: the run's totals (``ledger``, identical on every process), what this
    process counted in the current step (``step_ledger``), the phase clock, and the budget checkpoints saved so far.
    Generation and forwards are counted as they run; ``close_step`` (the BudgetCallback, at each optimizer step's
    end) adds the step's counts, summed over the processes, to the totals."""

    def __init__(self, model_shape: ModelShape, device: torch.device):
        self.model_shape = model_shape
        self.device = device
        self.clock = PhaseClock(device)
        self.ledger = BudgetLedger()
        self.step_ledger = BudgetLedger()
        self.saved_checkpoints: dict[str, dict] = {}  # budget checkpoint name -> step, spend and digests when saved
        self.digests = RunDigests()

    def count_generation(self, prompt_lengths: list[int], completion_lengths: list[int]) -> None:
        ledger = self.step_ledger
        ledger.samples += len(prompt_lengths)
        ledger.prompt_tokens += int(sum(prompt_lengths))
        ledger.generated_tokens += int(sum(completion_lengths))
        ledger.flops["generation"] += generation_flops(self.model_shape, prompt_lengths, completion_lengths)

    def count_forward(self, phase: str, flops: float, positions: int, backward: bool) -> None:
        """One forward of ``positions`` computed positions in ``phase``; x3 FLOPs when a backward follows."""
        self.step_ledger.flops[phase] += flops * (3.0 if backward else 1.0)  # backward ~ 2x forward
        self.step_ledger.forwarded_positions += positions
        if backward:
            self.step_ledger.trained_positions += positions

    @contextmanager
    def uncounted(self):
        """Forwards inside are not counted (diagnostics off the budget: the sample batch); time them as
        ``OFF_BUDGET`` on the clock to take their seconds off the step."""
        kept = self.step_ledger
        self.step_ledger = BudgetLedger()
        try:
            yield
        finally:
            self.step_ledger = kept

    def close_step(self, seconds: dict[str, float], step_seconds: float, sum_over_processes) -> None:
        """Adds this step's counts, summed over the processes (``sum_over_processes``: a float64 tensor's sum over
        them), to the run's totals: every process then holds the same totals and takes the same stop decision;
        seconds become accelerator-seconds (summed over devices). The train phase is the rest of the step, so the
        phases add up to the step."""
        local = self.step_ledger
        local.step_seconds += step_seconds
        for phase in ("generation", "old_logp", "reference"):
            local.seconds[phase] += seconds.get(phase, 0.0)
        local.seconds["train"] += (step_seconds - seconds.get("generation", 0.0) - seconds.get("old_logp", 0.0)
                                   - seconds.get("reference", 0.0))
        counts = sum_over_processes(torch.tensor(local.counters(), dtype=torch.float64, device=self.device))
        self.ledger.add_counters(counts.cpu().tolist())
        self.ledger.steps += 1
        self.step_ledger = BudgetLedger()

    def save_digests(self, folder: Path) -> None:
        """This process's digests beside a trainer checkpoint's weights (every process: its rollouts are its own)."""
        write_json_atomic(folder / _digests_file(), asdict(self.digests))

    def mark_complete(self, folder: Path, run_key: str, prompt_stream_cursor: int) -> None:
        """The ledger beside a trainer checkpoint, so a resumed run continues the budget count: the folder's
        completeness marker (``last_complete_checkpoint``). The main process writes it once every process has
        written its part of the checkpoint."""
        write_json_atomic(folder / LEDGER_FILE, {"ledger": self.ledger.to_dict(), "run_key": run_key,
                                                 "saved_checkpoints": self.saved_checkpoints,
                                                 "prompt_stream_cursor": prompt_stream_cursor})

    def restore(self, folder: Path) -> int:
        """The ledger of a trainer checkpoint; returns dynamic sampling's prompt-stream position saved with it."""
        saved = json.loads((folder / LEDGER_FILE).read_text())
        self.ledger = BudgetLedger.from_dict(saved["ledger"])
        self.saved_checkpoints = saved["saved_checkpoints"]
        digests = folder / _digests_file()
        # absent from checkpoints written before the digests: the chain then restarts at the resumed step
        self.digests = RunDigests(**json.loads(digests.read_text())) if digests.is_file() else RunDigests()
        return saved.get("prompt_stream_cursor", 0)  # absent from checkpoints before it


def _digests_file() -> str:
    """Each process's digests go in a file of its own beside the ledger (its rollouts are its own)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return f"harness_digests-{torch.distributed.get_rank() if distributed else 0}.json"


def _numbered_checkpoints(trl_dir: Path) -> list[Path]:
    """transformers' checkpoint-N folders of ``trl_dir``, oldest step first."""
    folders = (p for p in trl_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit())
    return sorted(folders, key=lambda p: int(p.name.split("-")[-1]))


def last_complete_checkpoint(trl_dir: Path, run_key: str) -> str | None:
    """The newest trainer checkpoint of this configuration (``run_key``) that was completely written.

    transformers writes checkpoint-N in place, so a job killed while saving leaves a partial folder: the budget
    ledger, written by the main process after every process has finished its part (``mark_complete``), marks a
    complete one; partial folders are removed so that no rerun picks them up. Checkpoints of another configuration
    (the config changed since) are removed too: the run starts afresh."""
    import shutil

    if not trl_dir.is_dir():
        return None
    for folder in reversed(_numbered_checkpoints(trl_dir)):
        ledger = folder / LEDGER_FILE
        if ledger.is_file() and json.loads(ledger.read_text()).get("run_key") == run_key:
            return str(folder)
        shutil.rmtree(folder)
    return None


def rotate_checkpoints(trl_dir: Path, keep: int) -> None:
    """Remove every trainer checkpoint older than the ``keep`` newest complete ones (complete: with the ledger).
    Called after a checkpoint is marked complete, so the newest complete one is never removed, and neither is the
    one before it while a newer save may still be torn."""
    import shutil

    folders = _numbered_checkpoints(trl_dir)
    complete = [p for p in folders if (p / LEDGER_FILE).is_file()]
    if len(complete) <= keep:
        return
    oldest_kept = int(complete[-keep].name.split("-")[-1])
    for folder in folders:
        if int(folder.name.split("-")[-1]) < oldest_kept:
            shutil.rmtree(folder)
