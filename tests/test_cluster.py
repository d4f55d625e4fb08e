"""Cluster scale: resources per rule, launch commands, launch checks, job counts and GPU-hours, the paper sweeps'
DAGs dry-run through the SLURM profile (nothing is submitted), and the eval-only mode for released checkpoints."""

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.loading import resolve
from harness.config.paths import REPO_ROOT
from harness.config.schema import ConfigError, JobResources
from harness.ops.resources import (
    KEPT_TRAINER_CHECKPOINTS,
    PROFILE_RETRIES,
    checkpoint_disk,
    format_plan,
    job_counts,
    plan,
    plan_warnings,
    rule_resources,
    sbatch_command,
    snakemake_resources,
    train_command,
    train_retries,
    training_processes,
)

SWEEPS = REPO_ROOT / "configs" / "sweeps"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
HAS_SLURM_PLUGIN = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None

# sweep -> (jobs per rule of a fresh DAG, GPUs of a train job, GPUs of an eval job)
PAPER_SWEEPS = {
    "paper-8020": ({"data": 1, "warmstart": 1, "train": 9, "eval": 19, "report": 1, "all": 1}, 8, 1),
    "paper-ktae": ({"data": 1, "warmstart": 1, "train": 9, "eval": 37, "report": 1, "all": 1}, 4, 1),
    "paper-ktae-grpo": ({"data": 1, "warmstart": 1, "train": 9, "eval": 37, "report": 1, "all": 1}, 4, 1),
    "paper-gmts": ({"data": 1, "warmstart": 1, "train": 12, "eval": 49, "report": 1, "all": 1}, 4, 1),
    "paper-d3s": ({"data": 1, "warmstart": 1, "train": 9, "eval": 37, "report": 1, "all": 1}, 8, 1),
    "paper-rsi": ({"data": 1, "warmstart": 1, "train": 9, "eval": 37, "report": 1, "all": 1}, 4, 1),
    "paper-nat": ({"data": 1, "warmstart": 1, "train": 12, "eval": 25, "report": 1, "all": 1}, 8, 1),
    "published-checkpoints": ({"data": 1, "warmstart": 1, "fetch": 4, "eval": 5, "report": 1, "all": 1}, 0, 1),
    # the project's own head-to-head (no paper): 8 labels x 10 seeds, 4 checkpoints each plus the warm start's eval
    "head-to-head": ({"data": 1, "warmstart": 1, "train": 80, "eval": 321, "report": 1, "all": 1}, 4, 1),
}


def _preset(sweep: str, *overrides: str):
    return resolve(SWEEPS / f"{sweep}.yaml", list(overrides)).preset


# --- resources per rule -------------------------------------------------------------------------------------------


def test_cpu_job_resources_carry_no_gpu_or_cluster_strings():
    assert snakemake_resources(JobResources(mem_mb=2000, runtime=30)) == {"gpu": 0, "mem_mb": 2000, "runtime": 30}


def test_gpu_job_resources_map_to_plugin_keys():
    job = JobResources(gpus=4, gpu_model="h100", cpus_per_gpu=12, mem_mb=256000, runtime=900, partition="gpu",
                       account="proj", extra="--qos=high")
    assert snakemake_resources(job) == {"gpu": 4, "gpu_model": "h100", "cpus_per_gpu": 12, "mem_mb": 256000,
                                        "runtime": 900, "slurm_partition": "gpu", "slurm_account": "proj",
                                        "slurm_extra": "--qos=high", "nodes": 1}


def test_gres_form_asks_for_gpus_as_gres_and_cpus_per_task():
    """resources.gpu_request=gres: --gres=gpu:[<model>:]N and --cpus-per-task = GPUs x cpus_per_gpu, no `gpu` key
    (the plugin would add --gpus for it); CPU jobs are the same in both forms."""
    job = JobResources(gpus=4, gpu_model="h100", cpus_per_gpu=12, mem_mb=256000, runtime=900, partition="gpu")
    assert snakemake_resources(job, "gres") == {"gres": "gpu:h100:4", "cpus_per_task": 48, "nodes": 1,
                                                "mem_mb": 256000, "runtime": 900, "slurm_partition": "gpu"}
    assert snakemake_resources(JobResources(gpus=1), "gres")["gres"] == "gpu:1"
    cpu = JobResources(mem_mb=2000, runtime=30)
    assert snakemake_resources(cpu, "gres") == snakemake_resources(cpu) == {"gpu": 0, "mem_mb": 2000, "runtime": 30}
    res = rule_resources(_preset("paper-ktae", "resources.gpu_request=gres"))
    assert (res["train"]["gres"], res["train"]["cpus_per_task"], res["eval"]["gres"]) == ("gpu:4", 32, "gpu:1")
    assert all("gpu" not in res[rule] for rule in ("train", "eval")) and res["data"]["gpu"] == 0
    with pytest.raises(ConfigError, match="gpu_request"):
        resolve(SWEEPS / "paper-ktae.yaml", ["resources.gpu_request=tres"])


@pytest.mark.skipif(not HAS_SLURM_PLUGIN, reason="the SLURM executor plugin (the `cluster` extra) is not installed")
@pytest.mark.parametrize("gpu_request", ["gpus", "gres"])
def test_the_plugin_turns_a_gpu_rule_into_one_node_sbatch_flags(gpu_request):
    """The sbatch command line the installed plugin builds from each rule's resources (its own functions)."""
    preset = _preset("paper-ktae", f"resources.gpu_request={gpu_request}", "resources.train.partition=gpu",
                     "resources.train.account=proj")
    res = rule_resources(preset)
    train = shlex.split(sbatch_command(res["train"], preset.train.threads, "/w"))
    assert {"--nodes=1", "-t", "900", "--mem", "256000", "-p", "gpu", "-A", "proj"} <= set(train)
    gpu_flags = [f for f in train if f.startswith(("--gpus", "--gres", "--cpus-per"))]
    assert gpu_flags == (["--cpus-per-gpu=8", "--gpus=4"] if gpu_request == "gpus"
                         else ["--cpus-per-task=32", "--gres=gpu:4"])
    evaluation = shlex.split(sbatch_command(res["eval"], preset.eval.threads, "/w"))
    assert "--nodes=1" in evaluation and ("--gpus=1" if gpu_request == "gpus" else "--gres=gpu:1") in evaluation
    data = shlex.split(sbatch_command(res["data"], 1, "/w"))  # a CPU job: one task, the rule's threads, any nodes
    assert {"--ntasks=1", "--cpus-per-task=1", "-t", "30", "--mem", "4000"} <= set(data)
    assert not [f for f in data if f.startswith(("--nodes", "--gpus", "--gres", "--cpus-per-gpu"))]


def test_every_rule_has_resources_and_fetch_takes_warmstarts():
    res = rule_resources(_preset("paper-8020", "resources.warmstart.partition=cpu"))
    assert set(res) == {"data", "warmstart", "fetch", "train", "eval", "eval_warmstart", "report"}
    assert res["fetch"] == res["warmstart"] and res["fetch"]["slurm_partition"] == "cpu"
    assert res["eval_warmstart"] == res["eval"]  # the warm start's eval job under eval.job_scope=run
    assert (res["train"]["gpu"], res["eval"]["gpu"], res["data"]["gpu"], res["report"]["gpu"]) == (8, 1, 0, 0)


def test_cpu_presets_keep_cpu_jobs_and_the_python_launcher():
    for sweep in ("default", "smol"):
        preset = _preset(sweep)
        assert preset.train.launcher == "python" and not preset.train.use_vllm and preset.eval.backend == "hf"
        assert all(r["gpu"] == 0 for r in rule_resources(preset).values())


# --- the train command --------------------------------------------------------------------------------------------

ARGS = "train --sweep S --method {wildcards.method} --seed {wildcards.seed}"


def test_python_launcher_runs_harness_directly():
    assert train_command(_preset("default"), ARGS, "/w") == f"harness {ARGS} > {{log}} 2>&1"


@pytest.mark.parametrize("distributed", ["ddp", "deepspeed_zero3"])
def test_accelerate_launcher_uses_the_backend_config_and_one_process_per_gpu(distributed):
    preset = _preset("paper-ktae", f"train.distributed={distributed}")
    command = train_command(preset, ARGS, "/w")
    config = REPO_ROOT / "configs" / "accelerate" / f"{distributed}.yaml"
    # DeepSpeed's own settings (ZeRO-3, float32 gradient accumulation and reduction) come from the JSON beside it
    json_config = config.with_suffix(".json")
    deepspeed = f"--deepspeed_config_file {json_config} " if distributed == "deepspeed_zero3" else ""
    # accelerate launch with its rendezvous on 127.0.0.1, on a port it holds (tests/test_loopback.py)
    assert command.startswith(f"python -m harness.ops.loopback_launch --config_file {config} {deepspeed}"
                              "--num_processes 4 --num_machines 1 --mixed_precision bf16 -m harness.cli " + ARGS)
    if deepspeed:
        settings = json.loads(json_config.read_text())
        assert settings["zero_optimization"]["stage"] == 3
        assert settings["communication_data_type"] == settings["data_types"]["grad_accum_dtype"] == "fp32"
    assert command.endswith("> {log} 2>&1")
    expected = {"ddp": "MULTI_GPU", "deepspeed_zero3": "DEEPSPEED"}[distributed]
    assert yaml.safe_load(config.read_text())["distributed_type"] == expected


def test_vllm_server_mode_gives_the_server_its_own_gpus():
    preset = _preset("paper-ktae", "train.vllm_mode=server", "train.vllm_tensor_parallel_size=2",
                     "train.vllm_gpu_memory_utilization=0.9", "resources.train.gpus=6")
    assert training_processes(preset) == 4
    command = train_command(preset, ARGS, "/w/model")
    script = REPO_ROOT / "scripts" / "train-with-vllm-server.sh"
    assert command.startswith(f"bash {script} /w/model 2 0.9 4096 {{log}}.vllm -- "
                              "python -m harness.ops.loopback_launch ")
    assert "--num_processes 4 " in command


def test_grpo_config_maps_the_vllm_settings_and_splits_the_batch_over_processes(monkeypatch):
    from harness.config.launch import per_device_rollouts
    from harness.train.trl.settings import grpo_config, vllm_settings

    preset = _preset("paper-ktae")
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process here; accelerate launch sets it per process
    config = grpo_config(preset, Path("/tmp/unused"), 0)
    # 1024 prompts x 16 per generation batch, in 8 mini-batches: one process trains 128 x 16 rollouts per step
    assert (config.per_device_train_batch_size, config.steps_per_generation) == (1024 // 8 * 16, 8)
    assert per_device_rollouts(preset.train, 4) == 1024 // 4 * 16  # each process's share of a generation batch
    assert (config.use_vllm, config.vllm_mode, config.vllm_gpu_memory_utilization, config.vllm_tensor_parallel_size,
            config.vllm_max_model_length) == (True, "colocate", 0.3, 1, 4096)
    assert config.vllm_importance_sampling_correction is False  # the loss never reads TRL's IS ratio
    server = _preset("paper-ktae", "train.vllm_mode=server", "resources.train.gpus=5").train
    settings = vllm_settings(server, {"HARNESS_VLLM_SERVER_PORT": "8123", "HARNESS_VLLM_GROUP_PORT": "8124"})
    assert (settings["vllm_mode"], settings["vllm_server_port"], settings["vllm_group_port"]) == ("server", 8123, 8124)
    assert vllm_settings(_preset("default").train) == {"use_vllm": False}
    with pytest.raises(ValueError, match="multiple of the 3 training processes"):
        per_device_rollouts(preset.train, 3)


# --- launch checks ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sweep, overrides, fragment", [
    ("default", ["resources.train.gpus=2"], "set train.launcher=accelerate"),
    ("default", ["train.distributed=deepspeed_zero3"], "needs train.launcher=accelerate"),
    ("paper-ktae", ["train.distributed=fsdp"], "train.distributed=fsdp has never run"),
    ("paper-nat", ["train.beta=0.01"], "not supported with train.distributed=deepspeed_zero3"),
    ("default", ["train.launcher=accelerate"], "needs resources.train.gpus >= 1"),
    ("default", ["train.use_vllm=true"], "train.use_vllm=true needs resources.train.gpus >= 1"),
    ("paper-ktae", ["train.vllm_tensor_parallel_size=3"], "must divide the 4 training processes"),
    ("paper-ktae", ["resources.train.gpus=3"], "multiple of the 3 training processes"),
    ("paper-ktae", ["train.vllm_mode=server"], "must be a multiple of the 3 training processes"),
    ("paper-ktae", ["eval.vllm.tensor_parallel_size=2"], "needs resources.eval.gpus=2"),
    ("published-checkpoints", ["seeds=[0,1]"], "such a sweep takes one seed"),
    ("published-checkpoints", ["train.budget.checkpoint_fractions=[0.5,1.0]"], "checkpoint_fractions to [1.0]"),
])
def test_launch_settings_are_checked_against_the_gpus(sweep, overrides, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(SWEEPS / f"{sweep}.yaml", overrides)
    assert fragment in str(info.value)


@pytest.mark.parametrize("override, fragment", [
    ("train.launcher=mpirun", "train.launcher"),
    ("train.vllm_mode=remote", "colocate"),
    ("resources.eval.gpus=-1", "resources.eval.gpus"),
    ("resources.train.runtime=0", "outside the allowed range"),
    ("resources.train.gpu=1", "allowed keys here"),
])
def test_resource_and_launch_keys_are_validated(override, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(SWEEPS / "default.yaml", [override])
    assert fragment in str(info.value)


# --- job counts and GPU-hours -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sweep", sorted(PAPER_SWEEPS))
def test_job_counts_of_each_paper_sweep(sweep):
    expected, _, _ = PAPER_SWEEPS[sweep]
    assert job_counts(resolve(SWEEPS / f"{sweep}.yaml")) == expected


def test_plan_gpu_hours_follow_the_budget_and_the_eval_estimate():
    """accel_seconds are device-seconds summed over the training processes: 691,200 on 8 GPUs is 24 h of wall time
    per train job, 8 x 24 GPU-hours."""
    resolved = resolve(SWEEPS / "paper-8020.yaml")
    rows = {r.rule: r for r in plan(resolved)}
    assert rows["train"].hours == pytest.approx(691200 / 8 / 3600) == pytest.approx(24.0)
    assert rows["train"].gpu_hours == pytest.approx(9 * 8 * 24.0)  # 3 labels x 3 seeds x 8 GPUs x 24 h
    assert rows["eval"].gpu_hours == pytest.approx(19 * 1 * 300 / 60)  # 19 jobs x 1 GPU x estimate_minutes
    assert rows["data"].gpu_hours == 0 and "fetch" not in rows
    text = format_plan(resolved)
    assert "1823.0  GPU-hours" in text and "warning" not in text


def test_plan_counts_a_vllm_server_gpu_as_held_not_as_budget():
    """Server mode: 4 GPUs, 3 train; the budget's wall time is amount / 3, and all 4 GPUs are held that long."""
    resolved = resolve(SWEEPS / "paper-rsi.yaml", ["train.vllm_mode=server", "train.prompts_per_step=63"])
    train = {r.rule: r for r in plan(resolved)}["train"]
    assert train.hours == pytest.approx(172800 / 3 / 3600)
    assert train.gpu_hours == pytest.approx(9 * 4 * 172800 / 3 / 3600)


def test_plan_of_a_rollout_budget_says_its_time_is_not_known():
    train = {r.rule: r for r in plan(resolve(SWEEPS / "paper-ktae.yaml"))}["train"]
    assert train.hours == pytest.approx(900 / 60) and "1.96608e+06 samples, time not known before a run" in train.basis


def test_plan_warns_when_the_time_limit_is_below_the_budget():
    # 172,800 device-seconds on 4 GPUs: 12 h = 720 min of wall time per job
    short = resolve(SWEEPS / "paper-rsi.yaml", ["resources.train.runtime=600"])
    assert any("SLURM stops it early" in w and "resumes" in w and "720 min" in w for w in plan_warnings(short))
    assert not plan_warnings(resolve(SWEEPS / "paper-rsi.yaml", ["resources.train.runtime=720"]))


def test_harness_plan_cli(capsys):
    from harness.cli import main

    assert main(["plan", "--sweep", str(SWEEPS / "published-checkpoints.yaml")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^fetch\s+4\s+0", out, flags=re.M) and re.search(r"^eval\s+5\s+1", out, flags=re.M)


# --- retries sized to the training time ---------------------------------------------------------------------------


def test_profile_retries_are_the_ones_the_plan_counts_on():
    profile = yaml.safe_load((REPO_ROOT / "profiles" / "slurm" / "profile.yaml").read_text())
    assert profile["retries"] == PROFILE_RETRIES == 1 and profile["rerun-incomplete"] is True


@pytest.mark.parametrize("sweep, overrides, retries", [
    ("paper-rsi", [], None),  # 12 h of budget in a 15 h limit: the profile's one retry is the spare
    ("paper-8020", [], None),  # 24 h in 30 h
    ("paper-rsi", ["resources.train.runtime=720"], None),  # exactly one limit
    ("paper-rsi", ["resources.train.runtime=300"], 3),  # 12 h / 5 h: 3 limits, one spare
    ("paper-8020", ["resources.train.runtime=1440"], None),  # a site's 24 h limit holds the 24 h budget once
    ("paper-8020", ["resources.train.runtime=720"], 2),
    ("paper-ktae", [], None),  # a rollout budget: time not known, the limit is the bound
    ("paper-ktae", ["resources.train.estimate_minutes=2000"], 3),  # 2000 min in 900 min limits: 3, one spare
    ("paper-rsi", ["resources.train.runtime=300", "train.save_every_steps=0"], None),  # a retry would start over
    ("default", [], None),
])
def test_train_retries_cover_the_budgeted_time(sweep, overrides, retries):
    preset = _preset(sweep, *overrides)
    assert train_retries(preset) == retries
    if retries is not None:  # the time limits cover the budget with one limit to spare
        minutes = preset.train.budget.amount / training_processes(preset) / 60 if sweep != "paper-ktae" else 2000
        runtime = preset.resources.train.runtime
        assert runtime * retries >= minutes > runtime * (retries - 1)


def test_the_snakefile_gives_rule_train_its_retries(tmp_path):
    """Rule train's `retries:` directive, read from the parsed workflow (Snakemake's API); the other rules keep the
    profile's (None)."""
    code = f"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, Quietness, ResourceSettings
out = {{}}
for name, config in {{"fits": {{}}, "short": {{"resources": {{"train": {{"runtime": 300}}}}}}}}.items():
    with SnakemakeApi(OutputSettings(quiet={{Quietness.ALL}})) as api:
        workflow = api.workflow(resource_settings=ResourceSettings(), snakefile=Path({str(REPO_ROOT / "Snakefile")!r}),
                                config_settings=ConfigSettings(configfiles=[Path({str(SWEEPS / "paper-rsi.yaml")!r})],
                                config={{"results_dir": {str(tmp_path / "results")!r}, **config}}),
                                workdir=Path({str(tmp_path)!r}))
        out[name] = {{rule.name: rule._restart_times for rule in workflow._workflow.rules}}  # None: --retries
print(json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    retries = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(retries["fits"].values()) == {None}
    assert retries["short"]["train"] == 3 and {r for k, r in retries["short"].items() if k != "train"} == {None}


def test_plan_prints_the_train_time_limits():
    text = format_plan(resolve(SWEEPS / "paper-rsi.yaml", ["resources.train.runtime=300"]))
    assert ("train time limit: 300 min x 4 attempts (rule train's retries: 3) = 20.0 h for 12.00 h budgeted"
            in text)
    assert "rule train's retries: 3 resubmit it" in text  # the warning
    assert "the profile's retries: 1) = 30.0 h for 12.00 h" in format_plan(resolve(SWEEPS / "paper-rsi.yaml"))
    assert "train time limit" not in format_plan(resolve(SWEEPS / "default.yaml"))  # CPU jobs run locally


# --- disk of the checkpoints --------------------------------------------------------------------------------------


def test_kept_trainer_checkpoints_agree_with_the_trainer():
    """harness/train/trl/trainer.py's constant, read from its source (importing it loads TRL)."""
    tree = ast.parse((REPO_ROOT / "harness" / "train" / "trl" / "trainer.py").read_text())
    values = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
              and any(getattr(t, "id", None) == "KEPT_TRAINER_CHECKPOINTS" for t in node.targets)]
    assert values == [KEPT_TRAINER_CHECKPOINTS]


def test_plan_counts_the_disk_of_trainer_and_budget_checkpoints():
    from harness.config.memory import GIB, architecture

    # ddp, float32 masters: weights 4 + AdamW's two moments 8 bytes per parameter; budget checkpoints in bf16
    resolved = resolve(SWEEPS / "paper-ktae.yaml")
    n = architecture(resolved.preset.model).parameters
    disk = checkpoint_disk(resolved)
    assert (disk.trainer_bytes, disk.budget_bytes, disk.budget_checkpoints, disk.runs) == (12 * n, 2 * n, 4, 9)
    assert disk.run_peak == 3 * 12 * n + 4 * 2 * n and disk.run_final == 2 * 12 * n + 4 * 2 * n
    text = format_plan(resolved)
    assert f"trainer checkpoint (every 24 steps): {12 * n / GIB:.1f} GiB" in text
    assert f"sweep: 9 runs x {disk.run_peak / GIB:.1f} GiB = {9 * disk.run_peak / GIB:.1f} GiB at most" in text
    # ZeRO-3: the gathered bf16 weights 2 + DeepSpeed's float32 masters and moments 12 bytes per parameter
    nat = checkpoint_disk(resolve(SWEEPS / "paper-nat.yaml"))
    assert nat.trainer_bytes == 14 * nat.parameters and (nat.budget_checkpoints, nat.runs) == (2, 12)
    none = checkpoint_disk(resolve(SWEEPS / "paper-ktae.yaml", ["train.save_every_steps=0"]))
    assert none.trainer_parts == [] and none.run_peak == none.run_final == 4 * 2 * n
    assert checkpoint_disk(resolve(SWEEPS / "default.yaml")) is None  # CPU presets: not printed
    assert "disk of the train jobs" not in format_plan(resolve(SWEEPS / "default.yaml"))


# --- the DAG through the SLURM profile (dry run: nothing is submitted) ----------------------------------------------


def dry_run(sweep_file: Path, workdir: Path, *extra: str) -> str:
    """``snakemake -n --profile profiles/slurm`` (with the SLURM executor plugin, the `cluster` extra; without it,
    the same profile with the executor overridden to local), results under ``workdir``."""
    executor = [] if HAS_SLURM_PLUGIN else ["--executor", "local"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run([*SNAKEMAKE, "-n", "--profile", str(REPO_ROOT / "profiles" / "slurm"), *executor,
                          "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(workdir),
                          "--configfile", str(sweep_file), "--config", f"results_dir={workdir / 'results'}", *extra],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


def job_blocks(output: str) -> list[dict]:
    """Each job of a dry run: rule, resources (as a dict) and shell command."""
    jobs = []
    for block in re.split(r"\n(?=\[[^\]]+\]\nrule )", output):
        rule = re.search(r"^rule (\w+):", block, flags=re.M)
        if not rule:
            continue
        resources = re.search(r"^\s+resources: (.*)$", block, flags=re.M)
        pairs = dict(kv.split("=", 1) for kv in resources.group(1).split(", ")) if resources else {}
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        jobs.append({"rule": rule.group(1), "resources": pairs, "shell": shell.group(1) if shell else ""})
    return jobs


def job_stats(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.M)
            if m.group(1) != "total"}


@pytest.mark.parametrize("sweep", sorted(PAPER_SWEEPS))
def test_paper_sweep_dry_run_with_the_slurm_profile(sweep, tmp_path):
    expected, train_gpus, eval_gpus = PAPER_SWEEPS[sweep]
    output = dry_run(SWEEPS / f"{sweep}.yaml", tmp_path)
    assert job_stats(output) == expected
    jobs = job_blocks(output)
    assert sorted(j["rule"] for j in jobs) == sorted(r for r, n in expected.items() for _ in range(n))
    preset = resolve(SWEEPS / f"{sweep}.yaml").preset
    for job in jobs:
        resources = job["resources"]
        if job["rule"] == "all":
            continue
        gpus = {"train": train_gpus, "eval": eval_gpus}.get(job["rule"], 0)
        assert int(resources["gpu"]) == gpus, job
        assert ("cpus_per_gpu" in resources) == (gpus > 0) and ("nodes" in resources) == (gpus > 0)
        section = "warmstart" if job["rule"] == "fetch" else job["rule"]
        assert int(resources["mem_mb"]) == getattr(preset.resources, section).mem_mb
        assert int(resources["runtime"]) == getattr(preset.resources, section).runtime
        if job["rule"] == "train":
            assert job["shell"].startswith("python -m harness.ops.loopback_launch ")
            assert f"--num_processes {train_gpus} " in job["shell"]
            assert f"{preset.train.distributed}.yaml" in job["shell"]


def test_partition_and_account_come_from_the_config(tmp_path):
    output = dry_run(SWEEPS / "paper-ktae.yaml", tmp_path, "resources={train: {partition: gpu-long, account: "
                     "proj}, data: {partition: cpu}}")
    jobs = job_blocks(output)
    train = next(j for j in jobs if j["rule"] == "train")["resources"]
    data = next(j for j in jobs if j["rule"] == "data")["resources"]
    assert (train["slurm_partition"], train["slurm_account"], data["slurm_partition"]) == ("gpu-long", "proj", "cpu")
    assert "slurm_account" not in data


def test_gres_form_in_the_dag(tmp_path):
    output = dry_run(SWEEPS / "paper-ktae.yaml", tmp_path, "resources={gpu_request: gres}")
    jobs = job_blocks(output)
    train = next(j for j in jobs if j["rule"] == "train")["resources"]
    assert (train["gres"], train["cpus_per_task"], train["nodes"]) == ("gpu:4", "32", "1") and "gpu" not in train
    data = next(j for j in jobs if j["rule"] == "data")["resources"]
    assert data["gpu"] == "0" and "gres" not in data and "nodes" not in data


def test_default_sweep_dry_run_is_unchanged_by_the_profile(tmp_path):
    output = dry_run(SWEEPS / "default.yaml", tmp_path)
    # eval.job_scope=run (tiny preset): one eval job per run with all its checkpoints, the warm start's on its own
    expected = {"data": 1, "warmstart": 1, "train": 16, "eval": 16, "eval_warmstart": 1, "report": 1, "all": 1}
    assert job_stats(output) == expected == job_counts(resolve(SWEEPS / "default.yaml"))
    jobs = job_blocks(output)
    train = [j for j in jobs if j["rule"] == "train"]
    assert all(j["shell"].startswith("harness train --sweep ") and j["resources"]["gpu"] == "0" for j in train)
    evals = [j for j in jobs if j["rule"] == "eval"]
    assert all(" --ckpt ckpt-050 ckpt-100 --bench all " in j["shell"] for j in evals)
    warm = next(j for j in jobs if j["rule"] == "eval_warmstart")
    assert " --label warmstart --seed 0 --ckpt ckpt-000 --bench all " in warm["shell"]


def test_default_sweep_with_one_eval_job_per_checkpoint(tmp_path):
    output = dry_run(SWEEPS / "default.yaml", tmp_path, "set=eval.job_scope=checkpoint")
    expected = {"data": 1, "warmstart": 1, "train": 16, "eval": 33, "report": 1, "all": 1}
    assert job_stats(output) == expected == job_counts(resolve(SWEEPS / "default.yaml", ["eval.job_scope=checkpoint"]))


def test_profile_sets_executor_options_only():
    profile = yaml.safe_load((REPO_ROOT / "profiles" / "slurm" / "profile.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert not {"default-resources", "set-resources", "set-threads", "resources"} & set(profile)


def test_shell_scripts_parse():
    for script in ("train-with-vllm-server.sh", "gpu-smoke.sh", "submit-orchestrator.sh"):
        subprocess.run(["bash", "-n", str(REPO_ROOT / "scripts" / script)], check=True)


# --- the orchestrator as a Slurm job (scripts/submit-orchestrator.sh, against a stub sbatch) --------------------------

ORCHESTRATOR = REPO_ROOT / "scripts" / "submit-orchestrator.sh"
STUB_SBATCH = """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_DIR/args"
cat > "$STUB_DIR/script"
echo "4242;cluster1"
"""


def _orchestrator_sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "orch.yaml"
    sweep.write_text(yaml.safe_dump({"name": "orch", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
                                     "results_dir": str(tmp_path / "results")}))
    return sweep


def _submit(tmp_path: Path, *args: str, sbatch: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Runs the script with a stub sbatch first on PATH (or, ``sbatch=False``, a PATH of coreutils without one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if sbatch:
        (bin_dir / "sbatch").write_text(STUB_SBATCH)
        (bin_dir / "sbatch").chmod(0o755)
        path = f"{bin_dir}:{os.environ['PATH']}"
    else:
        for tool in ("dirname", "basename", "sed", "cat", "mkdir", "head", "tail"):
            (bin_dir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True,
                                                       check=True).stdout.strip())
        path = str(bin_dir)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}, "PATH": path,
           "STUB_DIR": str(tmp_path), **env}
    return subprocess.run(["/bin/bash", str(ORCHESTRATOR), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_orchestrator_is_submitted_as_a_long_one_cpu_job(tmp_path):
    sweep = _orchestrator_sweep(tmp_path)
    extra = ["--config", "resources={train: {partition: gpu, account: my proj}}", "-j", "8", "it's $HOME"]
    run = _submit(tmp_path, "--time", "2-00:00:00", "--partition", "long", "orch.yaml", *extra,
                  ORCHESTRATOR_ACCOUNT="proj", ORCHESTRATOR_MEM="2G")
    assert run.returncode == 0, run.stderr
    logs = tmp_path / "results" / "orch" / "logs"
    assert (tmp_path / "args").read_text().splitlines() == [
        "--parsable", "--job-name=snakemake-orch", "--ntasks=1", "--nodes=1", "--cpus-per-task=1", "--mem=2G",
        "--time=2-00:00:00", f"--output={logs}/orchestrator-%j.log", f"--chdir={REPO_ROOT}", "--signal=B:INT@600",
        "--partition=long", "--account=proj"]
    assert logs.is_dir()
    assert "as Slurm job 4242 " in run.stdout and f"tail -f {logs}/orchestrator-4242.log" in run.stdout
    assert "scancel --batch --signal=INT 4242" in run.stdout
    # the batch script runs the checkout's snakemake with the profile and every argument as given: run it with a
    # stub in place of snakemake that records its working directory and arguments
    script = (tmp_path / "script").read_text()
    assert script.startswith("#!/bin/bash\n")
    snakemake = REPO_ROOT / ".venv" / "bin" / "snakemake"
    assert f"exec {snakemake} --profile {REPO_ROOT / 'profiles' / 'slurm'} --configfile {sweep} " in script
    stub = tmp_path / "snakemake-stub"
    stub.write_text(f'#!/bin/bash\npwd > {tmp_path}/cwd\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    stub.chmod(0o755)
    subprocess.run(["bash", "-c", script.replace(str(snakemake), str(stub))], check=True, cwd=tmp_path, timeout=30)
    assert (tmp_path / "cwd").read_text().strip() == str(REPO_ROOT)
    assert (tmp_path / "argv").read_text().splitlines() == [
        "--profile", str(REPO_ROOT / "profiles" / "slurm"), "--configfile", str(sweep), *extra]


@pytest.mark.parametrize("args, env, fragment", [
    (["orch.yaml"], {"sbatch": False}, "sbatch not found"),
    (["missing.yaml"], {}, "no sweep file missing.yaml"),
    (["--queue", "q", "orch.yaml"], {}, "unknown option --queue"),
    (["--time"], {}, "--time needs a value"),
    (["orch.yaml"], {"ORCHESTRATOR_VENV": "/nonexistent"}, "no snakemake in /nonexistent"),
    (["--stop-before", "10m", "orch.yaml"], {}, "--stop-before takes seconds"),
    (["bad.yaml"], {}, "does not resolve"),
])
def test_orchestrator_refuses_before_submitting(tmp_path, args, env, fragment):
    _orchestrator_sweep(tmp_path)
    (tmp_path / "bad.yaml").write_text("name: bad\npreset: no-such-preset\n")
    run = _submit(tmp_path, *args, **env)
    assert run.returncode != 0 and fragment in run.stderr, run.stderr
    assert not (tmp_path / "args").exists()  # sbatch never ran


def test_orchestrator_usage_without_a_sweep(tmp_path):
    run = _submit(tmp_path)
    assert run.returncode == 2 and "SWEEP_FILE [SNAKEMAKE_ARGS...]" in run.stderr
    assert _submit(tmp_path, "--help").returncode == 0


# --- eval-only labels: released checkpoints -----------------------------------------------------------------------


def test_fetch_saves_a_local_checkpoint_as_an_eval_only_run(tiny_model_dir, tmp_path):
    from harness.config.loading import load_method
    from harness.config.paths import SweepPaths
    from harness.ops.fetch import fetch_checkpoint, split_checkpoint

    methods = tmp_path / "methods"
    methods.mkdir()
    (methods / "released-tiny.yaml").write_text(f"method: ktae\ncheckpoint: {tiny_model_dir}\n")
    resolved = resolve({"name": "rel", "preset": "tiny", "methods": ["released-tiny"], "seeds": [0],
                        "results_dir": str(tmp_path / "results"), "method_config_dirs": [str(methods)],
                        "train": {"budget": {"checkpoint_fractions": [1.0]}}})
    spec = load_method("released-tiny", search_dirs=[str(methods)])
    paths = SweepPaths(resolved.results_dir)
    record = fetch_checkpoint(resolved, spec, 0, paths)
    run = json.loads((paths.run_dir("released-tiny", 0) / "run.json").read_text())
    assert run == json.loads(json.dumps(record))
    assert run["method"]["name"] == "ktae" and run["external"]["checkpoint"] == str(tiny_model_dir)
    assert run["budget"]["checkpoints"] == {"ckpt-100": None}
    saved = paths.checkpoint_dir("released-tiny", 0, "ckpt-100")
    assert (saved / "config.json").is_file() and "model.safetensors" in run["external"]["files_sha256"]
    assert split_checkpoint("SunW7777/DAPO_KTAE_1.5B@abc123") == ("SunW7777/DAPO_KTAE_1.5B", "abc123")
    assert split_checkpoint("SunW7777/DAPO_KTAE_1.5B") == ("SunW7777/DAPO_KTAE_1.5B", None)


@pytest.mark.slow
def test_eval_only_sweep_runs_through_the_report(tiny_model_dir, tmp_path):
    """data -> warmstart (reference) and fetch -> eval -> report, with no train job (about a minute on CPU)."""
    methods = tmp_path / "methods"
    methods.mkdir()
    (methods / "released-tiny.yaml").write_text(f"method: ktae\ncheckpoint: {tiny_model_dir}\n")
    sweep = tmp_path / "rel.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "rel", "preset": "tiny", "methods": ["released-tiny"], "seeds": [0],
        "results_dir": str(tmp_path / "results"), "method_config_dirs": [str(methods)],
        "data": {"synthetic": {"n_train": 500, "n_eval": 6, "n_ood": 4}}, "warmstart": {"steps": 5, "batch_size": 8},
        "train": {"budget": {"checkpoint_fractions": [1.0]}}, "eval": {"k": 2, "max_gen_toks": 24}}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run([*SNAKEMAKE, "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(tmp_path),
                          "--configfile", str(sweep), "--cores", "2"], capture_output=True, text=True, env=env,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "rule train:" not in run.stdout + run.stderr
    rows = (tmp_path / "results" / "rel" / "leaderboard_runs.csv").read_text()
    assert "released-tiny,0,ckpt-100,arith," in rows and "warmstart,0,ckpt-000,arith," in rows
