"""A small synthetic sweep on disk, in the shape the trainer and evaluator write, for the report tests.

Correctness is drawn from a known model: P(correct) = sigmoid(base + difficulty_problem + seed_effect +
fraction * effect_label), so the tests know which method is better and which labels are an A/A pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.config.loading import dump_yaml
from harness.config.paths import SweepPaths, checkpoint_name
from harness.config.schema import (
    BenchmarkConfig,
    BudgetConfig,
    EvalConfig,
    PresetConfig,
    Resolved,
    SweepConfig,
    TrainConfig,
)

LABELS = {"uniform": ("uniform", 0, 0.3), "uniform-aa": ("uniform", 100, 0.3), "entropy": ("entropy", 0, 2.5)}
BENCHES = {"arith": 40, "arith_ood": 30}


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _samples(rng, bench: str, probs: np.ndarray, k: int) -> list[dict]:
    rows = []
    for j, p in enumerate(probs):
        pid = f"{bench}-{j:04d}"
        for s in range(k):
            correct = bool(rng.random() < p)
            rows.append({"id": pid, "sample": s, "mode": "sampled", "gold": "1", "completion": "A: 1",
                         "extracted": "1" if correct else "2", "correct": correct, "format_ok": True,
                         "gradable": True, "timed_out": False, "response_tokens": int(rng.integers(5, 30))})
        correct = bool(p > 0.5)
        rows.append({"id": pid, "sample": 0, "mode": "greedy", "gold": "1", "completion": "A: 1",
                     "extracted": "1", "correct": correct, "format_ok": True, "gradable": True,
                     "timed_out": False, "response_tokens": 12})
    return rows


def _results(bench: str, rows: list[dict], k: int) -> dict:
    sampled = [r for r in rows if r["mode"] == "sampled"]
    by_problem: dict[str, list[bool]] = {}
    for r in sampled:
        by_problem.setdefault(r["id"], []).append(r["correct"])
    avg = float(np.mean([np.mean(v) for v in by_problem.values()]))
    greedy = [r["correct"] for r in rows if r["mode"] == "greedy"]
    return {"bench": bench, "n_problems": len(by_problem), "k": k, "temperature": 1.0, "top_p": 1.0,
            "max_gen_toks": 48, "greedy": True, "backend": "hf", "device": "cpu", "seed": 1234, "scorer": "numeric",
            "prompt_template": "tiny", "scoring_timeout_s": 5.0,
            "metrics": {f"avg@{k}": avg, f"pass@{k}": float(np.mean([any(v) for v in by_problem.values()])),
                        f"maj@{k}": avg, "greedy_accuracy": float(np.mean(greedy)), "mean_response_tokens": 15.0,
                        "format_ok_rate": 1.0, "ungradable": 0},
            "data_file": f"/fixture/{bench}.jsonl", "data_sha256": "ab" * 32, "samples_file": "samples.jsonl",
            "versions": {"lm_eval": "0.4.13"}}


def sample_batch(rng) -> dict:
    """Two groups of four rollouts, six positions, in the ``harness inspect`` format plus token strings."""
    B, T = 8, 6
    mask = [[1] * (T - (i % 3)) + [0] * (i % 3) for i in range(B)]
    return {"completion_ids": rng.integers(2, 30, size=(B, T)).tolist(), "completion_mask": mask,
            "rewards": [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0], "group_ids": [0, 0, 0, 0, 1, 1, 1, 1],
            "logp": (-rng.random((B, T)) * 3).tolist(), "entropy": (rng.random((B, T)) * 3).tolist(),
            "sum_p2": rng.random((B, T)).tolist(), "progress": 0.0, "seed": 0, "special_token_ids": [0, 1],
            "prompts": ["Q: 1+2\n"] * 4 + ["Q: <b>3-1</b>\n"] * 4,
            "completion_tokens": [["1", "+", "2", "\n", "A", "<eos>"] for _ in range(B)]}


def build_sweep(tmp_path: Path, seeds=(0, 1, 2), fractions=(0.5, 1.0), k: int = 4, steps: int = 4,
                name: str = "fixture", rng_seed: int = 7) -> tuple[Resolved, SweepPaths]:
    root = tmp_path / "results" / name
    paths = SweepPaths(root)
    rng = np.random.default_rng(rng_seed)
    difficulty = {b: rng.normal(0.0, 1.5, n) for b, n in BENCHES.items()}
    config = {"sweep": {"name": name, "methods": list(LABELS), "seeds": list(seeds)}}

    def write_eval(label, seed, ckpt, logit_shift):
        for bench in BENCHES:
            probs = 1 / (1 + np.exp(-(-0.5 + difficulty[bench] + logit_shift)))
            rows = _samples(rng, bench, probs, k)
            folder = paths.eval_dir(label, seed, ckpt, bench)
            _write_jsonl(folder / "samples.jsonl", rows)
            _write_json(folder / "results.json", _results(bench, rows, k))

    write_eval("warmstart", 0, "ckpt-000", 0.0)
    checkpoints = {checkpoint_name(f): max(1, round(f * steps)) for f in fractions}
    for index, (label, (method, offset, effect)) in enumerate(LABELS.items()):
        for seed in seeds:
            seed_effect = rng.normal(0.0, 0.1)
            for ckpt, fraction in zip(checkpoints, fractions, strict=True):
                write_eval(label, seed, ckpt, seed_effect + fraction * effect)
            run_dir = paths.run_dir(label, seed)
            params = {"rho": 0.2, "semantics": "verl", "denominator": "auto"} if method == "entropy" else {}
            _write_json(run_dir / "run.json", {
                "sweep": name, "method": {"label": label, "name": method, "params": params,
                                          "deviations": ["ranking scope is the update batch"] if params else []},
                "seed": seed, "run_seed": seed + offset, "config": config, "config_yaml": dump_yaml(config),
                "budget": {"kind": "steps", "amount": float(steps), "spent_steps": steps, "checkpoints": checkpoints,
                           "spent_flops": 1.5e12},  # an extra key the report must tolerate
                "counters": {"generated_tokens": 1000 * steps, "forwarded_tokens": 1500 * steps,
                             "weighted_tokens": 200 * steps, "rollouts_generated": 16 * steps},
                "train_seconds": 1.25,
                "provenance": {"versions": {"torch": "2.13.0+cpu", "trl": "1.16.0", "python": "3.11.7"},
                               "git": {"commit": "0" * 40, "dirty": False},
                               "hardware": {"platform": "fixture", "cpu_count": 2, "cuda": False},
                               "data_sha256": {"train": "cd" * 32}}})
            _write_jsonl(run_dir / "metrics.jsonl", [
                {"step": s, "reward": 0.2 + 0.1 * s * (1 + index), "entropy": 2.0 - 0.1 * s,
                 "completions/mean_length": 20.0 + s, "tokens/generated_total": (1000 - 10 * index) * s,
                 "tokens/forwarded_total": 1500 * s, "loss": float("nan") if s == 1 else 0.1}
                for s in range(1, steps + 1)])
            if index == 0 and seed == seeds[0]:
                _write_json(run_dir / "sample_batch.json", sample_batch(rng))
    preset = PresetConfig(name="tiny", train=TrainConfig(budget=BudgetConfig(amount=float(steps),
                                                                             checkpoint_fractions=list(fractions))),
                          eval=EvalConfig(k=k, benchmarks={b: BenchmarkConfig(file=f"{b}.jsonl", scorer="numeric")
                                                           for b in BENCHES}))
    sweep = SweepConfig(name=name, preset="tiny", methods=list(LABELS), seeds=list(seeds),
                        results_dir=str(tmp_path / "results"))
    return Resolved(sweep, preset, source="tests/report_fixture.py"), paths
