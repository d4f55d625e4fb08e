"""A paper preset's first training steps at the real model's dimensions with fewer rows: peak device memory and
step time against the analytic figure of ``harness plan`` (harness/config/memory.py).

The model is randomly initialised (no hub download) from the preset's architecture in
``harness.config.memory.ARCHITECTURES`` (hidden, intermediate, layers, heads, KV heads, vocabulary, tied head, q/k/v
biases, Qwen3's q/k norms), in ``train.master_dtype`` on the requested device, with the forward under bf16 autocast
when ``model.dtype`` is bfloat16 (the model's ``forward`` wrapped as accelerate wraps it) and activation
checkpointing as ``train.activation_checkpointing`` says (``activation_checkpointing_enable``, as transformers'
Trainer calls it). The rows are synthetic rollouts of the preset's longest shape: each row a prompt of
``sequence_tokens - max_completion_length`` random token ids (its own prompt: no prompt sharing, the plan's
assumption) and a full ``max_completion_length`` completion, rewards alternating 1, 0 within groups of
``num_generations`` (so the uniform baseline keeps and weighs every token). Default rows: 2 x
``train.backward_chunk_rows`` (the chunked backward runs two chunks).

Each step is the harness's own update path, one process: the method's ``prepare_batch`` and ``StepBatch.kept``
(harness/train/hooks.py, harness/train/step_batch.py), the ``Actor`` (harness/train/actor.py) with the preset's
forward/backward row chunks, statistics chunk and padding-free packing: ``before_updates`` (pi_old, when the preset
takes several updates per generation batch, once, as the trainer does), ``policy_loss`` + backward, gradient
clipping (``train.max_grad_norm``) and fused AdamW (transformers' default ``adamw_torch_fused``; the preset's lr
and weight decay on every parameter). Two steps by default: AdamW allocates its state in the first step's
optimizer step, after that step's backward, so only the second step has the optimizer state alive beside the
activations, as every later step of a run (the peak the plan sizes).

Measured per step: seconds (device synchronised) and, on CUDA, ``torch.cuda.max_memory_allocated`` (tensors only;
``max_memory_reserved`` too, the allocator's cache with its fragmentation). On CPU the peak resident set (VmHWM) is
reported instead, which holds the Python process, its libraries and the allocator's cache: not comparable with
the analytic figure, no verdict.

Analytic figures (harness/config/memory.py ``training_memory``, its public function):
- this run: the preset at one training process (the ddp layout: whole float32 masters, gradients, AdamW state,
  autocast weight cache, no DDP buckets) with this run's rows, without the vLLM share and the CUDA context (both
  outside torch's allocator): what ``max_memory_allocated`` must stay below. PASS when measured <= analytic (the
  plan must not under-estimate), FAIL otherwise or when the step ran out of memory;
- the plan's: the preset as launched (its processes, engine and rows), the training part (without the vLLM share),
  as ``harness plan`` prints it: for reference.
A ZeRO-3 preset run here holds the whole unsharded model in one process (Qwen3-8B: ~140 GiB with AdamW, more than
an 80 GiB GPU): the figures say so; only a ``--scale tiny`` run of such a preset fits anywhere.

``--scale tiny`` (a CPU smoke run of the same code path): 2 layers, hidden 64, intermediate 128, 4 heads of 16,
vocabulary 512, 64-token completions and the prompt shrunk in the same proportion (``loss_micro_batch_tokens`` too);
chunk sizes and every other setting as the preset's.

Usage:  python -m bench.real_shape_step [--sweep configs/sweeps/paper-ktae.yaml] [--device cuda|cpu] [--rows N]
        [--steps 2] [--method uniform] [--scale real|tiny] [--results DIR]   (exit status 1 on FAIL)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from bench.machine import environment
from bench.memory import hwm_bytes, reset_peak_rss
from bench.publish import add_path_args, publish, table

GIB = 2**30
TINY_COMPLETION_TOKENS = 64
TINY_DIMENSIONS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "head_dim": 16, "vocab_size": 512}
# parts of training_memory that are not tensors of the training step in torch's allocator
OUTSIDE_THE_STEP = ("vLLM share", "transformers generate KV cache", "CUDA context")


# --- shapes --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What the run builds: the architecture, the preset's train section at this scale, the row lengths."""

    arch: object  # harness.config.memory.Architecture
    train: object  # TrainConfig, lengths scaled with --scale tiny
    prompt_tokens: int
    completion_tokens: int


def run_shapes(preset, scale: str) -> Shapes:
    """The preset's real architecture and lengths, or their ``tiny`` reduction (module docstring)."""
    from harness.config.memory import architecture, sequence_tokens

    arch = architecture(preset.model)
    if arch is None:
        raise SystemExit(f"preset {preset.name!r}: the dimensions of {preset.model.name_or_path!r} are not known "
                         "(harness/config/memory.py ARCHITECTURES)")
    train = preset.train
    tokens, completion = sequence_tokens(preset, arch), train.max_completion_length
    if tokens <= completion:
        raise SystemExit(f"preset {preset.name!r}: {tokens} tokens per row leave no prompt beside "
                         f"{completion} completion tokens")
    if scale == "real":
        return Shapes(arch, train, tokens - completion, completion)
    prompt = max(1, round((tokens - completion) * TINY_COMPLETION_TOKENS / completion))
    length = prompt + TINY_COMPLETION_TOKENS
    tiny = dataclasses.replace(arch, **TINY_DIMENSIONS, num_key_value_heads=min(arch.num_key_value_heads, 2),
                               max_position_embeddings=length, source=f"{arch.source}, scaled down (--scale tiny)")
    def scaled_tokens(value: int) -> int:  # a token count of the real lengths, at the tiny ones (0 stays 0)
        return max(length, round(value * length / tokens)) if value else 0

    scaled = dataclasses.replace(train, max_completion_length=TINY_COMPLETION_TOKENS, vllm_max_model_length=length,
                                 loss_micro_batch_tokens=scaled_tokens(train.loss_micro_batch_tokens),
                                 forward_chunk_tokens=scaled_tokens(train.forward_chunk_tokens),
                                 backward_chunk_tokens=scaled_tokens(train.backward_chunk_tokens))
    return Shapes(tiny, scaled, prompt, TINY_COMPLETION_TOKENS)


def default_rows(shapes: Shapes) -> int:
    """Two backward chunks of full-length rows; one prompt group when the backward is not chunked."""
    from harness.config.memory import chunk_tokens

    train, row_tokens = shapes.train, shapes.prompt_tokens + shapes.completion_tokens
    if not (train.backward_chunk_rows or train.backward_chunk_tokens):
        return train.num_generations
    rows = train.backward_chunk_rows or train.num_generations
    return 2 * (chunk_tokens(rows, train.backward_chunk_tokens, row_tokens) // row_tokens)


# --- analytic figures ----------------------------------------------------------------------------------------------


def step_parts(parts: dict) -> tuple[dict, dict]:
    """``training_memory`` parts split into the training step's tensors and the rest (vLLM, CUDA context)."""
    inside = {name: value for name, value in parts.items() if not name.startswith(OUTSIDE_THE_STEP)}
    return inside, {name: value for name, value in parts.items() if name not in inside}


def analytic_figures(preset, shapes: Shapes, rows: int, run_reference: bool, plan_reference: bool) -> dict:
    """harness/config/memory.py's figures for this run (one process, ``rows`` rows, tensors in torch's allocator)
    and for the preset as planned (its processes and rows; the training part: without the vLLM share)."""
    from harness.config.memory import training_memory

    planned = dataclasses.replace(preset, train=shapes.train)
    plan = training_memory(planned, shapes.arch, plan_reference)
    plan_step, plan_outside = step_parts(plan.parts)
    plan_training = {name: value for name, value in plan.parts.items() if not name.startswith("vLLM share")}
    # one process (the python launcher: ddp layout, no buckets) whose mini-batch is exactly this run's rows
    one_process = dataclasses.replace(shapes.train, launcher="python", prompts_per_step=1, num_generations=rows,
                                      mini_batches=1)
    run = training_memory(dataclasses.replace(preset, train=one_process), shapes.arch, run_reference)
    run_step, run_outside = step_parts(run.parts)
    return {"run_bytes": sum(run_step.values()), "run_parts": run_step, "run_excluded": run_outside,
            "run_notes": run.notes, "plan_training_bytes": sum(plan_training.values()), "plan_training_parts":
            plan_training, "plan_step_bytes": sum(plan_step.values()), "plan_excluded": plan_outside,
            "plan_notes": plan.notes}


# --- the model and the rows ----------------------------------------------------------------------------------------


class OneProcess:
    """The actor's ``Processes`` for one process without a distributed engine (what ``AcceleratorProcesses`` is
    with one process): the model's forward under ``autocast_dtype`` as accelerate's ``prepare`` wraps it."""

    num_processes = 1

    def __init__(self, device, autocast_dtype):
        import torch

        self.device = device
        self.autocast_dtype = autocast_dtype
        self._torch = torch

    def sum(self, values):
        return values

    def max(self, value: int) -> int:
        return value

    def backward(self, loss) -> None:
        loss.backward()

    def accumulating(self, model):
        return nullcontext()

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return self._torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def prepare(self, model):
        """The model's forward in the policy's mixed precision (accelerate: ``model.forward`` wrapped in autocast)."""
        if self.autocast_dtype is not None:
            model.forward = self.autocast()(model.forward)
        return model


def build_model(arch, train, device):
    """A randomly initialised model of ``arch`` in ``train.master_dtype`` on ``device`` (built there), sdpa
    attention (the packed forward switches it), activation checkpointing as the preset says."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.memory_model import hf_config
    from harness.model.checkpoints import TORCH_DTYPES

    torch.manual_seed(0)
    config = hf_config(arch)
    config.use_cache = False
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=TORCH_DTYPES[train.master_dtype],
                                                 attn_implementation="sdpa")
    model.train()
    if train.activation_checkpointing:
        model.activation_checkpointing_enable()
    return model


def synthetic_inputs(method, shapes: Shapes, rows: int, ctx, device):
    """The kept ``StepBatch`` of ``rows`` rollouts of the longest shape (module docstring), on ``device``."""
    import torch

    from harness.train.hooks import new_rollout_batch, prepare_batch
    from harness.train.step_batch import StepBatch

    g = torch.Generator().manual_seed(1)
    vocab, train = shapes.arch.vocab_size, shapes.train
    prompt_ids = torch.randint(0, vocab, (rows, shapes.prompt_tokens), generator=g)
    completion_ids = torch.randint(0, vocab, (rows, shapes.completion_tokens), generator=g)
    mask = torch.ones(rows, shapes.completion_tokens)
    group = torch.arange(rows) // train.num_generations
    rewards = (torch.arange(rows) % 2 == 0).float()  # both rewards in every group of two or more
    batch = new_rollout_batch(completion_ids, mask, rewards, group, train.scale_rewards)
    out = {"prompt_ids": prompt_ids.to(device), "prompt_mask": torch.ones_like(prompt_ids).to(device),
           "completion_ids": completion_ids.to(device), "completion_mask": mask.long().to(device)}
    return StepBatch.kept(out, prepare_batch(method, batch, ctx), device)


def fingerprints(model) -> list[float]:
    """One float64 sum per parameter: which parameters a step moved."""
    import torch

    return [float(p.detach().sum(dtype=torch.float64)) for p in model.parameters()]


# --- the steps -----------------------------------------------------------------------------------------------------


class Memory:
    """The step's peak on the device: CUDA's allocator counters, or the process's resident set on CPU."""

    def __init__(self, device):
        import torch

        self.device, self.torch = device, torch
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_peak_rss()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def peak(self) -> dict:
        if self.cuda:
            return {"peak_allocated_bytes": self.torch.cuda.max_memory_allocated(self.device),
                    "peak_reserved_bytes": self.torch.cuda.max_memory_reserved(self.device)}
        return {"peak_rss_bytes": hwm_bytes()}


def run_steps(model, actor, optimizer, inputs, contexts: list, train, memory: Memory) -> list[dict]:
    """``len(contexts)`` optimizer steps on ``inputs``; each step's seconds, peak and loss. pi_old (several
    updates per generation batch) once, in the first step, as the trainer runs it per generation batch."""
    import torch

    records = []
    for index, ctx in enumerate(contexts):
        memory.reset()
        started = time.perf_counter()
        if index == 0:
            inputs = actor.before_updates(model, inputs, ctx)
        loss = actor.policy_loss(model, inputs, ctx)
        actor.processes.backward(loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
        if not actor.skip_optimizer_step:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        memory.sync()
        records.append({"step": index + 1, "seconds": time.perf_counter() - started, **memory.peak(),
                        "loss": float(loss.detach()), "grad_norm": float(norm),
                        "skipped": actor.skip_optimizer_step})
        print(f"step {index + 1}: {records[-1]['seconds']:.2f} s, {peak_text(records[-1])}", flush=True)
    return records


def size(value: float) -> str:
    """Bytes as GiB, or MiB below one GiB (a tiny run's figures)."""
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.1f} MiB"


def peak_text(record: dict) -> str:
    if "peak_allocated_bytes" in record:
        return f"peak allocated {size(record['peak_allocated_bytes'])} (reserved {size(record['peak_reserved_bytes'])})"
    return f"peak resident set {size(record.get('peak_rss_bytes') or 0)} (process, not comparable)"


def verdict_of(record: dict) -> str:
    """PASS / FAIL on CUDA (module docstring), n/a on CPU."""
    if record.get("error"):
        return "FAIL"
    if record["device"] != "cuda":
        return "n/a"
    return "PASS" if record["measured_peak_bytes"] <= record["analytic"]["run_bytes"] else "FAIL"


def measure(args) -> dict:
    """Build, step and measure (the module docstring); the record that ``main`` publishes."""
    import torch

    from harness.config.loading import load_method, resolve
    from harness.ops.resources import needs_reference
    from harness.train.actor import Actor
    from harness.train.budget import ModelShape, StepAccounting
    from harness.train.hooks import statistics_read
    from harness.train.step_settings import StepSettings
    from methods.registry import get_method_class

    resolved = resolve(args.sweep)
    preset = resolved.preset
    shapes = run_shapes(preset, args.scale)
    train = shapes.train
    rows = args.rows or default_rows(shapes)
    spec = load_method(args.method, search_dirs=resolved.sweep.method_config_dirs)
    method = get_method_class(spec.name)(spec.params)
    reference_needed = "ref_logp" in statistics_read(method, train.beta)
    device = torch.device(args.device)
    torch.set_num_threads(train.threads)  # as a run sets it (harness/train/run.py build_trainer)
    bf16 = preset.model.dtype == "bfloat16"
    record = {"name": args.name, "sweep": str(args.sweep), "preset": preset.name, "model": preset.model.name_or_path,
              "scale": args.scale, "method": args.method, "device": device.type,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "architecture": dataclasses.asdict(shapes.arch), "parameters": shapes.arch.parameters, "rows": rows,
              "prompt_tokens": shapes.prompt_tokens, "completion_tokens": shapes.completion_tokens,
              "settings": {key: getattr(train, key) for key in (
                  "forward_chunk_rows", "backward_chunk_rows", "forward_chunk_tokens", "backward_chunk_tokens",
                  "stats_chunk_size", "padding_free", "share_prompts",
                  "activation_checkpointing", "master_dtype", "mini_batches", "ppo_epochs",
                  "loss_micro_batch_tokens", "learning_rate", "weight_decay", "max_grad_norm", "distributed",
                  "launcher")} | {"compute_dtype": preset.model.dtype, "reference_model": reference_needed},
              "analytic": analytic_figures(preset, shapes, rows, reference_needed, needs_reference(resolved))}
    print(f"{preset.name} ({preset.model.name_or_path}, {args.scale} dimensions, {shapes.arch.parameters:,} "
          f"parameters) on {record['device_name']}: {rows} rows x {shapes.prompt_tokens} + {shapes.completion_tokens} "
          f"tokens, method {args.method}, {train.master_dtype} masters, {preset.model.dtype} compute", flush=True)
    model = reference = None
    try:
        model = build_model(shapes.arch, train, device)
        record["model_class"] = type(model).__name__
        processes = OneProcess(device, torch.bfloat16 if bf16 else None)
        if reference_needed:  # frozen, in model.dtype, outside autocast's wrapper (the actor applies it)
            reference = copy.deepcopy(model).to(getattr(torch, preset.model.dtype)).eval().requires_grad_(False)
        processes.prepare(model)
        actor = Actor(method, train, StepAccounting(ModelShape.of(model), device), processes,
                      lambda name, value: None, (), reference)
        optimizer = torch.optim.AdamW(model.parameters(), lr=train.learning_rate, weight_decay=train.weight_decay,
                                      fused=True)
        settings = StepSettings.of(train).replace(max_completion_length=shapes.completion_tokens)
        contexts = [settings.context(step=step) for step in range(args.steps)]
        inputs = synthetic_inputs(method, shapes, rows, contexts[0], device)
        before = fingerprints(model)
        record["steps"] = run_steps(model, actor, optimizer, inputs, contexts, train, Memory(device))
        after = fingerprints(model)
        record["parameters_moved"] = sum(a != b for a, b in zip(before, after, strict=True))
        record["parameter_tensors"] = len(before)
    except torch.OutOfMemoryError as exc:
        record["error"] = f"out of memory: {str(exc).splitlines()[0]}"
        record.setdefault("steps", [])
        if device.type == "cuda":
            record["oom_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    peaks = [step.get("peak_allocated_bytes", step.get("peak_rss_bytes")) or 0 for step in record["steps"]]
    record["measured_peak_bytes"] = max(peaks, default=record.get("oom_peak_allocated_bytes", 0))
    record["measured_kind"] = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
                               "peak resident set of the process (VmHWM): not comparable with the analytic figure")
    record["ratio"] = record["measured_peak_bytes"] / record["analytic"]["run_bytes"]
    record["verdict"] = verdict_of(record)
    return record


def summary_line(record: dict) -> str:
    """One line: the verdict, the measurement and the analytic figures (gpu-smoke.sh prints it)."""
    analytic = record["analytic"]
    steps = record["steps"]
    seconds = ", ".join(f"{s['seconds']:.2f}" for s in steps) or "none"
    cuda = record["device"] == "cuda"
    what = "allocated" if cuda else "resident set (not comparable)"
    ratio = f"ratio {record['ratio']:.2f}" if cuda else "no ratio on CPU"
    failure = f"; {record['error']}" if record.get("error") else ""
    return (f"verdict: {record['verdict']} real-shape step {record['preset']}/{record['method']} "
            f"({record['scale']}) on {record['device_name']}: peak {size(record['measured_peak_bytes'])} {what} vs "
            f"analytic {size(analytic['run_bytes'])} ({ratio}); plan's training figure "
            f"{size(analytic['plan_training_bytes'])}; step seconds {seconds}{failure}")


def markdown_of(record: dict, env: dict) -> str:
    analytic = record["analytic"]
    parts = [[name, size(value)] for name, value in analytic["run_parts"].items()]
    steps = [[s["step"], f"{s['seconds']:.2f}", peak_text(s), f"{s['loss']:.4g}", s["skipped"]]
             for s in record["steps"]]
    return "\n".join([
        f"## Real-shape training step: {record['preset']} ({record['scale']}) on {record['device_name']}", "",
        f"`python -m bench.real_shape_step --sweep {record['sweep']} --device {record['device']} --scale "
        f"{record['scale']}` ({env.get('date', '')}): {record['model']} dimensions ({record['parameters']:,} "
        f"parameters, random init), {record['rows']} rows x ({record['prompt_tokens']} + "
        f"{record['completion_tokens']}) tokens, method {record['method']}, one process; harness/config/memory.py's "
        f"figure for the same run (no vLLM share, no CUDA context) against {record['measured_kind']}.", "",
        table(["step", "seconds", "peak", "loss", "skipped"], steps), "",
        table(["analytic part (this run)", "bytes"], parts), "",
        summary_line(record)])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, default=Path("configs/sweeps/paper-ktae.yaml"))
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--rows", type=int, default=0, help="rollouts (default: 2 x train.backward_chunk_rows)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (default 2: the second has AdamW's "
                                                             "state alive beside the activations)")
    parser.add_argument("--method", default="uniform", help="a method label of configs/method (default uniform)")
    parser.add_argument("--scale", choices=("real", "tiny"), default="real",
                        help="real: the preset's dimensions and lengths; tiny: a 2-layer, 64-hidden model with "
                             "64-token completions (a CPU smoke run)")
    add_path_args(parser, workdir=False)
    parser.add_argument("--out", type=Path, dest="results", help="the same as --results")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is visible")
    stem = Path(args.sweep).stem.removeprefix("paper-")
    args.name = f"real_shape_step_{stem}_{args.device}" + ("" if args.scale == "real" else f"_{args.scale}")
    env = environment(args.cpu_free_flag)
    record = measure(args)
    record["environment"] = env
    publish(args.results, args.name, record, markdown_of(record, env))
    return record


if __name__ == "__main__":
    sys.exit(1 if main()["verdict"] == "FAIL" else 0)
