"""A default-sweep train job and eval job, each in a process of its own and forked from a fork server.

What the fork servers (harness/forkserver.py) change per job: the job's wall time from command start to exit, and
whether the work itself (the run's ``train_seconds``; an eval's generate and elapsed seconds) is slower in a forked
child (copy-on-write of the server's pages, allocator state). Rounds alternate the order of the two variants; each
job is the command Snakemake would start (`harness train --method uniform --seed 0`, `harness eval` of the warm
start), with the environment Snakemake gives a 1-thread job. The servers start once, before the first round, as in a
sweep. Also checked: the forked and the plain run log the same losses and rewards, and the evals write the same
samples.

Usage:  python bench/forkserver_jobs.py [--rounds 4] [--workdir results/bench-work] [--results results/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from _common import add_path_args, environment, fmt_ratio, paired_ratio, publish, table

from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import resolve
from harness.forkserver import ENV_VAR, ForkServers, job_environment

HARNESS = str(Path(sys.executable).parent / "harness")
VARIANTS = ("plain", "forked")
TIMING_KEY = re.compile(r"seconds|time|_s$")  # metrics that measure time, not the run


def sweep_file(workdir: Path) -> Path:
    """The default sweep (configs/sweeps/default.yaml) with its results under ``workdir``."""
    config = yaml.safe_load((CONFIG_DIR / "sweeps" / "default.yaml").read_text())
    config.update(name="forkserver", methods=["uniform"], seeds=[0], results_dir=str(workdir))
    path = workdir / "forkserver.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def job_env(threads: int, server: str) -> dict:
    """What Snakemake's shell gives a job of ``threads`` threads, with the fork server named."""
    return {**job_environment(threads), ENV_VAR: server}


def run_job(argv: list[str], env: dict, log: Path) -> float:
    started = time.perf_counter()
    with open(log, "w") as handle:
        status = subprocess.run([HARNESS, *argv], env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if status:
        raise SystemExit(f"harness {' '.join(argv)} exited {status}: see {log}")
    return seconds


def run_facts(paths: SweepPaths) -> tuple[float, list[dict]]:
    run = paths.run_dir("uniform", 0)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    untimed = [{k: v for k, v in m.items() if not TIMING_KEY.search(k)} for m in metrics]
    return json.loads((run / "run.json").read_text())["train_seconds"], untimed


def eval_facts(out: Path) -> tuple[float, float, dict]:
    results = [json.loads(p.read_text()) for p in sorted(out.rglob("results.json"))]
    samples = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("samples.jsonl"))}
    return (sum(r["generate_s"] for r in results), sum(r["elapsed_s"] for r in results),
            samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    add_path_args(parser)
    args = parser.parse_args()
    workdir = args.workdir / "forkserver"
    sweep = sweep_file(workdir)
    resolved = resolve(str(sweep))
    paths = SweepPaths(resolved.results_dir)
    for command in ("data", "warmstart"):
        if not (paths.warmstart_dir / "warmstart.json").is_file():
            subprocess.run([HARNESS, command, "--sweep", str(sweep)], check=True,
                           env={**os.environ, ENV_VAR: "off"})
    preset = resolved.preset
    servers = ForkServers(preset.model.kind, preset.eval.backend, workdir / "logs")
    servers.start({"train": preset.train.threads, "eval": preset.eval.threads})
    folder = os.environ[ENV_VAR]
    while not all(Path(folder, f"{c}.sock").exists() for c in ("train", "eval")):
        time.sleep(0.2)
    measured = {v: {"train_job_s": [], "train_seconds": [], "eval_job_s": [], "eval_generate_s": [],
                    "eval_elapsed_s": []} for v in VARIANTS}
    facts = {}
    try:
        for round_ in range(args.rounds):
            for variant in (VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]):
                server = folder if variant == "forked" else "off"
                shutil.rmtree(paths.run_dir("uniform", 0), ignore_errors=True)
                log = workdir / f"train_{variant}.log"
                measured[variant]["train_job_s"].append(run_job(
                    ["train", "--sweep", str(sweep), "--method", "uniform", "--seed", "0"],
                    job_env(preset.train.threads, server), log))
                if variant == "forked" and "forked:" not in log.read_text():
                    raise SystemExit(f"the forked train job ran in its own process: see {log}")
                train_seconds, metrics = run_facts(paths)
                measured[variant]["train_seconds"].append(train_seconds)
                out = workdir / f"eval_{variant}"
                shutil.rmtree(out, ignore_errors=True)
                measured[variant]["eval_job_s"].append(run_job(
                    ["eval", "--sweep", str(sweep), "--label", "warmstart", "--seed", "0", "--ckpt", "ckpt-000",
                     "--out", str(out)], job_env(preset.eval.threads, server), workdir / f"eval_{variant}.log"))
                generate_s, elapsed_s, samples = eval_facts(out)
                measured[variant]["eval_generate_s"].append(generate_s)
                measured[variant]["eval_elapsed_s"].append(elapsed_s)
                facts[variant] = (metrics, samples)
                print(f"[bench] round {round_} {variant}: " + ", ".join(
                    f"{k} {v[-1]:.2f}" for k, v in measured[variant].items()), flush=True)
    finally:
        servers.stop()
    ratios = {k: paired_ratio(measured["forked"][k], measured["plain"][k]) for k in measured["plain"]}
    record = {"benchmark": "forkserver_jobs", "settings": {"rounds": args.rounds, "sweep": str(sweep)},
              "environment": environment(args.cpu_free_flag), "measured": measured, "ratios": ratios,
              "same_losses_and_rewards": facts["forked"][0] == facts["plain"][0],
              "same_eval_samples": facts["forked"][1] == facts["plain"][1]}
    publish(args.results, "forkserver_jobs", record, summary_markdown(record))


def summary_markdown(record: dict) -> str:
    env = record["environment"]
    medians = {v: {k: statistics.median(xs) for k, xs in record["measured"][v].items()} for v in VARIANTS}
    rows = [[key, f"{medians['plain'][key]:.2f}", f"{medians['forked'][key]:.2f}", fmt_ratio(r)]
            for key, r in record["ratios"].items()]
    return "\n".join([
        "## Fork server: a default-sweep job forked vs in its own process", "",
        f"{env['date']}; {record['settings']['rounds']} rounds, order alternating; load average "
        f"{env['load_average'][0]:.1f} on {env['hardware']['cpu_count']} CPUs at the start. train_job_s / "
        "eval_job_s: the command's wall seconds from start to exit; train_seconds: the run's own training time; "
        "eval_generate_s / eval_elapsed_s: lm-eval's generation and whole evaluation inside the job.", "",
        table(["seconds", "plain (median)", "forked (median)", "forked / plain"], rows), "",
        f"Same losses and rewards (every metric that is not a time): {record['same_losses_and_rewards']}; "
        f"same eval samples, byte for byte: {record['same_eval_samples']}."])


if __name__ == "__main__":
    main()
