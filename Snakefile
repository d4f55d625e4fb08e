"""The sweep DAG: data -> warmstart -> train(method, seed) -> eval(method, seed[, ckpt]: every benchmark) -> report.

A bare `snakemake --cores 2` runs configs/sweeps/default.yaml.
Another sweep: `--configfile configs/sweeps/<name>.yaml`.
Overrides: `--config set="train.learning_rate=1e-4 eval.k=2"` or `--config 'train={learning_rate: 1e-4}'`.
The whole configuration is validated here, before any job starts. Each rule is one `harness` command.
A label whose method config names a released `checkpoint` is fetched (rule fetch) instead of trained.
On a cluster: `snakemake --profile profiles/slurm ...`; each rule's resources come from the preset's `resources`.
"""

import hashlib
import json
import re
import shlex
import sys
from pathlib import Path

from harness.config.schema import resolve, load_method
from harness.config.paths import SweepPaths, WARMSTART_LABEL, checkpoint_name
from harness.forkserver import ForkServers
from harness.ops.resources import released_checkpoints, rule_resources, train_command


configfile: str(Path(workflow.basedir) / "configs" / "sweeps" / "default.yaml")


RESOLVED = resolve(dict(config))
SWEEP = RESOLVED.sweep
PRESET = RESOLVED.preset
PATHS = SweepPaths(RESOLVED.results_dir)  # every path below comes from here (harness/config/paths.py)
# The exact sweep mapping every job reads, rewritten only when it changes (its mtime then marks a real change).
SWEEP_FILE = PATHS.sweep_file
_sweep_text = json.dumps(dict(config), sort_keys=True, indent=1, default=str)
if not SWEEP_FILE.exists() or SWEEP_FILE.read_text() != _sweep_text:
    SWEEP_FILE.parent.mkdir(parents=True, exist_ok=True)
    SWEEP_FILE.write_text(_sweep_text)
HARNESS = f"harness {{cmd}} --sweep {SWEEP_FILE}"
# Jobs find `harness` (and `accelerate`) next to the interpreter running Snakemake, whatever PATH the shell that
# submitted them had (SLURM jobs inherit it); the prefix keeps Snakemake's own `set -euo pipefail`.
shell.prefix(f"set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\"; ")

CKPTS = [checkpoint_name(f) for f in PRESET.train.budget.checkpoint_fractions]
BENCHES = sorted(PRESET.eval.benchmarks)
# hub: the one job that reads the hub (harness/data/hub.py); source.json records the files, commit and checksums
DATA_OUTPUTS = [str(PATHS.data_dir / f) for f in
                (["train.jsonl"] if PRESET.data.kind == "jsonl" else ["train.jsonl", "source.json"]
                 if PRESET.data.kind == "hub" else ["train.jsonl", "eval.jsonl", "ood.jsonl"])]


def digest(obj) -> str:
    """A short hash of the configuration a job depends on: Snakemake reruns a job when its params change."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


PRESET_DICT = RESOLVED.to_dict()["preset"]
# eval.job_scope groups jobs, train.fast_decode / eval.fast_decode decode the same tokens with less Python
# (harness/model/decode.py): none changes a result, so they are left out and a sweep that sets them (or was run
# before they existed) keeps its digests
TRAIN_DIGEST = digest({k: {kk: vv for kk, vv in v.items() if kk != "fast_decode"} if k == "train" else v
                       for k, v in PRESET_DICT.items() if k not in ("eval", "resources")})
EVAL_DIGEST = digest({k: v for k, v in PRESET_DICT["eval"].items() if k not in ("job_scope", "fast_decode")})


def method_digest(wildcards) -> str:
    return digest([TRAIN_DIGEST, load_method(wildcards.method, search_dirs=SWEEP.method_config_dirs).params.__dict__])


wildcard_constraints:
    method=r"[A-Za-z0-9_\-]+",
    seed=r"\d+",
    ckpt=r"ckpt-\d{3}",


# Cluster resources per rule, from the preset's `resources` section (harness/ops/resources.py); the SLURM profile
# (profiles/slurm) only sets executor options. Locally only `gpu` counts, and only with --resources gpu=N.
RES = rule_resources(PRESET)
# Eval-only labels: their method config names a released `checkpoint`; the fetch rule writes their run.json.
RELEASED = released_checkpoints(RESOLVED)
_released_alternation = "|".join(re.escape(label) for label in RELEASED)
TRAINED_LABEL = (rf"(?!(?:{_released_alternation})(?![A-Za-z0-9_\-]))[A-Za-z0-9_\-]+" if RELEASED
                 else r"[A-Za-z0-9_\-]+")


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


# Jobs run on this machine: train and eval jobs run in children forked from a server per command that has imported
# torch, transformers, TRL and lm-eval once (harness/forkserver.py; same results; HARNESS_FORK_SERVER=off: none).
# A server's environment is the one Snakemake gives its rule's jobs (threads capped at --cores).
FORK_SERVERS = ForkServers(PRESET.model.kind, PRESET.eval.backend, PATHS.logs_dir)


onstart:
    if workflow.local_exec and not workflow.remote_exec:  # (workflow.cores is only defined here)
        # a train job under `accelerate launch` starts its own processes: no train server for it
        served = {"train": min(PRESET.train.threads, workflow.cores)} if PRESET.train.launcher == "python" else {}
        FORK_SERVERS.start({**served, "eval": min(PRESET.eval.threads, workflow.cores)})


onsuccess:
    FORK_SERVERS.stop()


onerror:
    FORK_SERVERS.stop()


rule all:
    input:
        REPORT_OUTPUTS,


rule data:
    output:
        DATA_OUTPUTS,
    log:
        str(PATHS.log_file("data")),
    params:
        cfg=digest(PRESET_DICT["data"]),
    resources:
        **RES["data"],
    shell:
        HARNESS.format(cmd="data") + " > {log} 2>&1"


rule warmstart:
    input:
        DATA_OUTPUTS,
    output:
        str(PATHS.warmstart_file),
    log:
        str(PATHS.log_file("warmstart")),
    benchmark:
        str(PATHS.benchmark_file("warmstart"))
    params:
        cfg=digest([PRESET_DICT["model"], PRESET_DICT["warmstart"], PRESET_DICT["data"]]),
    threads: PRESET.warmstart.threads
    resources:
        **RES["warmstart"],
    shell:
        HARNESS.format(cmd="warmstart") + " > {log} 2>&1"


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
    wildcard_constraints:
        method=TRAINED_LABEL,
    threads: PRESET.train.threads
    # longest jobs first: on a few cores every training job starts before any eval job, so the short eval jobs
    # fill the cores at the end instead of one long training job running alone (default sweep: see README)
    priority: 1
    resources:
        **RES["train"],
    shell:
        # `harness train`, or `accelerate launch ... -m harness.cli train` (train.launcher), optionally beside a
        # vLLM server (train.vllm_mode=server): harness.ops.resources.train_command
        train_command(PRESET, HARNESS.removeprefix("harness ").format(cmd="train")
                      + " --method {wildcards.method} --seed {wildcards.seed}", PATHS.warmstart_dir)


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
        wildcard_constraints:
            method="|".join(re.escape(label) for label in RELEASED),
        resources:
            **RES["fetch"],
        shell:
            HARNESS.format(cmd="fetch") + " --method {wildcards.method} --seed {wildcards.seed} > {log} 2>&1"


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
        output:
            eval_outputs(METHOD, SEED, [CKPT]),
        log:
            str(PATHS.log_file("eval", METHOD, SEED, CKPT)),
        benchmark:
            str(PATHS.benchmark_file("eval", METHOD, SEED, CKPT))
        params:
            cfg=EVAL_DIGEST,
        threads: PRESET.eval.threads
        resources:
            **RES["eval"],
        shell:
            HARNESS.format(cmd="eval") + " --label {wildcards.method} --seed {wildcards.seed} --ckpt {wildcards.ckpt}"
            " --bench all > {log} 2>&1"

else:

    rule eval:
        # eval.job_scope=run: one job per run, all its checkpoints and benchmarks in one process (the imports are
        # paid once); a new label or seed still adds only its own jobs, and each checkpoint keeps its own files
        input:
            RUN_FILE,
        output:
            eval_outputs(METHOD, SEED, CKPTS),
        log:
            str(PATHS.log_file("eval", METHOD, SEED)),
        benchmark:
            str(PATHS.benchmark_file("eval", METHOD, SEED))
        params:
            cfg=EVAL_DIGEST,
        wildcard_constraints:
            method=rf"(?!{WARMSTART_LABEL}(?![A-Za-z0-9_\-]))[A-Za-z0-9_\-]+",
        threads: PRESET.eval.threads
        resources:
            **RES["eval"],
        shell:
            HARNESS.format(cmd="eval") + " --label {wildcards.method} --seed {wildcards.seed} --ckpt "
            + " ".join(CKPTS) + " --bench all > {log} 2>&1"

    rule eval_warmstart:
        # the reference row: the warm start, evaluated like every checkpoint
        input:
            rules.warmstart.output,
        output:
            eval_outputs(WARMSTART_LABEL, "0", ["ckpt-000"]),
        log:
            str(PATHS.log_file("eval", WARMSTART_LABEL, 0, "ckpt-000")),
        benchmark:
            str(PATHS.benchmark_file("eval", WARMSTART_LABEL, 0, "ckpt-000"))
        params:
            cfg=EVAL_DIGEST,
        threads: PRESET.eval.threads
        resources:
            **RES["eval_warmstart"],
        shell:
            HARNESS.format(cmd="eval") + f" --label {WARMSTART_LABEL} --seed 0 --ckpt ckpt-000 --bench all > {{log}} 2>&1"


rule report:
    input:
        eval_targets(),
        run_files(),
        [str(REPORTED_FILE)] if REPORTED_FILE.is_file() else [],
    output:
        REPORT_OUTPUTS,
    log:
        str(PATHS.log_file("report")),
    resources:
        **RES["report"],
    shell:
        HARNESS.format(cmd="report") + " > {log} 2>&1"
