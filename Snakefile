"""The sweep DAG: data -> warmstart -> train(method, seed) -> eval(method, seed[, ckpt]: every benchmark) -> report.

A bare `snakemake --cores 2` runs configs/sweeps/default.yaml.
Another sweep: `--configfile configs/sweeps/<name>.yaml`.
Overrides: `--config set="train.learning_rate=1e-4 eval.k=2"` or `--config 'train={learning_rate: 1e-4}'`.
The whole configuration is validated here, before any job starts. Each rule is one `harness` command.
A label whose method config names a released `checkpoint` is fetched (rule fetch) instead of trained.
On a cluster: `snakemake --profile profiles/slurm ...`; each rule's resources come from the preset's `resources`.
"""

import json
import re
import shlex
import sys
from pathlib import Path

from harness.config.kernels import shell_exports
from harness.config.loopback import shell_exports as loopback_exports
from harness.config.loading import require_sweep_keys, resolve
from harness.config.code_digests import stale_results
from harness.config.paths import LABEL_PATTERN, SweepPaths, WARMSTART_LABEL, checkpoint_name, resolve_repo_path
from harness.config.results_folder import secure_sweep_folder
from harness.data.files import write_text_atomic
from harness.config.snapshot import (data_config, digest, evaluation_config, train_job_config, warmstart_config,
                                     write_snapshot)
from harness.ops.resources import released_checkpoints, rule_resources, train_command, train_retries


# A bare `snakemake` runs the default sweep; with --configfile the sweep is that file alone (no default merged
# underneath), so its own methods and seeds run, as `harness plan` says (resolve requires them).
if not workflow.overwrite_configfiles:

    configfile: str(Path(workflow.basedir) / "configs" / "sweeps" / "default.yaml")


require_sweep_keys(config, ", ".join(map(str, workflow.overwrite_configfiles)) or "configs/sweeps/default.yaml")
RESOLVED = resolve(dict(config))
SWEEP = RESOLVED.sweep
PRESET = RESOLVED.preset
# Before anything is read or written there: the sweep folder and the folders on the way to it are refused when
# another user could put files or links in them; missing ones are created; this process and its jobs create files
# writable by their owner alone (harness/config/results_folder.py, docs/cluster-security.md)
secure_sweep_folder(RESOLVED)
PATHS = SweepPaths(RESOLVED.results_dir)  # every path below comes from here (harness/config/paths.py)
# The sweep mapping of this parse, for people and `harness power --pilot`; no job reads it. Written as a new file
# renamed over the old one: a link in its place is replaced, never written through.
SWEEP_FILE = PATHS.sweep_file
_sweep_text = json.dumps(dict(config), sort_keys=True, indent=1, default=str)
if SWEEP_FILE.is_symlink() or not SWEEP_FILE.is_file() or SWEEP_FILE.read_text() != _sweep_text:
    write_text_atomic(SWEEP_FILE, _sweep_text)
# What every job of this DAG runs: the resolved sweep (preset and method specs included) in a file named by its
# digest, never changed (a copy edited by hand is written again), so a later parse cannot change a running sweep's
# jobs; it names this checkout, whose code the jobs must run (harness/config/snapshot.py). Each rule passes it as
# params.sweep, a Path: Snakemake does not record a Path among a job's params, so whether a job reruns is decided by
# its own digest (cfg) and inputs, not by every change anywhere in the sweep.
SNAPSHOT = write_snapshot(RESOLVED, Path(workflow.basedir), PATHS.snapshots_dir)
# Finished results whose recorded code (shared training or evaluation code, packages) differs from this checkout's:
# not rerun (an edit of harness/ would retrain the whole sweep), listed on every parse of the main process,
# `snakemake -n` included; a method module's own edits do rerun its jobs (its source is in the train digest)
if workflow.is_main_process:
    for line in stale_results(PATHS, [*SWEEP.methods, WARMSTART_LABEL]):
        print(f"stale by code: {line}", file=sys.stderr)
HARNESS = "harness {cmd} --sweep {{params.sweep:q}}"
# Jobs find `harness` (and `accelerate`) next to the interpreter running Snakemake, whatever PATH the shell that
# submitted them had (SLURM jobs inherit it); the prefix keeps Snakemake's own `set -euo pipefail`, exports a
# pinned preset's CPU kernel variables before any job imports torch (harness/config/kernels.py), and keeps every
# job's Gloo, NCCL and vLLM listeners on loopback: all jobs are single-node (harness/config/loopback.py).
shell.prefix(f"set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\"; "
             + shell_exports(PRESET.cpu_kernels) + loopback_exports())

CKPTS = [checkpoint_name(f) for f in PRESET.train.budget.checkpoint_fractions]
BENCHES = sorted(PRESET.eval.benchmarks)
# hub: the one job that reads the hub (harness/data/hub.py); source.json records the files, commit and checksums.
# The data job also writes decontamination.json (harness/data/decontamination.py), not declared here: as an output
# it would rerun the data job, and so every job, of each sweep finished before it existed (the report says "not
# measured" there)
DATA_OUTPUTS = [str(PATHS.data_dir / f) for f in
                (["train.jsonl"] if PRESET.data.kind == "jsonl" else ["train.jsonl", "source.json"]
                 if PRESET.data.kind == "hub" else ["train.jsonl", "eval.jsonl", "ood.jsonl"])]


# A job reruns when its params.cfg (a digest of the configuration it depends on) or its inputs change
# (harness/config/snapshot.py says what each digest leaves out: nothing that changes a result).
EVAL_DIGEST = digest(evaluation_config(RESOLVED))
# user files the jobs read: their edits rerun the jobs that read them
USER_DATA = [str(resolve_repo_path(PRESET.data.train_file))] if PRESET.data.kind in ("jsonl", "mixed") else []
BENCH_FILES = sorted({str(PATHS.benchmark_data_file(b.file)) for b in PRESET.eval.benchmarks.values()})
# a pretrained model from a local directory (model.name_or_path) is read by the warm start: its files are inputs,
# so their edits rerun it (a hub id names no local file)
MODEL_DIR = Path(PRESET.model.name_or_path or ".")
MODEL_FILES = (sorted(str(p) for p in MODEL_DIR.rglob("*") if p.is_file()
                      and not any(part.startswith(".") for part in p.relative_to(MODEL_DIR).parts))
               if PRESET.model.kind == "pretrained" and PRESET.model.name_or_path and MODEL_DIR.is_dir() else [])


def method_digest(wildcards) -> str:
    """The label's training configuration; a train job runs only the labels the snapshot holds (the sweep's)."""
    if wildcards.method not in RESOLVED.methods:
        raise ValueError(f"label {wildcards.method!r} is not one of the sweep's methods {SWEEP.methods}: add it there")
    return digest(train_job_config(RESOLVED, RESOLVED.methods[wildcards.method]))


wildcard_constraints:
    method=LABEL_PATTERN,
    seed=r"\d+",
    ckpt=r"ckpt-\d{3}",


# Cluster resources per rule, from the preset's `resources` section (harness/ops/resources.py); the SLURM profile
# (profiles/slurm) only sets executor options. Locally only `gpu` counts, and only with --resources gpu=N.
RES = rule_resources(PRESET)
# Rule train's retries: None keeps the profile's one retry (and none locally) when one time limit holds the training
# budget; a budget longer than resources.train.runtime gets enough resubmissions, each resuming from the last trainer
# checkpoint, plus one spare (harness.ops.resources.train_retries; docs/cluster.md).
TRAIN_RETRIES = train_retries(PRESET)
# Eval-only labels: their method config names a released `checkpoint`; the fetch rule writes their run.json.
RELEASED = released_checkpoints(RESOLVED)
_released_alternation = "|".join(re.escape(label) for label in RELEASED)
TRAINED_LABEL = (rf"(?!(?:{_released_alternation})(?![A-Za-z0-9_\-])){LABEL_PATTERN}" if RELEASED
                 else LABEL_PATTERN)


def eval_targets():
    runs = [(m, s, c) for m in SWEEP.methods for s in SWEEP.seeds for c in CKPTS]
    runs.append((WARMSTART_LABEL, 0, "ckpt-000"))
    return [str(PATHS.results_file(m, s, c, b)) for m, s, c in runs for b in BENCHES]


def run_files():
    return [str(PATHS.run_file(m, s)) for m in SWEEP.methods for s in SWEEP.seeds]


# Snakemake wildcard patterns of the per-job paths: the same SweepPaths methods with "{method}" for the label.
METHOD, SEED, CKPT = "{method}", "{seed}", "{ckpt}"
RUN_FILE = str(PATHS.run_file(METHOD, SEED))
REPORT_OUTPUTS = [str(p) for p in PATHS.report_files()]
REPORTED_FILE = Path(workflow.basedir) / "configs" / "reported" / f"{SWEEP.name}.yaml"
FIDELITY_FILE = Path(workflow.basedir) / "configs" / "fidelity" / f"{SWEEP.name}.yaml"


rule all:
    input:
        REPORT_OUTPUTS,


rule data:
    input:
        USER_DATA,
    output:
        DATA_OUTPUTS,
    log:
        str(PATHS.log_file("data")),
    params:
        cfg=digest(data_config(RESOLVED)),
        sweep=SNAPSHOT,
    resources:
        **RES["data"],
    shell:
        HARNESS.format(cmd="data") + " > {log:q} 2>&1"


rule warmstart:
    input:
        DATA_OUTPUTS,
        MODEL_FILES,
    output:
        str(PATHS.warmstart_file),
    log:
        str(PATHS.log_file("warmstart")),
    benchmark:
        str(PATHS.benchmark_file("warmstart"))
    params:
        cfg=digest(warmstart_config(RESOLVED)),
        sweep=SNAPSHOT,
    threads: PRESET.warmstart.threads
    resources:
        **RES["warmstart"],
    shell:
        HARNESS.format(cmd="warmstart") + " > {log:q} 2>&1"


rule train:
    input:
        rules.warmstart.output,
    output:
        RUN_FILE,
    log:
        str(PATHS.log_file("train", METHOD, SEED)),
    benchmark:
        str(PATHS.benchmark_file("train", METHOD, SEED))
    params:
        cfg=method_digest,
        sweep=SNAPSHOT,
    wildcard_constraints:
        method=TRAINED_LABEL,
    threads: PRESET.train.threads
    # longest jobs first: on a few cores every training job starts before any eval job, so the short eval jobs
    # fill the cores at the end instead of one long training job running alone (default sweep: see README)
    priority: 1
    retries: TRAIN_RETRIES
    resources:
        **RES["train"],
    shell:
        # `harness train`, or `accelerate launch ... -m harness.cli train` (train.launcher), optionally beside a
        # vLLM server (train.vllm_mode=server): harness.ops.resources.train_command
        train_command(PRESET, HARNESS.removeprefix("harness ").format(cmd="train")
                      + " --method {wildcards.method} --seed {wildcards.seed}", PATHS.warmstart_dir, log="{log:q}")


if RELEASED:

    rule fetch:
        # an eval-only label: its released checkpoint becomes the run's ckpt-100 and run.json (harness/ops/fetch.py)
        output:
            RUN_FILE,
        log:
            str(PATHS.log_file("fetch", METHOD, SEED)),
        params:
            checkpoint=lambda wildcards: RELEASED[wildcards.method],
            dtype=PRESET.model.dtype,
            sweep=SNAPSHOT,
        wildcard_constraints:
            method="|".join(re.escape(label) for label in RELEASED),
        resources:
            **RES["fetch"],
        shell:
            HARNESS.format(cmd="fetch") + " --method {wildcards.method} --seed {wildcards.seed} > {log:q} 2>&1"


def eval_input(wildcards):
    if wildcards.method == WARMSTART_LABEL:
        return rules.warmstart.output
    return str(PATHS.run_file(wildcards.method, wildcards.seed))


def eval_outputs(method: str, seed: str, ckpts: list[str]) -> list[str]:
    return [str(path) for ckpt in ckpts for bench in BENCHES for path in
            (PATHS.results_file(method, seed, ckpt, bench), PATHS.samples_file(method, seed, ckpt, bench))]


if PRESET.eval.job_scope == "checkpoint":

    rule eval:
        # one job per checkpoint (the warm start's among them): on a cluster the checkpoints run in parallel
        input:
            eval_input,
            BENCH_FILES,
        output:
            eval_outputs(METHOD, SEED, [CKPT]),
        log:
            str(PATHS.log_file("eval", METHOD, SEED, CKPT)),
        benchmark:
            str(PATHS.benchmark_file("eval", METHOD, SEED, CKPT))
        params:
            cfg=EVAL_DIGEST,
            sweep=SNAPSHOT,
        threads: PRESET.eval.threads
        resources:
            **RES["eval"],
        shell:
            HARNESS.format(cmd="eval") + " --label {wildcards.method} --seed {wildcards.seed} --ckpt {wildcards.ckpt}"
            " --bench all > {log:q} 2>&1"

else:

    rule eval:
        # eval.job_scope=run: one job per run, all its checkpoints and benchmarks in one process (the imports are
        # paid once); a new label or seed still adds only its own jobs, and each checkpoint keeps its own files
        input:
            RUN_FILE,
            BENCH_FILES,
        output:
            eval_outputs(METHOD, SEED, CKPTS),
        log:
            str(PATHS.log_file("eval", METHOD, SEED)),
        benchmark:
            str(PATHS.benchmark_file("eval", METHOD, SEED))
        params:
            cfg=EVAL_DIGEST,
            sweep=SNAPSHOT,
        wildcard_constraints:
            method=rf"(?!{WARMSTART_LABEL}(?![A-Za-z0-9_\-])){LABEL_PATTERN}",
        threads: PRESET.eval.threads
        resources:
            **RES["eval"],
        shell:
            HARNESS.format(cmd="eval") + " --label {wildcards.method} --seed {wildcards.seed} --ckpt "
            + " ".join(CKPTS) + " --bench all > {log:q} 2>&1"

    rule eval_warmstart:
        # the reference row: the warm start, evaluated like every checkpoint
        input:
            rules.warmstart.output,
            BENCH_FILES,
        output:
            eval_outputs(WARMSTART_LABEL, "0", ["ckpt-000"]),
        log:
            str(PATHS.log_file("eval", WARMSTART_LABEL, 0, "ckpt-000")),
        benchmark:
            str(PATHS.benchmark_file("eval", WARMSTART_LABEL, 0, "ckpt-000"))
        params:
            cfg=EVAL_DIGEST,
            sweep=SNAPSHOT,
        threads: PRESET.eval.threads
        resources:
            **RES["eval_warmstart"],
        shell:
            HARNESS.format(cmd="eval") + f" --label {WARMSTART_LABEL} --seed 0 --ckpt ckpt-000 --bench all > {{log:q}} 2>&1"


rule report:
    input:
        eval_targets(),
        run_files(),
        [str(path) for path in (REPORTED_FILE, FIDELITY_FILE) if path.is_file()],
    output:
        REPORT_OUTPUTS,
    log:
        str(PATHS.log_file("report")),
    params:
        sweep=SNAPSHOT,
        # the preset's A/A calibration (rule calibrate) by its content, so a new one reruns the report; not an input:
        # that would tie every sweep of the preset to rule calibrate and its 8 seeds
        calibration=[digest(p.read_text()) for p in [Path(workflow.basedir) / "configs" / "calibration"
                                                      / f"{PRESET.name}.json"] if p.is_file()],
    resources:
        **RES["report"],
    shell:
        HARNESS.format(cmd="report") + " > {log:q} 2>&1"


# The A/A calibration of this sweep's preset (issue #25; docs/statistics.md): `snakemake calibrate` trains and
# evaluates the baseline alone with seeds 0..7 and writes configs/calibration/<preset>.json, the training noise
# later reports of the preset pool with their own. Not part of `all`: run it once per preset and commit the file.
CALIBRATION_SEEDS = list(range(8))
CALIBRATION_LABEL = "uniform"


rule calibrate:
    input:
        [str(PATHS.samples_file(CALIBRATION_LABEL, s, CKPTS[-1], b)) for s in CALIBRATION_SEEDS for b in BENCHES],
    output:
        str(Path(workflow.basedir) / "configs" / "calibration" / f"{PRESET.name}.json"),
    log:
        str(PATHS.log_file("calibrate")),
    params:
        sweep=SNAPSHOT,
    resources:
        **RES["report"],
    shell:
        HARNESS.format(cmd="calibrate") + f" --seeds {len(CALIBRATION_SEEDS)} --out {{output:q}} > {{log:q}} 2>&1"
