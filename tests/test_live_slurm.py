"""A reduced tiny sweep through a real Slurm cluster (`snakemake --profile profiles/slurm`), against the same sweep
run locally with `--cores 2`. The local sweep starts once the Slurm sweep's warm start is done, from a copy of its data
and warm-start folders (computed once: both sweeps' data and warm start were the same files in every earlier run, and
the pair cost ~90 s of CI's hour); from there both run at once.

On the Slurm side two training jobs are interrupted on purpose, once each, and the profile's retry resubmits them:
- uniform: cancelled with `scancel` after its first trainer checkpoint;
- entropy: made to hit its time limit: after its first trainer checkpoint its limit is lowered to 1 minute
  (`scontrol update`, Slurm's smallest unit), so that it reaches the limit without spending CPU on a longer run;
  Slurm then kills it (state TIMEOUT).
Each training process is frozen (SIGSTOP) the moment its first checkpoint is seen, before Slurm acts on the job, so
that the interruption falls mid-run however fast the machine is.
Both resubmissions resume from the trainer checkpoint (run.json `resumed_from`), and the sweep must come out
exactly as the local one: leaderboard, every generation, the training metrics and the final weights (CPU
determinism; only wall/CPU seconds and peak memory differ).

Beside the sweep, the Slurm requests are checked with `sbatch --test-only` (nothing runs): a GPU rule's flags as the
executor plugin builds them (--nodes=1, CPUs, memory, time limit; the GPU flags themselves only as text, as this
node has no GPU) and scripts/submit-orchestrator.sh's job.

Needs a cluster that answers `sinfo` (`sudo scripts/local-slurm.sh start` makes one on this machine; .ci/run does)
and the `cluster` extra; skipped otherwise. Jobs run with a PATH that does not hold the venv, as a user's login
shell would: the Snakefile makes jobs find `harness` next to Snakemake's interpreter. The cluster has no
accounting database, so the executor plugin polls with squeue (`--slurm-status-command squeue`).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def _cluster_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not _cluster_answers(), reason="no Slurm cluster answers `sinfo` (start one on this machine: "
                       "sudo scripts/local-slurm.sh start)"),
    pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
                       reason="the SLURM executor plugin (the `cluster` extra) is not installed"),
]

STEPS = 60
# 2 methods x 1 seed; 150 warm-start steps on 3-term sums so that rewards vary and RL changes the weights
SWEEP = {
    "name": "live",
    "preset": "tiny",
    "methods": ["uniform", "entropy"],
    "seeds": [0],
    "data": {"synthetic": {"terms": 3, "n_train": 1000, "n_eval": 12, "n_ood": 8}},
    "warmstart": {"steps": 150, "batch_size": 16},
    # one optimizer step per generation batch (the tiny preset takes 2): a trainer checkpoint after every step, so
    # the interrupted jobs below resume from the last one; resume with mini-batches is tested in tests/test_budget.py
    "train": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 32, "mini_batches": 1,
              "save_every_steps": 1, "budget": {"kind": "steps", "amount": STEPS, "checkpoint_fractions": [1.0]}},
    # one eval job per checkpoint, as on a GPU cluster (the tiny preset's own job_scope=run has one per run and the
    # warm start's in rule eval_warmstart); the job list below counts on it
    "eval": {"k": 2, "max_gen_toks": 32, "job_scope": "checkpoint"},
}
WARMSTART_DONE = re.compile(r"Finished jobid: \d+ \(Rule: warmstart\)")  # in the Slurm sweep's Snakemake log
# values that measure time or memory, not the computation
VOLATILE = re.compile(r"seconds|time|memory|step_time|_s$")
TIMEOUT_S = 1500


def _write_sweep(workdir: Path) -> Path:
    sweep_file = workdir / "live.yaml"
    sweep_file.write_text(yaml.safe_dump({**SWEEP, "results_dir": str(workdir / "results")}))
    return sweep_file


def _squeue() -> dict[str, dict[str, str]]:
    """Every job the controller still knows: id -> comment (rule and wildcards), state, time limit, memory, CPUs."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%k|%T|%l|%m|%C"], capture_output=True,
                         text=True, timeout=30).stdout
    jobs = {}
    for line in out.splitlines():
        job_id, comment, state, limit, mem, cpus = line.strip().split("|")
        jobs[job_id] = {"comment": comment, "state": state, "limit": limit, "mem": mem, "cpus": cpus}
    return jobs


def _train_checkpoint_done(root: Path, label: str, ledger_file: str) -> bool:
    return any((root / "runs" / label / "seed0" / "trl").glob(f"checkpoint-*/{ledger_file}"))


def _job_pids(job_id: str) -> list[int]:
    out = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, timeout=30).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]


def _freeze_training(job_id: str) -> list[int]:
    frozen = []
    for pid in _job_pids(job_id):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmdline and any(part.endswith(b"harness") or part == b"harness.cli" for part in cmdline):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
    return frozen


def _minutes(limit: str) -> int:
    """squeue's %l (``[D-]HH:MM:SS`` or ``MM:SS``) in minutes."""
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 1440 + parts[0] * 60 + parts[1] + (parts[2] > 0)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    # imported before the runs start: importing it (torch, TRL) inside the watch loop held the loop for ~10 s on a
    # busy machine, and a training run went 52 of 60 steps before it was seen
    from harness.train.budget import LEDGER_FILE

    local_dir, slurm_dir = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.monotonic()
    local = None  # started from the Slurm sweep's data and warm start (module docstring)
    local_sweep = _write_sweep(local_dir)
    # a login shell's PATH, without the venv: jobs inherit it
    bare_env = {**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"}
    slurm_log = slurm_dir / "snakemake.out"
    slurm = subprocess.Popen([*SNAKEMAKE, "--directory", str(slurm_dir), "--configfile", str(_write_sweep(slurm_dir)),
                              "--profile", str(REPO / "profiles" / "slurm"), "--slurm-status-command", "squeue",
                              "--slurm-init-seconds-before-status-checks", "5", "--slurm-keep-successful-logs"],
                             stdout=slurm_log.open("w"), stderr=subprocess.STDOUT, env=bare_env, cwd=slurm_dir)
    root = slurm_dir / "results" / "live"
    seen: dict[str, dict[str, str]] = {}  # job id -> first squeue record (the limit as submitted)
    states: dict[str, set[str]] = {}
    interrupted: dict[str, str] = {}  # label -> Slurm job id of the interrupted attempt
    try:
        while slurm.poll() is None:
            if time.monotonic() - started > TIMEOUT_S:
                raise AssertionError(f"the Slurm sweep did not finish in {TIMEOUT_S} s:\n"
                                     + slurm_log.read_text()[-4000:])
            if local is None and WARMSTART_DONE.search(slurm_log.read_text()):
                for folder in ("data", "warmstart"):  # copy2: the times too, so the local DAG finds them complete
                    shutil.copytree(root / folder, local_dir / "results" / "live" / folder)
                local = subprocess.Popen([*SNAKEMAKE, "--directory", str(local_dir), "--configfile", str(local_sweep),
                                          "--cores", "2"], stdout=(local_dir / "snakemake.out").open("w"),
                                         stderr=subprocess.STDOUT, env=env)
            for job_id, job in _squeue().items():
                seen.setdefault(job_id, job)
                states.setdefault(job_id, set()).add(job["state"])
                if job["state"] != "RUNNING" or not job["comment"].startswith("rule_train_wildcards_"):
                    continue
                label = job["comment"].removeprefix("rule_train_wildcards_").rsplit("_", 1)[0]
                if label in interrupted or not _train_checkpoint_done(root, label, LEDGER_FILE):
                    continue
                # frozen first, so that the run cannot finish while Slurm acts on the job
                assert _freeze_training(job_id), f"no harness train process in Slurm job {job_id}"
                interrupted[label] = job_id
                if label == "uniform":
                    subprocess.run(["scancel", job_id], check=True, timeout=30)
                else:
                    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=1"], check=True, timeout=30)
            time.sleep(1)
        slurm_seconds = time.monotonic() - started
        assert local is not None, "the Slurm sweep finished without a warm start:\n" + slurm_log.read_text()[-4000:]
        local.wait(timeout=max(60, TIMEOUT_S - (time.monotonic() - started)))
    finally:
        for proc in (slurm, local):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    for job_id in list(states):  # the final states (finished jobs stay visible for MinJobAge)
        job = _squeue().get(job_id)
        if job:
            states[job_id].add(job["state"])
    output = slurm_log.read_text()
    assert slurm.returncode == 0, output[-5000:]
    assert local.returncode == 0, (local_dir / "snakemake.out").read_text()[-5000:]
    print(f"Slurm sweep: {slurm_seconds:.0f} s; local and Slurm together: {time.monotonic() - started:.0f} s")
    return {"local": local_dir / "results" / "live", "slurm": root, "slurm_dir": slurm_dir, "output": output,
            "seen": seen, "states": states, "interrupted": interrupted}


def _rows(path: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if not VOLATILE.search(k)} for row in csv.DictReader(path.open())]


def _metrics(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not VOLATILE.search(k)} for line in path.open()]


def test_every_job_went_through_sbatch_with_the_presets_resources(sweeps):
    from harness.config.loading import resolve

    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.", sweeps["output"])
    rules = [re.search(r"/rule_(\w+)/", log).group(1) for _, log in submitted]
    # data, warmstart, 2 train (+ 2 resubmissions), 3 eval (2 runs + the warm start), report; `all` is local
    assert sorted(rules) == sorted(["data", "warmstart", "train", "train", "train", "train", "eval", "eval", "eval",
                                    "report"]), rules
    preset = resolve(yaml.safe_load((sweeps["slurm_dir"] / "live.yaml").read_text())).preset
    threads = {"data": 1, "warmstart": preset.warmstart.threads, "train": preset.train.threads,
               "eval": preset.eval.threads, "report": 1}
    for (job_id, log), rule in zip(submitted, rules, strict=True):
        job = sweeps["seen"][job_id]
        wanted = getattr(preset.resources, rule)
        assert (_minutes(job["limit"]), job["mem"], int(job["cpus"])) == (
            wanted.runtime, f"{wanted.mem_mb}M", threads[rule]), (rule, job)
        assert Path(log).is_file(), f"no Slurm log at {log}"  # --slurm-keep-successful-logs


def test_interrupted_training_jobs_were_resubmitted_and_resumed(sweeps):
    interrupted, states = sweeps["interrupted"], sweeps["states"]
    assert set(interrupted) == {"uniform", "entropy"}, interrupted
    assert "CANCELLED" in states[interrupted["uniform"]], states[interrupted["uniform"]]
    assert "TIMEOUT" in states[interrupted["entropy"]], states[interrupted["entropy"]]
    for label in ("uniform", "entropy"):
        slurm_run = json.loads((sweeps["slurm"] / "runs" / label / "seed0" / "run.json").read_text())
        local_run = json.loads((sweeps["local"] / "runs" / label / "seed0" / "run.json").read_text())
        assert slurm_run["resumed_from"] and slurm_run["resumed_from"].startswith("checkpoint-"), label
        assert int(slurm_run["resumed_from"].split("-")[1]) < STEPS, f"{label}: interrupted after its last step"
        assert local_run["resumed_from"] is None
        assert slurm_run["budget"]["spent_steps"] == local_run["budget"]["spent_steps"] == STEPS


def test_slurm_sweep_equals_the_local_sweep(sweeps):
    local, slurm = sweeps["local"], sweeps["slurm"]
    for name in ("leaderboard.csv", "leaderboard_runs.csv"):
        assert _rows(slurm / name) == _rows(local / name), name
    board = [(root / "leaderboard.md").read_text().split("## Realised budget")[0] for root in (local, slurm)]
    assert board[0] == board[1]
    samples = sorted(p.relative_to(local) for p in (local / "eval").rglob("samples.jsonl"))
    assert len(samples) == 6  # 3 evaluations x 2 benchmarks
    for rel in samples:
        assert (slurm / rel).read_bytes() == (local / rel).read_bytes(), rel
    for label in ("uniform", "entropy"):
        run = Path("runs") / label / "seed0"
        local_metrics = _metrics(local / run / "metrics.jsonl")
        assert _metrics(slurm / run / "metrics.jsonl") == local_metrics, label
        assert len(local_metrics) == STEPS and len({m["loss"] for m in local_metrics}) > 1  # it did learn something
        weights = [(root / run / "ckpt-100" / "model.safetensors").read_bytes() for root in (local, slurm)]
        assert weights[0] == weights[1], label


# --- the Slurm requests, through `sbatch --test-only` (no job runs) --------------------------------------------------


def _test_only(flags: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--test-only", *flags, "--wrap", "true"], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("gpu_request", ["gpus", "gres"])
def test_a_gpu_rules_flags_pass_sbatch_test_only(gpu_request, tmp_path):
    """paper-ktae's train rule as the SLURM executor plugin submits it (its own get_submit_command and
    set_gres_string: harness.ops.resources.sbatch_command), with one GPU, one CPU per GPU and 500 MB so that a
    small node could hold it, and the preset's time limit. This node has no GPU: the GPU flags are checked as text,
    and the rest (--nodes=1, the CPUs, memory and time limit, partition-free defaults) must be accepted by
    sbatch --test-only; the whole command is refused for the GPUs alone."""
    from harness.config.loading import resolve
    from harness.ops.resources import rule_resources, sbatch_command

    preset = resolve(REPO / "configs" / "sweeps" / "paper-ktae.yaml", [
        f"resources.gpu_request={gpu_request}", "resources.train.gpus=1", "resources.train.cpus_per_gpu=1",
        "resources.train.mem_mb=500"]).preset
    command = shlex.split(sbatch_command(rule_resources(preset)["train"], preset.train.threads, str(tmp_path),
                                         str(tmp_path / "%j.log")))
    assert command[0] == "sbatch" and "--nodes=1" in command and ["-t", "900"] == command[command.index("-t"):][:2]
    gpu_flags = [f for f in command if f.startswith(("--gpus", "--gres", "--cpus-per-gpu"))]
    assert gpu_flags == (["--cpus-per-gpu=1", "--gpus=1"] if gpu_request == "gpus" else ["--gres=gpu:1"])
    assert ("--cpus-per-task=1" in command) == (gpu_request == "gres")
    rest = [f for f in command[1:] if f not in gpu_flags]
    accepted = _test_only(rest)
    assert accepted.returncode == 0 and "to start at" in accepted.stderr, accepted.stderr
    refused = _test_only(command[1:])  # the same with its GPU request: no node here has a GPU
    assert refused.returncode != 0, refused.stderr


def test_orchestrator_job_passes_sbatch_test_only(tmp_path):
    """scripts/submit-orchestrator.sh --test-only: its 1-CPU job (defaults: 3 days, 4G) on this cluster."""
    sweep = tmp_path / "orch.yaml"
    sweep.write_text(yaml.safe_dump({"name": "orch", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
                                     "results_dir": str(tmp_path / "results")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    run = subprocess.run(["bash", str(REPO / "scripts" / "submit-orchestrator.sh"), "--test-only", str(sweep)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and "to start at" in run.stdout + run.stderr, run.stdout + run.stderr
    assert (tmp_path / "results" / "orch" / "logs").is_dir()
    names = subprocess.run(["squeue", "-h", "--states=all", "-o", "%j"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    assert "snakemake-orch" not in names  # nothing was submitted


def test_orchestrator_job_stops_with_the_jobs_it_submitted(tmp_path):
    """The orchestrator for real: scripts/submit-orchestrator.sh submits Snakemake, which submits the data job (held
    back an hour by --begin, so that it is still queued); `scancel --batch --signal=INT`, the stop the script prints,
    makes Snakemake cancel it and exit with its lock released, where a plain scancel (SIGTERM) would leave it."""
    sweep = tmp_path / "stop.yaml"
    sweep.write_text(yaml.safe_dump({"name": "stop", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
                                     "results_dir": str(tmp_path / "results")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    submit = subprocess.run(
        ["bash", str(REPO / "scripts" / "submit-orchestrator.sh"), "--time", "15", "--mem", "2G", str(sweep),
         "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--slurm-status-command", "squeue",
         "--slurm-init-seconds-before-status-checks", "5", "--config", "resources={data: {extra: --begin=now+1hour}}"],
        capture_output=True, text=True, env=env, timeout=120)
    assert submit.returncode == 0, submit.stderr
    orchestrator = re.search(r"as Slurm job (\d+) ", submit.stdout).group(1)
    log = tmp_path / "results" / "stop" / "logs" / f"orchestrator-{orchestrator}.log"
    deadline = time.monotonic() + 300
    data_job = None
    try:
        while data_job is None:
            assert time.monotonic() < deadline, "the orchestrator submitted no data job:\n" + (
                log.read_text()[-3000:] if log.is_file() else "(no log)")
            data_job = next((i for i, job in _squeue().items() if job["comment"] == "rule_data"
                             and job["state"] == "PENDING"), None)
            time.sleep(2)
        subprocess.run(["scancel", "--batch", "--signal=INT", orchestrator], check=True, timeout=30)
        while _squeue().get(orchestrator, {}).get("state") in ("PENDING", "RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline, "the orchestrator did not stop:\n" + log.read_text()[-3000:]
            time.sleep(2)
    finally:
        for job_id in (orchestrator, data_job):
            if job_id and _squeue().get(job_id, {}).get("state") in ("PENDING", "RUNNING"):
                subprocess.run(["scancel", job_id], timeout=30)
    assert _squeue()[data_job]["state"] == "CANCELLED"
    assert "Terminating processes on user request" in log.read_text()
    assert not list((tmp_path / ".snakemake" / "locks").glob("*"))
