"""NAT random prefix cutting (RPC): training forward + backward time and peak memory saved against uniform, on the
same generated batch, smol preset (SmolLM2-135M).

The batch: one training step of the smol preset (``prompts_per_step`` x ``num_generations`` rollouts of training
prompts, TRL's sampling settings, scored with the preset's reward), sampled once per completion length and cached
in the work directory. Lengths: the preset's ``max_completion_length`` (64) and a longer one (default 256), closer
to the regime of the paper (long completions, prompts a small share of the positions).

What is measured is exactly the trainer's training side: ``harness.train.trl.bench_probes.loss_inputs`` (the method
hooks: NAT's ``before_forward`` draws the cut, the batch is truncated), the trainer's ``compute_loss`` (rows sorted by
length and cut into chunks of ``train.forward_chunk_rows`` rows, each trimmed to its longest kept row; chunked token
statistics) and ``loss.backward()``. The cut differs per repeat (``ctx.step = repeat``), so the saving averages over
cuts. ``forward_chunk_rows`` is varied: the preset default (16: one chunk for 8 rollouts) and 1 (every row its own
forward). ``train.padding_free`` is varied too (``--padding-free on,unshared,off``): on, each chunk's real tokens run as
one packed sequence and the rollouts of one prompt share one copy of it (``train.share_prompts``, the defaults);
unshared, packed with every row's own copy of its prompt; off, the chunk is padded to its longest kept row (before: with
16 rows per chunk NAT's cut then saved little, every chunk being as long as its longest kept prefix).

Time: uniform and NAT, with and without padding, interleaved in one process (the order reversed every repeat),
one warm-up round, medians over rounds; "uniform / padded" is packed uniform over padded uniform of the same round.
Memory: one subprocess per (setting, variant); after a warm-up forward + backward (gradients then freed, as
``zero_grad(set_to_none=True)`` does between steps) the RSS is the baseline, the kernel's peak mark (VmHWM) is reset
(/proc/self/clear_refs) before each measured forward + backward, and the peak above the baseline is read
(ru_maxrss is recorded too). The working memory includes the parameter gradients (allocated in every backward);
the activation part is that minus the gradients' bytes.

Targets (paper, Qwen3-8B: 29% time and 18% memory): forward + backward time saved >= 25%, peak memory saved >= 15%.

Usage:  python -m bench.nat_savings [--lengths 64,256] [--chunk-rows 16,1] [--repeats 5] [--mem-repeats 3]
        [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.fixtures import sample_rollouts, sweep
from bench.machine import Timer, environment, machine_state
from bench.memory import child_env, current_rss_bytes, hwm_bytes, reset_peak_rss, ru_maxrss_bytes
from bench.publish import add_path_args, table, update_summary, verdict, write_result
from bench.stats import describe, fmt_ratio, paired_ratio

TIME_TARGET, MEMORY_TARGET = 0.25, 0.15
PACKING_MODES = ("on", "unshared", "off")  # packed + shared prompts (the defaults), packed, padded
MB = 1024 * 1024


def batch_path(workdir: Path, length: int, preset: str = "smol") -> Path:
    return workdir / "nat_savings" / f"batch_{preset}_L{length}.pt"


def preset_sweep(args, overrides: list[str] | None = None):
    """The benchmark's sweep (smol; tiny for smoke checks only) with ``overrides`` (and ``--threads``)."""
    threads = [f"train.threads={args.threads}"] if args.threads else []
    return sweep(args.preset, args.workdir, args.warmstart_steps, [*(overrides or []), *threads])


def ensure_batch(args, length: int) -> Path:
    """Sample (once) one training step of the preset with ``max_completion_length = length``, with the sampling
    settings of the run's trainer."""
    import torch

    from harness.config.loading import load_method
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import sampling_settings
    from harness.train.trl.settings import reward_function

    path = batch_path(args.workdir, length, args.preset)
    if path.is_file():
        return path
    resolved, paths = preset_sweep(args, [f"train.max_completion_length={length}"])
    preset = resolved.preset
    trainer = build_trainer(resolved, load_method("uniform"), 0, paths, args.workdir / "nat_savings")
    model, tokenizer = trainer.model, trainer.processing_class
    gen_config, eos = sampling_settings(trainer)
    dataset = trainer.train_dataset
    n = preset.train.prompts_per_step
    prompts, answers = dataset["prompt"][:n], dataset["answer"][:n]
    out = sample_rollouts(model, tokenizer, prompts, preset.train.num_generations, gen_config, eos, seed=length)
    completions = tokenizer.batch_decode([ids[m.bool()] for ids, m in zip(out["completion_ids"],
                                                                          out["completion_mask"], strict=True)],
                                         skip_special_tokens=True)
    values = preset.train.reward_values
    score = reward_function(preset.train.reward, preset.eval.scoring_timeout_s, values.correct, values.wrong)
    rewards = score(None, completions, [a for a in answers for _ in range(preset.train.num_generations)])
    out["rewards"] = torch.tensor(rewards)
    out["group_ids"] = torch.arange(len(rewards)) // preset.train.num_generations
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    print(f"[bench] sampled the L={length} batch: {out['generated_tokens']} tokens in {out['wall_s']:.0f} s, "
          f"rewards {rewards}", flush=True)
    return path


class Harness:
    """The trainer of a uniform run on the preset's warm start (``harness.train.run.build_trainer``); the method is
    swapped between uniform and NAT."""

    def __init__(self, args, chunk_rows: int, checkpointing: str = "on", padding_free: str = "on"):
        import torch

        from harness.config.loading import load_method
        from harness.train.run import build_trainer
        from methods.registry import get_method_class

        resolved, paths = preset_sweep(args, [f"train.forward_chunk_rows={chunk_rows}"])
        self.methods = {}
        for label in ("uniform", "nat"):
            spec = load_method(label)
            self.methods[label] = get_method_class(spec.name)(spec.params)
        self.trainer = build_trainer(resolved, load_method("uniform"), 0, paths, args.workdir / "nat_savings")
        torch.set_num_threads(resolved.preset.train.threads)
        self.model = self.trainer.model
        self.model.train()
        # what Trainer.train() does when train.activation_checkpointing is on (grpo_config passes it to TRL): every
        # decoder layer is recomputed in backward. "off": no recomputation.
        args = self.trainer.args
        if checkpointing == "on" and args.activation_checkpointing:
            self.model.activation_checkpointing_enable(
                activation_checkpointing_kwargs=dict(args.activation_checkpointing_kwargs or {}) or None)
        self.checkpointing = checkpointing == "on" and bool(args.activation_checkpointing)
        self.padding_free(padding_free)

    def padding_free(self, mode: str) -> None:
        if mode not in PACKING_MODES:
            raise ValueError(f"--padding-free: {mode!r} is not one of {PACKING_MODES}")
        self.trainer.preset.train.padding_free = mode != "off"
        self.trainer.preset.train.share_prompts = mode == "on"

    def inputs(self, batch: dict, variant: str, repeat: int, length: int) -> tuple:
        """The loss inputs (a ``StepBatch``) of ``batch`` under ``variant``'s hooks, and the share of the completion
        tokens they keep; another NAT cut in every ``repeat``."""
        from harness.train.trl.bench_probes import loss_inputs

        trainer = self.trainer
        trainer.actor.method = self.methods[variant]
        trainer.preset.train.max_completion_length = length
        ctx = dataclasses.replace(trainer.step_context(), step=repeat)  # another cut in every repeat
        inputs = loss_inputs(trainer, batch, ctx)
        # share of the completion tokens the loss sees (NAT's method/tokens_kept_frac: its cut drops no rollout)
        return inputs, float(inputs.completion_mask.sum()) / float(batch["completion_mask"].sum())

    def forward_backward(self, inputs_and_kept: tuple) -> dict:
        inputs, kept = inputs_and_kept
        ledger = self.trainer.accounting.step_ledger  # what the current step counted (closed at a real step's end)
        positions0, flops0 = ledger.trained_positions, ledger.flops["train"]
        self.model.zero_grad(set_to_none=True)
        with Timer() as timer:
            with SavedForBackward(self.model) as saved:
                loss = self.trainer.compute_loss(self.model, inputs)
            loss.backward()
        return {"wall_s": timer.wall, "cpu_s": timer.cpu, "saved_bytes": saved.nbytes,
                "trained_positions": ledger.trained_positions - positions0,
                "train_flops": ledger.flops["train"] - flops0, "loss": float(loss.detach()),
                "tokens_kept_frac": kept, "completion_width": int(inputs.completion_ids.shape[1])}


class SavedForBackward:
    """Bytes of the distinct non-parameter tensors autograd keeps for backward during the forward: the activation
    memory held when backward starts (exact and deterministic, unlike RSS; under activation checkpointing it counts
    what the checkpoints keep, not the one layer recomputed at a time in backward)."""

    def __init__(self, model):
        self.model = model
        self.storages: dict[int, int] = {}

    def __enter__(self):
        import torch

        params = {p.untyped_storage().data_ptr() for p in self.model.parameters()}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                self.storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def child(args) -> None:
    """Memory of one variant in this fresh process: warm-up, then ``--mem-repeats`` measured forward + backward."""
    import torch

    harness = Harness(args, args.chunk_rows_one, args.checkpointing_one, args.padding_free_one)
    batch = torch.load(batch_path(args.workdir, args.length, args.preset), weights_only=True)
    n_params = sum(p.numel() for p in harness.model.parameters())
    harness.forward_backward(harness.inputs(batch, args.variant, 10_000, args.length))  # warm-up, another cut
    harness.model.zero_grad(set_to_none=True)
    runs = []
    for repeat in range(args.mem_repeats):
        inputs = harness.inputs(batch, args.variant, repeat, args.length)
        baseline, maxrss0 = current_rss_bytes(), ru_maxrss_bytes()
        reset_ok = reset_peak_rss()
        result = harness.forward_backward(inputs)
        peak = hwm_bytes()
        harness.model.zero_grad(set_to_none=True)
        result.update(baseline_rss=baseline, peak_hwm=peak, hwm_reset=reset_ok,
                      peak_above_baseline=(peak - baseline) if reset_ok else None,
                      ru_maxrss_before=maxrss0, ru_maxrss_after=ru_maxrss_bytes(), grad_bytes=4 * n_params)
        runs.append(result)
    print(json.dumps({"variant": args.variant, "length": args.length, "chunk_rows": args.chunk_rows_one,
                      "checkpointing": harness.checkpointing, "padding_free": args.padding_free_one,
                      "runs": runs, "process_peak_ru_maxrss": ru_maxrss_bytes()}))


def memory_runs(length: int, chunk_rows: int, checkpointing: str, padding_free: str, variant: str, args) -> dict:
    cmd = [sys.executable, "-m", "bench.nat_savings", "--child", "--variant", variant, "--length", str(length),
           "--chunk-rows-one", str(chunk_rows), "--checkpointing-one", checkpointing, "--padding-free-one",
           padding_free, "--mem-repeats", str(args.mem_repeats),
           "--workdir", str(args.workdir), "--results", str(args.results), "--preset",
           args.preset, "--warmstart-steps", str(args.warmstart_steps), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    if done.returncode:
        raise RuntimeError(f"memory subprocess failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smol", choices=["smol", "tiny"], help="tiny: smoke checks only")
    parser.add_argument("--warmstart-steps", type=int, default=300, help="tiny preset only")
    parser.add_argument("--lengths", default="64,256", help="max completion lengths of the sampled batches")
    parser.add_argument("--chunk-rows", default="16,1", help="train.forward_chunk_rows values")
    parser.add_argument("--checkpointing", default="on",
                        help="activation checkpointing: on (as training runs today: TRL's default) and/or off")
    parser.add_argument("--padding-free", default="on,off",
                        help="on (packed, prompts shared: the defaults), unshared (packed, train.share_prompts "
                             "false) and/or off (padded), interleaved")
    parser.add_argument("--grid", default="",
                        help="explicit settings length:chunk_rows:checkpointing,... instead of the product")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (train.threads; 0: the preset's). 1 on a loaded machine: process CPU time "
                             "is then the compute, without the spin-waits of threads that do not get a core")
    parser.add_argument("--repeats", type=int, default=5, help="measured (uniform, NAT) pairs per setting")
    parser.add_argument("--mem-repeats", type=int, default=3, help="measured runs per memory subprocess")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--name", default="nat_savings")
    add_path_args(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunk-rows-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing-one", default="on", help=argparse.SUPPRESS)
    parser.add_argument("--padding-free-one", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return {}
    import torch

    lengths = [int(x) for x in args.lengths.split(",") if x]
    chunk_rows = [int(x) for x in args.chunk_rows.split(",") if x]
    resolved, _ = preset_sweep(args)
    for length in lengths:
        ensure_batch(args, length)
    env = environment(args.cpu_free_flag)
    started = time.perf_counter()
    settings = []
    if args.grid:
        grid = [(int(a), int(b), c) for a, b, c in (g.split(":") for g in args.grid.split(","))]
        lengths = sorted({g[0] for g in grid})
        for length in lengths:
            ensure_batch(args, length)
    else:
        grid = [(length, rows, ck) for ck in args.checkpointing.split(",") for rows in chunk_rows
                for length in lengths]
    for (rows, ck) in dict.fromkeys((g[1], g[2]) for g in grid):
        harness = Harness(args, rows, ck)
        for length in [g[0] for g in grid if (g[1], g[2]) == (rows, ck)]:
            batch = torch.load(batch_path(args.workdir, length, args.preset), weights_only=True)
            modes = [m for m in args.padding_free.split(",") if m]
            combos = [(variant, mode) for mode in modes for variant in ("uniform", "nat")]
            timing = {combo: [] for combo in combos}
            for repeat in range(args.repeats + 1):  # repeat 0: warm-up round
                for variant, mode in (combos if repeat % 2 == 0 else combos[::-1]):
                    harness.padding_free(mode)
                    result = harness.forward_backward(harness.inputs(batch, variant, repeat, length))
                    result["repeat"] = repeat
                    timing[variant, mode].append(result)
            print(f"[bench] timing L={length} chunk_rows={rows} checkpointing={ck} done "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
            for mode in modes:
                settings.append({"length": length, "chunk_rows": rows, "checkpointing": harness.checkpointing,
                                 "checkpointing_arg": ck, "padding_free": mode,
                                 "timing": {v: timing[v, mode] for v in ("uniform", "nat")},
                                 "padded_uniform": timing["uniform", "off"] if mode != "off" and "off" in modes
                                 else None,
                                 "unshared_uniform": timing["uniform", "unshared"]
                                 if mode == "on" and "unshared" in modes else None,
                                 "batch": {"rows": int(batch["completion_ids"].shape[0]),
                                           "prompt_tokens_per_row": batch["prompt_tokens"] / batch["rows"],
                                           "mean_completion_length": batch["generated_tokens"] / batch["rows"],
                                           "max_completion_length": length,
                                           "completion_lengths": batch["completion_mask"].sum(dim=1).tolist()}})
        del harness
    if not args.skip_memory:
        for setting in settings:
            setting["memory"] = {}
            for variant in ("uniform", "nat"):
                setting["memory"][variant] = memory_runs(setting["length"], setting["chunk_rows"],
                                                         setting["checkpointing_arg"], setting["padding_free"],
                                                         variant, args)
                print(f"[bench] memory L={setting['length']} chunk_rows={setting['chunk_rows']} {variant} done "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    record = analyse(settings, args, resolved, env, time.perf_counter() - started)
    write_result(args.results, args.name, record)
    update_summary(args.results, args.name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def analyse(settings: list[dict], args, resolved, env: dict, elapsed: float) -> dict:
    for s in settings:
        u = [r for r in s["timing"]["uniform"] if r["repeat"] > 0]
        n = [r for r in s["timing"]["nat"] if r["repeat"] > 0]
        ratio = paired_ratio([r["wall_s"] for r in n], [r["wall_s"] for r in u])
        s["time"] = {"uniform_s": describe([r["wall_s"] for r in u]), "nat_s": describe([r["wall_s"] for r in n]),
                     "ratio_wall": ratio,
                     "ratio_cpu": paired_ratio([r["cpu_s"] for r in n], [r["cpu_s"] for r in u]),
                     "saved": 1 - ratio["median"],
                     "positions_ratio": statistics.mean(r["trained_positions"] for r in n)
                     / statistics.mean(r["trained_positions"] for r in u),
                     "flops_ratio": statistics.mean(r["train_flops"] for r in n)
                     / statistics.mean(r["train_flops"] for r in u),
                     "tokens_kept_frac": statistics.mean(r["tokens_kept_frac"] for r in n),
                     "saved_mb": {"uniform": statistics.median(r["saved_bytes"] for r in u) / MB,
                                  "nat": statistics.median(r["saved_bytes"] for r in n) / MB},
                     "saved_activation_ratio": paired_ratio([r["saved_bytes"] for r in n],
                                                            [r["saved_bytes"] for r in u])}
        if s.get("padded_uniform"):  # packed uniform over padded uniform of the same rounds
            padded = [r for r in s["padded_uniform"] if r["repeat"] > 0]
            s["time"]["uniform_vs_padded"] = paired_ratio([r["wall_s"] for r in u], [r["wall_s"] for r in padded])
            s["time"]["uniform_vs_padded_cpu"] = paired_ratio([r["cpu_s"] for r in u], [r["cpu_s"] for r in padded])
        if s.get("unshared_uniform"):  # shared-prompt uniform over unshared uniform of the same rounds
            unshared = [r for r in s["unshared_uniform"] if r["repeat"] > 0]
            s["time"]["uniform_vs_unshared_cpu"] = paired_ratio([r["cpu_s"] for r in u],
                                                                [r["cpu_s"] for r in unshared])
        s["time"]["met"] = s["time"]["saved"] >= TIME_TARGET
        if "memory" in s:
            mem = {}
            for variant in ("uniform", "nat"):
                runs = s["memory"][variant]["runs"]
                working = [r["peak_above_baseline"] for r in runs if r["peak_above_baseline"] is not None]
                grads = runs[0]["grad_bytes"]
                mem[variant] = {"working_mb": statistics.median(working) / MB if working else None,
                                "activation_mb": (statistics.median(working) - grads) / MB if working else None,
                                "process_peak_mb": statistics.median(r["peak_hwm"] for r in runs) / MB,
                                "baseline_mb": statistics.median(r["baseline_rss"] for r in runs) / MB,
                                "grad_mb": grads / MB, "working_mb_all": [w / MB for w in working]}
            u_mem, n_mem = mem["uniform"], mem["nat"]
            mem["saved_working"] = 1 - n_mem["working_mb"] / u_mem["working_mb"]
            mem["saved_activation"] = 1 - n_mem["activation_mb"] / u_mem["activation_mb"]
            mem["saved_process"] = 1 - n_mem["process_peak_mb"] / u_mem["process_peak_mb"]
            mem["met"] = mem["saved_working"] >= MEMORY_TARGET
            s["memory_summary"] = mem
    train = resolved.preset.train
    return {"benchmark": "nat_savings", "preset": resolved.preset.name,
            "settings": {"lengths": sorted({r["length"] for r in settings}), "chunk_rows": args.chunk_rows,
                         "grid": args.grid, "checkpointing": args.checkpointing, "padding_free": args.padding_free,
                         "repeats": args.repeats, "mem_repeats": args.mem_repeats, "threads": train.threads,
                         "stats_chunk_size": train.stats_chunk_size, "prompts_per_step": train.prompts_per_step,
                         "num_generations": train.num_generations,
                         "memory_measure": "VmHWM after a clear_refs reset minus VmRSS before the forward + backward, "
                                           "one subprocess per variant (ru_maxrss recorded too)"},
            "targets": {"time_saved": TIME_TARGET, "memory_saved": MEMORY_TARGET, "paper": {"time": 0.29,
                                                                                             "memory": 0.18}},
            "environment": env, "elapsed_s": elapsed, "results": settings}


def summary_markdown(record: dict) -> str:
    s = record["settings"]
    lines = [f"## NAT-RPC savings ({record['preset']} preset, training forward + backward)", "",
             f"{record['environment']['date']}; {s['prompts_per_step']} x {s['num_generations']} "
             f"rollouts, {s['threads']} threads, {s['repeats']} measured rounds per setting (uniform and NAT, packed "
             f"and padded, interleaved, cut redrawn per round), memory: {s['mem_repeats']} runs per subprocess; "
             f"machine "
             f"{machine_state(record['environment'])}.", ""]
    rows = []
    for r in record["results"]:
        t, b = r["time"], r["batch"]
        m = r.get("memory_summary")
        rows.append([
            f"{r['length']} ({b['mean_completion_length']:.0f} / prompt {b['prompt_tokens_per_row']:.0f})",
            r["chunk_rows"], "on" if r["checkpointing"] else "off", r.get("padding_free", "off"),
            f"{t['tokens_kept_frac']:.2f}", f"{t['positions_ratio']:.2f}",
            f"{t['uniform_s']['median']:.2f}",
            fmt_ratio(t["uniform_vs_padded"]) if "uniform_vs_padded" in t else "",
            fmt_ratio(t["uniform_vs_padded_cpu"]) if "uniform_vs_padded_cpu" in t else "",
            fmt_ratio(t["uniform_vs_unshared_cpu"]) if "uniform_vs_unshared_cpu" in t else "",
            fmt_ratio(t["ratio_wall"]),
            fmt_ratio(t["ratio_cpu"]), f"{100 * t['saved']:.0f}%",
            verdict(t["met"]),
            f"{t['saved_mb']['uniform']:.0f} / {t['saved_mb']['nat']:.0f} "
            f"({100 * (1 - t['saved_activation_ratio']['median']):.0f}% less)",
            f"{m['uniform']['working_mb']:.0f} / {m['nat']['working_mb']:.0f}" if m else "",
            f"{100 * m['saved_working']:.0f}% (act. {100 * m['saved_activation']:.0f}%, process "
            f"{100 * m['saved_process']:.0f}%)" if m else "", verdict(m["met"]) if m else "n/a"])
    lines.append(table(["max len (mean completion / prompt)", "chunk rows", "act. ckpt", "padding-free",
                        "tokens kept", "positions kept", "uniform fwd+bwd s", "uniform / padded",
                        "uniform / padded (CPU)", "uniform / unshared (CPU)", "time NAT/uniform", "NAT/uniform (CPU)",
                        "time saved",
                        f">= {100 * TIME_TARGET:.0f}%",
                        "kept for backward MB U / N", "working MB U / N", "memory saved",
                        f">= {100 * MEMORY_TARGET:.0f}%"], rows))
    lines += ["", "Padding-free on: each forward chunk's real tokens packed into one sequence, a prompt shared by "
              "several rollouts once (the defaults, `train.padding_free`, `train.share_prompts`); unshared: packed, "
              "every rollout with its own copy of its prompt; off: the chunk padded to its longest kept row. "
              "Uniform / padded (/ unshared): uniform of this row over padded (unshared) uniform, same rounds. "
              "Positions kept: NAT's trained positions over uniform's (the ledger "
              "counts what is computed).", "",
              "Kept for backward = bytes of the distinct non-parameter tensors autograd holds when the forward "
              "ends (exact; median over the timed pairs). Working memory = peak RSS above the pre-step RSS during "
              "one forward + backward in a fresh subprocess, parameter gradients included (act. = without them; "
              "process = whole-process peak); the memory target is judged on it."]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
