"""A tiny sweep end to end through Snakemake: the leaderboard equals what the per-sample files give, a complete
sweep has nothing left to do, and a new method label triggers only its own jobs and the report."""

import csv
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

CI_SWEEP = {
    "name": "ci",
    "preset": "tiny",
    "methods": ["uniform"],
    "seeds": [0],
    "data": {"synthetic": {"n_train": 1000, "n_eval": 12, "n_ood": 8}},
    "warmstart": {"steps": 15, "batch_size": 16},
    "train": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 40,
              # 2 generation batches of the preset's 2 mini-batch steps each
              "budget": {"kind": "steps", "amount": 4, "checkpoint_fractions": [0.5, 1.0]}},
    "eval": {"k": 2, "max_gen_toks": 40},
}


def snakemake(workdir: Path, sweep_file: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(sweep_file), "--cores", "2", *extra],
                          capture_output=True, text=True, env=env, timeout=1200)


def job_counts(dry_run_output: str) -> dict[str, int]:
    table = dry_run_output.split("Job stats:")[1] if "Job stats:" in dry_run_output else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.M)}


@pytest.fixture(scope="module")
def completed_sweep(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep")
    sweep_file = workdir / "ci.yaml"
    sweep_file.write_text(yaml.safe_dump({**CI_SWEEP, "results_dir": str(workdir / "results")}))
    run = snakemake(workdir, sweep_file)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return workdir, sweep_file, workdir / "results" / "ci"


def test_leaderboard_equals_the_per_sample_files(completed_sweep):
    _, _, root = completed_sweep
    rows = list(csv.DictReader((root / "leaderboard_runs.csv").open()))
    assert {(r["method"], r["ckpt"]) for r in rows} == {("warmstart", "ckpt-000"), ("uniform", "ckpt-050"),
                                                         ("uniform", "ckpt-100")}
    for row in rows:
        samples = [json.loads(line) for line in (root / row["results_file"]).with_name("samples.jsonl").open()]
        sampled = [s for s in samples if s["mode"] == "sampled"]
        by_problem: dict[str, list[bool]] = {}
        for s in sampled:
            by_problem.setdefault(s["id"], []).append(bool(s["correct"]))
        assert all(len(v) == 2 for v in by_problem.values())  # k = 2 samples per problem
        expected_avg = statistics.fmean(statistics.fmean(v) for v in by_problem.values())
        assert float(row["avg@k"]) == pytest.approx(expected_avg)
        greedy = [s for s in samples if s["mode"] == "greedy"]
        assert float(row["greedy_accuracy"]) == pytest.approx(statistics.fmean(bool(s["correct"]) for s in greedy))
        assert int(row["n_problems"]) == len(by_problem)


def test_runs_record_config_provenance_and_budget(completed_sweep):
    _, _, root = completed_sweep
    run = json.loads((root / "runs" / "uniform" / "seed0" / "run.json").read_text())
    assert run["budget"]["spent_steps"] == 4 and run["budget"]["checkpoints"] == {"ckpt-050": 2, "ckpt-100": 4}
    assert run["config"]["preset"]["train"]["budget"]["amount"] == 4
    assert set(run["provenance"]) >= {"versions", "git", "hardware", "data_sha256"}
    assert run["provenance"]["versions"]["trl"] == "1.16.0"
    metrics = [json.loads(line) for line in (root / "runs" / "uniform" / "seed0" / "metrics.jsonl").open()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    old = [m["flops/old_logp_total"] for m in metrics]  # the preset's mini-batches: one old-policy pass per batch
    assert old[0] > 0 and old[1] == old[0] and old[2] > old[1] and old[3] == old[2]
    assert {"reward", "reward_std", "entropy", "completions/mean_length", "clip_ratio/region_mean",
            "tokens/generated_total", "budget/flops_total", "seconds/train_total", "step_time"} <= set(metrics[0])
    for ckpt in ("ckpt-050", "ckpt-100"):
        assert (root / "runs" / "uniform" / "seed0" / ckpt / "model.safetensors").is_file()


def test_an_eval_run_again_writes_the_same_samples(completed_sweep, tmp_path):
    _, _, root = completed_sweep
    # the last checkpoint's eval again, outside Snakemake: the same samples, byte for byte
    own = subprocess.run([sys.executable, "-m", "harness.cli", "eval", "--sweep", str(root / "sweep.yaml"),
                          "--label", "uniform", "--seed", "0", "--ckpt", "ckpt-100", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert own.returncode == 0, own.stderr[-2000:]
    for bench in ("arith", "arith_ood"):
        swept = root / "eval" / "uniform" / "seed0" / "ckpt-100" / bench / "samples.jsonl"
        assert (tmp_path / bench / "samples.jsonl").read_bytes() == swept.read_bytes()


def test_complete_sweep_has_nothing_to_do_and_a_new_method_runs_only_its_jobs(completed_sweep):
    workdir, sweep_file, _ = completed_sweep
    again = snakemake(workdir, sweep_file, "-n")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Nothing to be done" in again.stdout + again.stderr
    # train/eval.fast_decode change no result (tests/test_decode.py): switching them reruns nothing
    plain = snakemake(workdir, sweep_file, "-n", "--config", "set=train.fast_decode=false eval.fast_decode=false")
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "Nothing to be done" in plain.stdout + plain.stderr
    added = snakemake(workdir, sweep_file, "-n", "--config", "methods=[uniform,entropy]")
    assert added.returncode == 0, added.stderr[-2000:]
    counts = job_counts(added.stdout + added.stderr)
    # entropy: 1 train, 1 eval job (its two checkpoints, every benchmark: eval.job_scope=run in the tiny preset);
    # then the report (and the `all` target)
    assert counts == {"train": 1, "eval": 1, "report": 1, "all": 1, "total": 4}
    assert "entropy" in added.stdout and "uniform/seed0/run.json" not in added.stdout.split("rule report")[0]


def test_bad_config_stops_snakemake_before_any_job(tmp_path):
    sweep_file = tmp_path / "bad.yaml"
    sweep_file.write_text(yaml.safe_dump({**CI_SWEEP, "results_dir": str(tmp_path),
                                          "train": {"clip_eps_high": -1}}))
    run = snakemake(tmp_path, sweep_file, "-n")
    assert run.returncode != 0
    assert "train.clip_eps_high" in run.stdout + run.stderr


def test_no_output_of_the_default_sweep_is_tracked_by_git():
    # a committed output makes snakemake on a fresh clone find its targets present and run nothing
    from harness.config.loading import resolve

    results = resolve(REPO / "configs" / "sweeps" / "default.yaml").results_dir
    tracked = subprocess.run(["git", "ls-files", str(results)], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode:
        pytest.skip("not a git checkout")
    assert tracked.stdout == ""
