"""Nothing lost, nothing mixed (docs/integrity.md): a job runs exactly the resolved sweep its DAG was built from, what
decides a rerun and a resume covers what changes a result, and a job refuses another checkout's Snakefile."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from harness.cli import main as harness
from harness.config.loading import load_method, resolve
from harness.config.paths import REPO_ROOT, SweepPaths
from harness.config.snapshot import digest, load_snapshot, train_job_config, write_snapshot

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SWEEP = {"name": "ci", "preset": "tiny", "methods": ["uniform", "uniform-aa"], "seeds": [0]}


def snakemake(snakefile: Path, workdir: Path, sweep_file: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, "--snakefile", str(snakefile), "--directory", str(workdir), "--configfile",
                           str(sweep_file), "--cores", "1", *extra], capture_output=True, text=True, env=env,
                          timeout=600)


def sweep_file(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "ci.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "results_dir": str(tmp_path / "results"), **changes}))
    return path


def job_sweeps(dry_run: subprocess.CompletedProcess) -> set[str]:
    """The --sweep of every job command a dry run (-n -p) prints."""
    assert dry_run.returncode == 0, dry_run.stdout[-3000:] + dry_run.stderr[-3000:]
    return set(re.findall(r"harness \w+ --sweep (\S+)", dry_run.stdout + dry_run.stderr))


# --- 1. a job runs the configuration its DAG was built from -----------------------------------------------------


def test_a_later_parse_leaves_the_running_dags_resolved_sweep_as_it_was(tmp_path):
    sweep = sweep_file(tmp_path)
    first = job_sweeps(snakemake(REPO_ROOT / "Snakefile", tmp_path, sweep, "-n", "-p"))
    assert len(first) == 1
    running = Path(first.pop())
    text = running.read_text()
    # what a second invocation does while the first runs: parse with other values (the lock comes after parsing)
    second = job_sweeps(snakemake(REPO_ROOT / "Snakefile", tmp_path, sweep, "-n", "-p", "--config",
                                  "set=train.learning_rate=0.5"))
    assert second and running not in {Path(p) for p in second}
    assert running.read_text() == text
    assert load_snapshot(running).preset.train.learning_rate == resolve(sweep).preset.train.learning_rate != 0.5
    assert load_snapshot(Path(second.pop())).preset.train.learning_rate == 0.5


def test_every_sweep_resolves_to_the_same_configuration_from_its_snapshot(tmp_path):
    for path in sorted((REPO_ROOT / "configs" / "sweeps").glob("*.yaml")):
        resolved = resolve(path)
        assert load_snapshot(write_snapshot(resolved, REPO_ROOT, tmp_path)) == resolved, path.name


def test_a_job_reads_its_method_from_the_snapshot_not_the_yaml(tmp_path, capsys):
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "mine.yaml").write_text("method: entropy\nrho: 0.2\n")
    resolved = resolve({**SWEEP, "methods": ["mine"], "method_config_dirs": [str(labels)]})
    snapshot = write_snapshot(resolved, REPO_ROOT, tmp_path / "sweeps")
    (labels / "mine.yaml").write_text("method: entropy\nrho: 0.9\n")  # edited while the sweep runs
    assert load_snapshot(snapshot).methods["mine"].params.rho == 0.2
    assert harness(["fetch", "--sweep", str(snapshot), "--method", "uniform", "--seed", "0"]) == 2
    assert "'uniform' is not a label of the resolved sweep" in capsys.readouterr().err


def test_a_job_refuses_an_edited_snapshot_and_overrides_of_one(tmp_path, capsys):
    snapshot = write_snapshot(resolve(SWEEP), REPO_ROOT, tmp_path / "sweeps")
    assert harness(["plan", "--sweep", str(snapshot), "--set", "train.learning_rate=0.5"]) == 2
    assert "run exactly as written" in capsys.readouterr().err
    text = snapshot.read_text()
    snapshot.write_text(text.replace('"learning_rate": ', '"learning_rate": 1', 1))  # 0.003 -> 10.003
    assert harness(["plan", "--sweep", str(snapshot)]) == 2
    err = capsys.readouterr().err
    assert str(snapshot) in err and "changed after the Snakefile wrote it" in err


# --- 2. what decides a rerun ------------------------------------------------------------------------------------


def test_the_train_digest_covers_the_method_name_and_seed_offset(monkeypatch):
    # the method's source is in the digest too (tests/test_code_digests.py): held fixed here, for the name alone
    monkeypatch.setattr("harness.config.snapshot.method_source_digest", lambda name: "same source")
    resolved = resolve(SWEEP)
    uniform, aa = load_method("uniform"), load_method("uniform-aa")
    assert (uniform.name, uniform.params) == (aa.name, aa.params) and uniform.seed_offset != aa.seed_offset
    assert digest(train_job_config(resolved, uniform)) != digest(train_job_config(resolved, aa))
    renamed = load_method("uniform")
    renamed.name = "entropy-free-uniform"
    assert digest(train_job_config(resolved, uniform)) != digest(train_job_config(resolved, renamed))


def test_user_data_and_benchmark_files_are_inputs_of_the_jobs_that_read_them(tmp_path):
    train_file, bench_file = tmp_path / "mine_train.jsonl", tmp_path / "mine_bench.jsonl"
    for path, problem in ((train_file, "1+1"), (bench_file, "1+2")):  # distinct: a shared problem is refused
        path.write_text(json.dumps({"id": "a", "problem": problem, "answer": "2", "solution": "2"}) + "\n")
    sweep = sweep_file(tmp_path, data={"kind": "mixed", "train_file": str(train_file)},
                       eval={"benchmarks": {"mine": {"file": str(bench_file), "scorer": "numeric"}}})
    run = snakemake(REPO_ROOT / "Snakefile", tmp_path, sweep, "-n")
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = {m.group(1): m.group(2) for m in re.finditer(r"^rule (\w+):\n\s+input: ([^\n]*)", run.stdout, flags=re.M)}
    assert str(train_file) in jobs["data"]
    assert str(bench_file) in jobs["eval"] and str(bench_file) in jobs["eval_warmstart"]


# --- 3. what decides a resume -----------------------------------------------------------------------------------


def test_the_resume_key_covers_the_warm_start_and_data_contents_not_eval_or_resources(tiny_sweep, tmp_path):
    from harness.train.run import run_key

    overrides, tiny = tiny_sweep
    paths = SweepPaths(tmp_path / "tiny")
    shutil.copytree(tiny.data_dir, paths.data_dir)
    shutil.copytree(tiny.warmstart_dir, paths.warmstart_dir)
    uniform = load_method("uniform")

    def key(*extra, spec=uniform):
        return run_key(resolve(SWEEP, [*overrides, *extra]), spec, 0, paths)

    base = key()
    assert key("resources.train.runtime=4320", "eval.k=3", "train.fast_decode=false") == base
    assert key(spec=load_method("uniform-aa")) != base and key("train.learning_rate=0.5") != base
    with open(paths.data_dir / "train.jsonl", "a") as handle:  # the data regenerated differently
        handle.write("\n")
    assert key() != base
    shutil.copy(tiny.data_dir / "train.jsonl", paths.data_dir / "train.jsonl")
    assert key() == base
    weights = paths.warmstart_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))  # another warm start
    assert key() != base


# --- 5. a job runs the code of the Snakefile that launched it ---------------------------------------------------


def test_a_job_refuses_the_snapshot_of_another_checkout(tmp_path, capsys):
    other = tmp_path / "other-checkout"
    snapshot = write_snapshot(resolve(SWEEP), other, tmp_path / "sweeps")
    assert harness(["data", "--sweep", str(snapshot)]) == 2
    err = capsys.readouterr().err
    assert f"Snakefile of checkout {other}" in err and f"code of checkout {REPO_ROOT}" in err
    assert f"{other}/.venv/bin/snakemake" in err


def test_another_checkouts_snakefile_with_this_environment_runs_no_job(tmp_path):
    checkout = tmp_path / "checkout-b"
    for part in ("harness", "methods", "configs"):
        shutil.copytree(REPO_ROOT / part, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "Snakefile", checkout / "Snakefile")
    results = tmp_path / "results" / "ci"
    run = snakemake(checkout / "Snakefile", tmp_path, sweep_file(tmp_path), str(results / "data" / "train.jsonl"))
    assert run.returncode != 0
    log = (results / "logs" / "data.log").read_text()
    assert f"Snakefile of checkout {checkout}" in log and f"code of checkout {REPO_ROOT}" in log, log[-2000:]
    assert not (results / "data" / "train.jsonl").exists()


def test_a_local_model_directory_and_the_fidelity_file_are_inputs(tmp_path):
    """A pretrained model read from a local directory reruns the warm start when its files change; the sweep's
    configs/fidelity/<name>.yaml reruns the report (it is read by it, like configs/reported/<name>.yaml)."""
    model_dir = tmp_path / "my model"
    (model_dir / ".cache").mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json", ".cache/lock"):
        (model_dir / name).write_text("{}")
    # the memory plan sizes a local model from its config.json's dimensions (Qwen2.5-0.5B's)
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}))
    workdir = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT, workdir, ignore=shutil.ignore_patterns(".git", ".venv", "results", "*.egg-info"))
    (workdir / "configs" / "fidelity" / "ci.yaml").write_text("{}\n")
    sweep = sweep_file(tmp_path, model={"kind": "pretrained", "name_or_path": str(model_dir)})
    run = snakemake(workdir / "Snakefile", workdir, sweep, "-n")
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = {m.group(1): m.group(2) for m in re.finditer(r"^rule (\w+):\n\s+input: ([^\n]*)", run.stdout, flags=re.M)}
    assert str(model_dir / "model.safetensors") in jobs["warmstart"] and str(model_dir / "tokenizer.json") in jobs[
        "warmstart"]
    assert ".cache" not in jobs["warmstart"]
    assert str(workdir / "configs" / "fidelity" / "ci.yaml") in jobs["report"]
