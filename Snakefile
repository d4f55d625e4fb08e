"""The sweep DAG: data -> warmstart -> train(method, seed) -> eval(method, seed, ckpt: every benchmark) -> report.

A bare `snakemake --cores 2` runs configs/sweeps/default.yaml. Another sweep: `--configfile configs/sweeps/X.yaml`.
Overrides: `--config set="train.learning_rate=1e-4 eval.k=2"` or `--config 'train={learning_rate: 1e-4}'`.
The whole configuration is validated here, before any job starts. Each rule is one `harness` command.
A label whose method config names a released `checkpoint` is fetched (rule fetch) instead of trained.
On a cluster: `snakemake --profile profiles/slurm ...`; each rule's resources come from the preset's `resources`.
"""

import hashlib
import json
import re
from pathlib import Path

from harness.config.schema import resolve, load_method
from harness.config.paths import SweepPaths, WARMSTART_LABEL, checkpoint_name
from harness.ops.resources import released_checkpoints, rule_resources, train_command


configfile: str(Path(workflow.basedir) / "configs" / "sweeps" / "default.yaml")


RESOLVED = resolve(dict(config))
SWEEP = RESOLVED.sweep
PRESET = RESOLVED.preset
PATHS = SweepPaths(RESOLVED.results_dir)
ROOT = str(PATHS.root)
# The exact sweep mapping every job reads, rewritten only when it changes (its mtime then marks a real change).
SWEEP_FILE = PATHS.root / "sweep.yaml"
_sweep_text = json.dumps(dict(config), sort_keys=True, indent=1, default=str)
if not SWEEP_FILE.exists() or SWEEP_FILE.read_text() != _sweep_text:
    SWEEP_FILE.parent.mkdir(parents=True, exist_ok=True)
    SWEEP_FILE.write_text(_sweep_text)
HARNESS = f"harness {{cmd}} --sweep {SWEEP_FILE}"

CKPTS = [checkpoint_name(f) for f in PRESET.train.budget.checkpoint_fractions]
BENCHES = sorted(PRESET.eval.benchmarks)
DATA_OUTPUTS = [str(PATHS.data_dir / f) for f in
                (["train.jsonl"] if PRESET.data.kind == "jsonl" else ["train.jsonl", "eval.jsonl", "ood.jsonl"])]


def digest(obj) -> str:
    """A short hash of the configuration a job depends on: Snakemake reruns a job when its params change."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


PRESET_DICT = RESOLVED.to_dict()["preset"]
TRAIN_DIGEST = digest({k: v for k, v in PRESET_DICT.items() if k not in ("eval", "resources")})
EVAL_DIGEST = digest(PRESET_DICT["eval"])


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
    return [f"{ROOT}/eval/{m}/seed{s}/{c}/{b}/results.json" for m, s, c in runs for b in BENCHES]


REPORT_OUTPUTS = [f"{ROOT}/{name}" for name in
                  ("leaderboard.md", "leaderboard.csv", "leaderboard_runs.csv", "report.html")]
REPORTED_FILE = Path(workflow.basedir) / "configs" / "reported" / f"{SWEEP.name}.yaml"


rule all:
    input:
        REPORT_OUTPUTS,


rule data:
    output:
        DATA_OUTPUTS,
    log:
        f"{ROOT}/logs/data.log",
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
        f"{ROOT}/warmstart/model/warmstart.json",
    log:
        f"{ROOT}/logs/warmstart.log",
    benchmark:
        f"{ROOT}/benchmarks/warmstart.tsv"
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
        f"{ROOT}/runs/{{method}}/seed{{seed}}/run.json",
    log:
        f"{ROOT}/logs/train/{{method}}_seed{{seed}}.log",
    benchmark:
        f"{ROOT}/benchmarks/train/{{method}}_seed{{seed}}.tsv"
    params:
        cfg=method_digest,
    wildcard_constraints:
        method=TRAINED_LABEL,
    threads: PRESET.train.threads
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
            f"{ROOT}/runs/{{method}}/seed{{seed}}/run.json",
        log:
            f"{ROOT}/logs/fetch/{{method}}_seed{{seed}}.log",
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
    return f"{ROOT}/runs/{wildcards.method}/seed{wildcards.seed}/run.json"


rule eval:
    input:
        eval_input,
    output:
        [f"{ROOT}/eval/{{method}}/seed{{seed}}/{{ckpt}}/{bench}/{name}" for bench in BENCHES
         for name in ("results.json", "samples.jsonl")],
    log:
        f"{ROOT}/logs/eval/{{method}}_seed{{seed}}_{{ckpt}}.log",
    benchmark:
        f"{ROOT}/benchmarks/eval/{{method}}_seed{{seed}}_{{ckpt}}.tsv"
    params:
        cfg=EVAL_DIGEST,
    threads: PRESET.eval.threads
    resources:
        **RES["eval"],
    shell:
        HARNESS.format(cmd="eval") + " --label {wildcards.method} --seed {wildcards.seed} --ckpt {wildcards.ckpt}"
        " --bench all > {log} 2>&1"


rule report:
    input:
        eval_targets(),
        expand(f"{ROOT}/runs/{{method}}/seed{{seed}}/run.json", method=SWEEP.methods, seed=SWEEP.seeds),
        [str(REPORTED_FILE)] if REPORTED_FILE.is_file() else [],
    output:
        REPORT_OUTPUTS,
    log:
        f"{ROOT}/logs/report.log",
    resources:
        **RES["report"],
    shell:
        HARNESS.format(cmd="report") + " > {log} 2>&1"
