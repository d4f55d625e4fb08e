"""One generation batch from its rollouts to its optimizer steps, free of TRL (verl's ``dp_actor.update_policy``):
the method's hooks, log-probs for pi_old and pi_ref, the epoch x mini-batch update schedule, and the policy loss
over row chunks and backward chunks.

TRL generates and scores the rollouts (``harness.train.trl.trainer``); from there a batch goes, top to bottom in
the ``Actor`` below::

    rollouts = new_rollout_batch(...)                         # rewards -> the baseline's group advantages (hooks.py)
    batch = actor.step_batch(model, out, rollouts, ctx)       # the method's hooks (advantages, selection, truncation)
                                                              # -> a StepBatch; no-grad pi_old and pi_ref
    for mini_batch in update_schedule(batch, ...):            # epochs x mini-batches of whole prompt groups
        loss = actor.policy_loss(model, mini_batch, ctx)       # row chunks -> statistics -> weights -> sum(w l) / D
        backward(loss); clip gradients; optimizer.step()       # transformers' Trainer, one step per mini-batch

The trainer is the loop's driver: TRL's Trainer runs the backward, the clipping and the optimizer step, and asks
``_prepare_inputs`` for each step's mini-batch, which it takes from ``update_schedule``. Everything the actor needs
of the processes (all-reduce, backward, gradient accumulation, autocast) comes through ``Processes``; tests pass a
one-process stand-in.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch

from harness.config.schema import TrainConfig
from harness.train.budget import StepAccounting, packed_forward_flops, padded_forward_flops
from harness.train.hooks import (
    PreparedBatch,
    denominator_parts,
    loss_inputs_for,
    prepare_batch,
    statistics_read,
    weigh_tokens,
    with_global_denominators,
    with_row_scales,
)
from harness.train.loss import LossConfig, LossInputs, combine_row_metrics, loss_of_rows
from harness.train.micro_batches import balanced_micro_batches, micro_batch_count, micro_batch_row_scales
from harness.train.row_chunks import (
    RowChunk,
    Sequences,
    chunk_plan,
    packed_rows,
    row_chunks,
    rows_not_packable,
    split_by_prompt_groups,
    statistics_by_row_chunks,
)
from harness.train.step_batch import StepBatch
from harness.train.step_settings import StepSettings
from harness.train.token_statistics import EXTRA_STATISTICS, model_token_statistics, packed_model_token_statistics
from methods.base import Method, RolloutBatch, StepContext, TokenStats, TokenWeights

UNPACKABLE = 1 << 40  # added to a process's chunk count in ``Actor._chunks_behind``'s all-reduce: it found rows
# the padding-free forward cannot pack (far above any count of chunks)


class NonFiniteLossError(RuntimeError):
    """More steps with a NaN/inf loss than ``train.max_nonfinite_steps`` allows."""


class Processes(Protocol):
    """The training processes as the actor sees them (accelerate's Accelerator behind ``AcceleratorProcesses``)."""

    num_processes: int
    device: torch.device

    def sum(self, values: torch.Tensor) -> torch.Tensor: ...  # all-reduce sum (the tensor itself with one process)

    def max(self, value: int) -> int: ...  # the largest of one number over the processes

    def backward(self, loss: torch.Tensor) -> None: ...

    def accumulating(self, model) -> AbstractContextManager: ...  # backward without gradient sync or optimizer step

    def autocast(self) -> AbstractContextManager: ...  # the policy's mixed precision, for the unprepared reference


def every_process(processes: Processes, values: torch.Tensor, process_index: int) -> torch.Tensor:
    """``values`` of every process, stacked in process order (P, *values.shape), the same on every process: an
    all-gather as one all-reduce sum over a tensor that holds this process's values in its own row and zeros in the
    others (x + 0 = x, NaN and inf included). With one process ``values[None]``, no collective. Every process must
    call it at the same point (a collective)."""
    if processes.num_processes == 1:
        return values[None]
    rows = torch.zeros((processes.num_processes, *values.shape), dtype=values.dtype, device=processes.device)
    rows[process_index] = values.to(processes.device)
    return processes.sum(rows).to(values.device)


def by_process(described: dict[int, str], processes: int) -> str:
    """What a decision found on each process (index -> text), as one phrase: the text alone with one process, else
    "<text> on process <index>" for each."""
    if processes == 1:
        return ", ".join(described.values())
    return ", ".join(f"{text} on process {index}" for index, text in described.items())


def update_schedule(batch: StepBatch, group_index: torch.Tensor, groups: int, mini_batches: int, epochs: int,
                    processes: Processes, process_index: int) -> Iterator[StepBatch]:
    """The inputs of the optimizer steps of one generation batch, in order: ``epochs`` passes over its
    ``mini_batches`` mini-batches, mini-batch j holding prompt groups [j P / k, (j + 1) P / k) of the process's
    ``groups`` = P groups in generation order (``group_index``: each row's group among them), the same in every
    epoch. Raises when a method dropped every rollout of a mini-batch of any process: on every process alike, with
    the same message (decided over the processes: one process raising alone would leave the others waiting in their
    next collective)."""
    parts = split_by_prompt_groups(batch, group_index, groups, mini_batches)
    empty = torch.tensor([float(part.completion_ids.shape[0] == 0) for part in parts])
    empty = every_process(processes, empty, process_index)  # (P, mini_batches)
    if empty.any():
        described = {p: str(torch.nonzero(row).flatten().tolist()) for p, row in enumerate(empty) if row.any()}
        raise ValueError(f"dropped every rollout of mini-batches {by_process(described, processes.num_processes)}; "
                         f"lower train.mini_batches={mini_batches}")
    return (part for _ in range(epochs) for part in parts)


def zero_on_graph(values: torch.Tensor) -> torch.Tensor:
    """0.0 with ``values``'s graph: its backward sends exactly zero into ``values`` (nan_to_num masks the gradient of
    its non-finite entries, where 0 x NaN would be NaN). Zero gradients in the parameters follow when the graph's
    own local derivatives are finite (a logp from finite activations); the loss's graph can hold NaN ones (NaN token
    weights): the gradients are then NaN, and are discarded by the optimizer step every process skips."""
    return (torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum().abs()  # abs: never -0.0


class Actor:
    """Forwards and loss of the policy ``method`` trains, under ``train``; every forward is counted in
    ``accounting``; ``log(name, value)`` takes the step's metrics; ``reference``: the frozen reference policy
    (beta > 0 or a method reading ref_logp) or None."""

    def __init__(self, method: Method, train: TrainConfig, accounting: StepAccounting, processes: Processes,
                 log: Callable[[str, float], None], special_token_ids: tuple[int, ...],
                 reference: torch.nn.Module | None = None):
        self.method = method
        self.train = train
        self.settings = StepSettings.of(train)  # what the step context and the loss read of train
        self.accounting = accounting
        self.processes = processes
        self.log = log
        self.special_token_ids = special_token_ids
        self.reference = reference
        self.nonfinite_steps = 0  # steps whose loss was non-finite on any process: the same count on every process
        self.skip_optimizer_step = False  # the current update's, set by policy_loss alike on every process

    @property
    def updates_per_generation(self) -> int:
        """Optimizer steps per generation batch: train.mini_batches x train.ppo_epochs."""
        return self.train.mini_batches * self.train.ppo_epochs

    # --- one generation batch, top to bottom: hooks, pi_old and pi_ref, then each mini-batch's loss ---------------

    def step_batch(self, model, out: dict, rollouts: RolloutBatch, ctx: StepContext) -> StepBatch:
        """A generation batch ready for its updates: the method's hooks on its ``rollouts`` (advantages, selection,
        truncation: ``hooks.prepare_batch``, before any forward pass), the rows and columns they kept of TRL's
        generated batch ``out`` (``StepBatch.kept``), then the no-grad passes (``before_updates``)."""
        prepared = prepare_batch(self.method, rollouts, ctx)
        self._require_kept_tokens(len(prepared.rows) == 0 or prepared.length == 0, ctx)
        self.log("rollouts/kept_frac", len(prepared.rows) / out["completion_ids"].shape[0])
        return self.before_updates(model, StepBatch.kept(out, prepared, out["completion_ids"].device), ctx)

    def _require_kept_tokens(self, kept_nothing: bool, ctx: StepContext) -> None:
        """Raises on every process, with the same message, when the method kept no rollout or no token on any
        process (``kept_nothing``: this one's), decided in one all-reduce: a process raising alone would leave the
        others waiting in their next collective. A process with nothing does not take part with a zero-weight row
        instead: that row's forward would count in the budget and its tokens in the method's denominators (token
        means over the step's tokens of every process), changing the other processes' losses."""
        flags = every_process(self.processes, torch.tensor([float(kept_nothing)]), ctx.process_index)[:, 0]
        empty = torch.nonzero(flags).flatten().tolist()
        if empty:
            where = "" if self.processes.num_processes == 1 else f" on processes {empty}"
            raise RuntimeError(f"method {self.method.name!r} kept no rollout or no token in step {ctx.step}{where}; "
                               "a method must keep at least one token")

    def before_updates(self, model, batch: StepBatch, ctx: StepContext) -> StepBatch:
        """The no-grad passes over the kept batch, once before its optimizer steps (verl computes old and
        reference log-probs once per generation batch too): pi_old when the batch feeds several steps, pi_ref when
        there is a reference model (KL term, or a method reading ref_logp); both at the method's
        ``loss_positions``."""
        positions = self.method.loss_positions(batch.rollout_batch(self.special_token_ids), ctx)
        old_logp = self.old_log_probs(model, batch, positions) if self.updates_per_generation > 1 else None
        ref_logp = None if self.reference is None else self.reference_log_probs(batch, positions)
        return batch.with_log_probs(old_logp, ref_logp)

    def old_log_probs(self, model, inputs: Sequences, loss_positions: torch.Tensor | None = None) -> torch.Tensor:
        """log pi_old (B, T) of the kept batch before its first update: one no-grad forward, phase old_logp."""
        clock = self.accounting.clock
        started = clock.start()
        with torch.no_grad():
            logp = self.statistics(model, inputs, (), "old_logp", False, loss_positions)["logp"]
        clock.stop("old_logp", started)
        return logp

    def reference_log_probs(self, inputs: Sequences, loss_positions: torch.Tensor | None = None) -> torch.Tensor:
        """log pi_ref (no grad) of a batch, timed as the reference phase."""
        clock = self.accounting.clock
        started = clock.start()
        # the reference is not prepared by accelerate: its forward gets the policy's autocast explicitly
        with torch.no_grad(), self.processes.autocast():
            ref_logp = self.statistics(self.reference, inputs, (), "reference", False, loss_positions)["logp"]
        clock.stop("reference", started)
        return ref_logp

    def policy_loss(self, model, inputs: StepBatch, ctx: StepContext) -> torch.Tensor:
        """The method's weights on the whole mini-batch, then ``sum(w l) / D`` (+ beta KL) of its rows: in one
        forward (the caller runs the backward), or (``train.backward_chunk_rows``) row chunk by row chunk after a
        no-grad forward that gives the method its batch-wide statistics. One optimizer step per mini-batch: no
        accumulation scaling. A non-finite loss on any process skips the step on every process
        (``skip_optimizer_step``, ``_skip_nonfinite_step``)."""
        started = time.perf_counter()
        batch = inputs.rollout_batch(self.special_token_ids)
        plan = self._backward_plan(inputs)
        # decided over the processes: one taking the one-forward path while another chunks would run fewer
        # forwards and backwards (ZeRO-3 pairs their collectives); with one process: no collective
        in_chunks = plan is not None and self._most_chunks(plan) > 1
        positions = self.method.loss_positions(batch, ctx)  # (B, T) bool or None: the LM head runs only there
        with torch.no_grad() if in_chunks else nullcontext():
            stats = self.token_stats(model, inputs, backward=not in_chunks, loss_positions=positions)
        result = weigh_tokens(self.method, stats, PreparedBatch(batch, rows=torch.arange(0), length=0), ctx)
        loss_inputs = loss_inputs_for(self.method, batch, result, ctx, positions,
                                      old_logp=inputs.old_logp, ref_logp=stats.ref_logp)
        loss_inputs = self.normalised(loss_inputs, result, batch, inputs, ctx)
        mask, computed = batch.completion_mask, loss_inputs.mask  # metrics average over the computed tokens
        config = self.settings.loss_config()
        if in_chunks:
            loss, metrics = self._loss_in_backward_chunks(model, inputs, loss_inputs, config, plan, positions)
        else:
            loss, metrics = loss_of_rows(stats.logp, loss_inputs, config)
        self._log_step_metrics(stats, result, metrics, mask, started, computed)
        losses = every_process(self.processes, loss.detach().float().reshape(1), ctx.process_index)[:, 0]
        nonfinite = torch.nonzero(~torch.isfinite(losses)).flatten().tolist()
        self.skip_optimizer_step = bool(nonfinite)
        if nonfinite:
            # in chunks, the earlier chunks' backward has run: only the last chunk's graph is left, on the loss
            return self._skip_nonfinite_step(loss if in_chunks else stats.logp, losses, nonfinite, ctx)
        return loss

    def token_stats(self, model, inputs: StepBatch, backward: bool = True,
                    loss_positions: torch.Tensor | None = None) -> TokenStats:
        """Current-policy statistics; old_logp is the rollout policy's (``before_updates``) when the batch feeds
        several optimizer steps, else logp.detach() (pi_old = pi_theta); ref_logp the reference's, None without a
        reference model."""
        extras = tuple(sorted(({"entropy"} | statistics_read(self.method, self.train.beta)) & set(EXTRA_STATISTICS)))
        stats = self.statistics(model, inputs, extras, "train", backward, loss_positions)
        old_logp = inputs.old_logp
        return TokenStats(logp=stats["logp"], old_logp=stats["logp"].detach() if old_logp is None else old_logp,
                          entropy=stats.get("entropy"), sum_p2=stats.get("sum_p2"), ref_logp=inputs.ref_logp)

    def normalised(self, loss_inputs: LossInputs, result: TokenWeights, batch, inputs: Sequences,
                   ctx: StepContext) -> LossInputs:
        """The denominators of the optimizer step's loss (``train.loss_micro_batch_tokens``).

        0: one mean over the rollouts of every process: the method's denominator parts (and the KL term's) are summed
        over the processes in one all-reduce (``hooks.with_global_denominators``; nothing to do with one process).
        N > 0: verl's legacy micro-batch means (``harness.train.micro_batches``): this process's rows are split into
        micro-batches of at most N prompt + completion tokens, as many as the largest count of any process (verl
        takes that maximum too), each weighted by its rows / the process's rows over its own denominator.
        Logs ``loss/denominator`` and ``loss/kl_denominator`` (the step's, over every process) or
        ``loss/micro_batches`` (this process's count)."""
        parts, kl_parts = denominator_parts(result, batch, ctx)
        tokens = self.train.loss_micro_batch_tokens
        processes = self.processes.num_processes
        if tokens:
            if parts is None or kl_parts is None:
                raise ValueError(f"method {self.method.name!r} returned no row_denominators (TokenWeights): "
                                 "train.loss_micro_batch_tokens needs them to take each micro-batch's denominator")
            lengths = (inputs.prompt_mask.sum(dim=1) + inputs.completion_mask.sum(dim=1)).tolist()
            micro_batches = balanced_micro_batches(lengths, self.processes.max(micro_batch_count(lengths, tokens)))
            self.log("loss/micro_batches", float(len(micro_batches)))
            return with_row_scales(loss_inputs, micro_batch_row_scales(micro_batches, parts),
                                   micro_batch_row_scales(micro_batches, kl_parts))
        if processes == 1:
            self.log("loss/denominator", float(loss_inputs.denominator))
            self.log("loss/kl_denominator", float(loss_inputs.kl_denominator))
            return loss_inputs
        local = [result.denominator if parts is None else parts.sum(),
                 loss_inputs.kl_denominator if kl_parts is None else kl_parts.sum()]
        local = torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()).to(self.processes.device)
                             for v in local])
        total = self.processes.sum(local).to(torch.float32).clamp(min=1.0)
        self.log("loss/denominator", float(total[0]))
        self.log("loss/kl_denominator", float(total[1]))
        return with_global_denominators(loss_inputs, total[0], total[1], processes)

    def _backward_plan(self, inputs: Sequences) -> list[torch.Tensor] | None:
        """The row chunks of the chunked backward (``train.backward_chunk_rows``, ``backward_chunk_tokens``; rows
        alone: all of this process's rows), or None when neither is set."""
        rows, tokens = self.train.backward_chunk_rows, self.train.backward_chunk_tokens
        if not (rows or tokens):
            return None
        return chunk_plan(inputs, rows or max(inputs.completion_ids.shape[0], 1), tokens)

    def _loss_in_backward_chunks(self, model, inputs: Sequences, loss_inputs: LossInputs, config: LossConfig,
                                 plan: list[torch.Tensor], loss_positions: torch.Tensor | None = None,
                                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of the whole batch with activations of only one row chunk alive at a time: each row chunk
        of ``plan`` runs forward + backward with its share of the loss (its rows' terms over the whole batch's
        denominators),
        gradients accumulating, synchronised across processes only in the last backward, which the caller runs on
        the returned loss. Returns the whole loss's value (with the last chunk's graph) and the batch's metrics.
        A process with fewer row chunks than another first runs an ``_idle_forward`` and a backward of 0.0 on it for
        each it lacks: every process runs as many forwards and backwards (``statistics``)."""
        chunks = list(row_chunks(inputs, plan))
        for _ in range(self._chunks_behind(len(plan), inputs)):
            with self.processes.accumulating(model):  # first: the caller's last backward is a real chunk's
                idle = self._idle_forward(model, inputs.completion_ids)
                self.processes.backward(0.0 * idle.sum())
        done, parts = torch.zeros((), device=loss_inputs.mask.device), []
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            # DDP decides in the forward whether its backward all-reduces: every chunk's forward but the last runs
            # inside no_sync too, or each chunk's backward would all-reduce the gradients
            with nullcontext() if last else self.processes.accumulating(model):
                logp = self._row_chunk_statistics(model, chunk, (), "train", True, loss_positions)["logp"]
                rows = loss_inputs.rows(chunk.rows, chunk.completion_width)
                loss, metrics = loss_of_rows(logp, rows, config)
                parts.append((metrics, rows.mask.sum()))
                if last:
                    return loss + done, combine_row_metrics(parts)  # the whole loss's value; the last chunk's graph
                self.processes.backward(loss)
            done = done + loss.detach()

    def _skip_nonfinite_step(self, graph: torch.Tensor, losses: torch.Tensor, nonfinite: list[int],
                             ctx: StepContext) -> torch.Tensor:
        """A step whose loss was NaN/inf on the processes ``nonfinite`` (``losses``: every process's loss), decided
        alike on every process: each counts it, skips its optimizer step (``skip_optimizer_step``, set by the caller)
        and, past ``train.max_nonfinite_steps``, raises the same error. Returns 0.0 on ``graph`` (the step's logp, or
        its loss when the backward ran in row chunks) for the backward every process still runs: the same graph as a
        finite step's, so DDP's and ZeRO-3's collectives pair up (a graph over ``p.data`` would not: ZeRO-3's is
        empty)."""
        self.nonfinite_steps += 1
        self.log("nonfinite/skipped_total", float(self.nonfinite_steps))
        limit = self.train.max_nonfinite_steps
        if self.nonfinite_steps > limit:
            values = by_process({p: str(float(losses[p])) for p in nonfinite}, len(losses))
            raise NonFiniteLossError(
                f"method {self.method.name!r}: the loss was {values} in {self.nonfinite_steps} steps (last at "
                f"step {ctx.step + 1}), more than train.max_nonfinite_steps={limit}; stopping")
        return zero_on_graph(graph)

    def _log_step_metrics(self, stats: TokenStats, result: TokenWeights, loss_metrics: dict[str, torch.Tensor],
                          mask, started: float, computed) -> None:
        """``mask``: the completion tokens; ``computed``: those with statistics (fewer under loss_positions)."""
        with torch.no_grad():
            n_tokens = mask.sum().clamp(min=1)
            weighted = (result.weights != 0) & (mask > 0)
            for region in ("region", "low", "high", "dual"):  # fractions of completion tokens; 0 while r = 1
                self.log(f"clip_ratio/{region}_mean", float(loss_metrics[f"clip_ratio/{region}_mean"]))
            self.log("tokens/weighted_frac", float(weighted.sum() / n_tokens))
            if stats.entropy is not None:
                self.log("entropy", float((stats.entropy * computed).sum() / computed.sum().clamp(min=1)))
            self.accounting.step_ledger.weighted_tokens += int(weighted.sum())
            for name, value in result.metrics.items():
                self.log(f"method/{name}", float(value))
            self.log("time/loss_s", time.perf_counter() - started)
            if "kl" in loss_metrics:
                self.log("kl", float(loss_metrics["kl"]))

    # --- forwards: token statistics by row chunks, counted in the budget ---------------------------------------------

    def statistics(self, model, inputs: Sequences, extras: tuple[str, ...], phase: str, backward: bool,
                   loss_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Token statistics (B, T) of the whole batch, computed in row chunks (``train.forward_chunk_rows``,
        ``train.forward_chunk_tokens``: ``chunk_plan``); their FLOPs go to ``phase`` (x3 when a backward follows).
        ``loss_positions`` (B, T) bool: the LM head runs only there (``Method.loss_positions``).

        Every process runs as many model forwards as the process with the most row chunks (ZeRO-3 and FSDP gather
        each layer's weights in every forward, so the counts must agree; processes differ in rows when methods drop
        rollouts): one with fewer runs ``_idle_forward`` for each chunk it lacks, on the graph with grad (its logp x
        0.0 added to the statistics: a following backward reaches it with exactly zero). With one process: none,
        and no collective."""
        plan = chunk_plan(inputs, self.train.forward_chunk_rows, self.train.forward_chunk_tokens)
        behind = self._chunks_behind(len(plan), inputs)  # agreed before any forward
        stats = statistics_by_row_chunks(inputs, plan, lambda chunk: (
            self._row_chunk_statistics(model, chunk, extras, phase, backward, loss_positions)))
        for _ in range(behind):
            idle = self._idle_forward(model, inputs.completion_ids)
            if torch.is_grad_enabled():
                stats["logp"] = stats["logp"] + 0.0 * idle.sum()
        return stats

    def _most_chunks(self, plan: list[torch.Tensor]) -> int:
        """The most row chunks any process's ``plan`` has (this process's count with one process: no collective)."""
        if self.processes is None or self.processes.num_processes == 1:
            return len(plan)
        return self.processes.max(len(plan))

    def _chunks_behind(self, chunks: int, inputs: Sequences) -> int:
        """How many fewer row chunks this process has (``chunks``) than the most any process has, in one
        all-reduce that every process must reach before its forwards (one still in a forward would pair its weight
        gathers with it); 0 and no collective with one process. Rows that the padding-free forward cannot pack
        (``rows_not_packable``) on any process raise the same error on every process here, before any forward: a
        process raising alone would leave the others waiting in a collective."""
        unpackable = rows_not_packable(inputs) if self.train.padding_free else 0
        flagged = chunks + (UNPACKABLE if unpackable else 0)
        single = self.processes is None or self.processes.num_processes == 1
        most = flagged if single else self.processes.max(flagged)
        if most >= UNPACKABLE:
            own = f"{unpackable} row(s) of this process" if unpackable else "none of this process's rows"
            raise ValueError(f"padding-free forward: a training process holds rows whose attention mask is not one "
                             f"contiguous run of real tokens ({own}); set train.padding_free=false to forward such "
                             "rows padded")
        return 0 if single else most - chunks

    def _idle_forward(self, model, like: torch.Tensor) -> torch.Tensor:
        """logp (1, 1) of one model forward over two tokens (id 0: a one-token prompt and completion, on ``like``'s
        device), not counted in the budget: what a process runs in place of a row chunk it lacks (``statistics``)."""
        ids = torch.zeros((1, 2), dtype=like.dtype, device=like.device)
        return model_token_statistics(model, ids, torch.ones_like(ids), 1, (), self.train.temperature,
                                      self.train.stats_chunk_size)["logp"]

    def _row_chunk_statistics(self, model, chunk: RowChunk, extras: tuple[str, ...], phase: str,
                              backward: bool, loss_positions: torch.Tensor | None) -> dict[str, torch.Tensor]:
        train, shape = self.train, self.accounting.model_shape
        picked = None if loss_positions is None else loss_positions[chunk.rows, :chunk.completion_width]
        if train.padding_free:
            packed = packed_rows(chunk, train.share_prompts)
            completion_ids = chunk.input_ids[:, -chunk.completion_width:]
            stats = packed_model_token_statistics(model, packed, completion_ids, extras, train.temperature,
                                                  train.stats_chunk_size, picked)
            positions = packed.positions
            logits = int(packed.valid.sum()) if picked is None else int((packed.valid & picked.bool()).sum())
            flops = packed_forward_flops(shape, positions, len(chunk.rows), packed.attention_width,
                                         max(logits, 1))  # >= 1: see StatisticsHead
        else:
            stats = model_token_statistics(model, chunk.input_ids, chunk.attention_mask, chunk.completion_width,
                                           extras, train.temperature, train.stats_chunk_size, picked)
            positions = chunk.input_ids.numel()
            flops = padded_forward_flops(shape, len(chunk.rows), chunk.input_ids.shape[1], chunk.completion_width,
                                         None if picked is None else max(int(picked.sum()), 1))
        self.accounting.count_forward(phase, flops, positions, backward)
        return stats
