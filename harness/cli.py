"""``harness`` command line: data, warmstart, train, fetch, eval, report, summarize, plan, power, calibrate,
extend-seeds, rehearse, verify, progress, prefetch, inspect, new-method; ``harness --help`` lists them, one line
each, and the documents that hold their formats.

Every subcommand that works on a sweep takes ``--sweep FILE`` (default configs/sweeps/default.yaml) and
``--set key=value`` overrides, resolves and validates the whole configuration first, then does one thing. A Snakemake
job's ``--sweep`` is the resolved sweep its DAG was built from (``results/<sweep>/sweeps/<digest>.json``,
harness/config/snapshot.py), run as written: no overrides, no YAML read again.

The jobs (data, warmstart, fetch, train, eval) of a sweep that reads the hub run with the hub offline
(HF_HUB_OFFLINE=1 unless the environment sets it): ``harness prefetch`` fills the hub cache beforehand on a node
with hub access (harness/model/hub.py, harness/ops/prefetch.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config.loading import load_method, resolve
from harness.config.paths import CONFIG_DIR, REPO_ROOT, SweepPaths
from harness.config.schema import ConfigError, MethodSpec, Resolved
from harness.config.snapshot import is_snapshot, load_snapshot
from harness.data.score_names import avg_at

DEFAULT_SWEEP = CONFIG_DIR / "sweeps" / "default.yaml"
DISTRIBUTION = "tokentarget-harness"  # pyproject.toml's [project] name
HUB_OFFLINE_JOBS = ("data", "warmstart", "fetch", "train", "eval")  # run offline when the sweep reads the hub
# the commands that write into the sweep folder (they create it) and those that only read it; either refuses a sweep
# folder another user could change before touching it (harness/config/results_folder.py)
SWEEP_FOLDER_WRITERS = ("data", "warmstart", "fetch", "train", "eval", "report", "extend-seeds")
SWEEP_FOLDER_READERS = ("plan", "power", "calibrate", "progress")


def _sweep_args(parser: argparse.ArgumentParser) -> None:
    # the default is absolute (any working directory), its help the path in the checkout
    parser.add_argument("--sweep", default=str(DEFAULT_SWEEP),
                        help=f"sweep YAML (default: {DEFAULT_SWEEP.relative_to(REPO_ROOT)})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. train.learning_rate=1e-4 (repeatable)")


def version_text() -> str:
    """The installed distribution's version and the checkout's git commit, for ``harness --version``."""
    from harness.config.provenance import git_state

    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed: pip install -e .)"
    # only a checkout has a commit: git run from an installed copy would report whatever repository holds it
    git = git_state() if (REPO_ROOT / ".git").exists() else {"commit": None, "dirty": None}
    commit = git["commit"] or "not available (not a git checkout)"
    return f"harness {version} ({DISTRIBUTION}), git commit {commit}" + (" with uncommitted changes"
                                                                        if git["dirty"] else "")


class VersionAction(argparse.Action):
    """``--version``: runs git only when asked, not on every command's parse (argparse's own version action takes
    its text when the parser is built)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started (Linux /proc, 10 ms resolution); None elsewhere."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def mark_startup(command: str) -> None:
    """Print one ``startup:`` line to the job's log when a subcommand starts its real work, after the interpreter
    start, the imports it needs and the configuration: CPU seconds of this process (all threads) and wall seconds
    since the process started, plus torch's thread count when torch is loaded (bench/sweep_breakdown.py reads it)."""
    torch = sys.modules.get("torch")
    wall = seconds_since_process_start()
    fields = {"command": command, "cpu_s": f"{time.process_time():.3f}",
              "wall_s": "n/a" if wall is None else f"{wall:.2f}",
              "torch_threads": torch.get_num_threads() if torch is not None else "n/a"}
    print("startup: " + " ".join(f"{k}={v}" for k, v in fields.items()), file=sys.stderr, flush=True)


def _resolve(args) -> tuple[Resolved, SweepPaths]:
    if is_snapshot(args.sweep):
        if args.overrides:
            raise ConfigError(f"--sweep {args.sweep} is a resolved sweep, run exactly as written: --set "
                              f"{args.overrides} would change it (pass the sweep YAML to override keys)")
        resolved = load_snapshot(Path(args.sweep))
    else:
        resolved = resolve(args.sweep, [o for o in args.overrides if not o.startswith("method.")])
    if args.command in SWEEP_FOLDER_WRITERS or args.command in SWEEP_FOLDER_READERS:
        from harness.config.results_folder import secure_sweep_folder

        # a command writing to its --out instead reads the sweep folder only
        secure_sweep_folder(resolved, create=args.command in SWEEP_FOLDER_WRITERS and not getattr(args, "out", None))
    if args.command in HUB_OFFLINE_JOBS:
        from harness.model.hub import offline_jobs
        from harness.ops.prefetch import reads_hub

        if reads_hub(resolved):  # a compute node reads the cache `harness prefetch` filled; never the network
            offline_jobs()
    return resolved, SweepPaths(resolved.results_dir)


def _method_spec(args, resolved: Resolved) -> MethodSpec:
    """The label's spec: from a resolved sweep as it holds it, else from its YAML with the ``method.*`` overrides."""
    if is_snapshot(args.sweep):
        if args.method not in resolved.methods:
            raise ConfigError(f"--method {args.method!r} is not a label of the resolved sweep {args.sweep}; its "
                              f"labels: {sorted(resolved.methods)}")
        return resolved.methods[args.method]
    method_overrides = [o.removeprefix("method.") for o in args.overrides if o.startswith("method.")]
    return load_method(args.method, method_overrides, resolved.sweep.method_config_dirs)


def _use_cpu_kernels(args, cpu_kernels: str) -> None:
    """A pinned preset's kernel variables take effect only if set before torch is imported, which importing this
    module did already: when they are missing, this same command line runs again in a fresh interpreter with them
    set (a Snakemake job has them from the Snakefile's prefix). Called in-process (``main(argv)``) it refuses
    instead. Then deterministic algorithms as the preset says (harness/config/kernels.py)."""
    from harness.config.kernels import apply_cpu_kernels, missing_kernel_env

    missing = missing_kernel_env(cpu_kernels)
    if missing and args.command_line is None:
        raise ConfigError(f"cpu_kernels=pinned needs {missing} in the environment before torch is imported; export "
                          "them, or run the `harness` command")
    if missing:
        print(f"harness {args.command}: cpu_kernels=pinned: starting again with {missing}", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "harness.cli", *args.command_line],
                  {**os.environ, **missing})
    apply_cpu_kernels(cpu_kernels)


def cmd_data(args) -> None:
    from harness.data.prepare import prepare_data  # pure Python: no torch or transformers in this job

    resolved, paths = _resolve(args)
    mark_startup("data")
    files = prepare_data(resolved, paths)
    print(f"data for sweep {resolved.sweep.name!r}: {files}")


def cmd_warmstart(args) -> None:
    import torch

    from harness.model.warmstart import warmstart

    resolved, paths = _resolve(args)
    _use_cpu_kernels(args, resolved.preset.cpu_kernels)
    torch.set_num_threads(resolved.preset.warmstart.threads)  # warmstart() sets it too; the startup line reports it
    mark_startup("warmstart")
    summary = warmstart(resolved, paths)
    print(f"warm start written to {paths.warmstart_dir}: "
          f"{ {k: v for k, v in summary.items() if not isinstance(v, list)} }")


def cmd_train(args) -> None:
    import torch

    import harness.train.trl.trainer  # noqa: F401  (TRL: imported by run_training anyway; counted as start-up here)
    from harness.train.run import run_training

    resolved, paths = _resolve(args)
    spec = _method_spec(args, resolved)
    _use_cpu_kernels(args, resolved.preset.cpu_kernels)
    torch.set_num_threads(resolved.preset.train.threads)  # run_training sets it too; the startup line reports it
    mark_startup("train")
    record = run_training(resolved, spec, args.seed, paths)
    if record is not None:  # the main process of a distributed run
        print(f"trained {spec.label} seed {args.seed}: {record['budget']['spent_steps']} steps, "
              f"{record['train_seconds']:.1f} s")


def cmd_fetch(args) -> None:
    from harness.ops.fetch import fetch_checkpoint

    resolved, paths = _resolve(args)
    spec = _method_spec(args, resolved)
    mark_startup("fetch")
    record = fetch_checkpoint(resolved, spec, args.seed, paths)
    print(f"fetched {spec.checkpoint} as {spec.label} seed {args.seed}: {record['external']['files_sha256']}")


def cmd_eval(args) -> None:
    import torch

    from harness.evaluation.driver import evaluate_benchmark, import_eval_stack, load_checkpoint
    from harness.model.checkpoints import check_model_dir
    from harness.train.trackers import (
        check_trackers,
        checkpoint_step,
        eval_scalars,
        log_eval_scores,
        tracker_run_name,
    )

    resolved, paths = _resolve(args)
    _use_cpu_kernels(args, resolved.preset.cpu_kernels)
    torch.set_num_threads(resolved.preset.eval.threads)
    benchmarks = resolved.preset.eval.benchmarks
    names = sorted(benchmarks) if args.bench == ["all"] else args.bench
    unknown = sorted(set(names) - set(benchmarks))
    if unknown:
        raise ConfigError(f"--bench {unknown} not benchmarks of sweep {resolved.sweep.name!r}; "
                          f"allowed: {sorted(benchmarks)} or 'all'")
    ckpts = list(dict.fromkeys(args.ckpt))
    if args.model_dir and len(ckpts) > 1:
        raise ConfigError(f"--model-dir evaluates one model; got {len(ckpts)} checkpoints {ckpts}")
    model_dirs = {ckpt: Path(args.model_dir) if args.model_dir else paths.checkpoint_dir(args.label, args.seed, ckpt)
                  for ckpt in ckpts}
    for model_dir in model_dirs.values():
        check_model_dir(model_dir)
    # a sweep run's checkpoints (not the warm start, a released model, or --out / --model-dir): their scores go to
    # the run's trackers at the step each was saved at (harness/train/trackers.py); what cannot log fails here
    train = resolved.preset.train
    steps = {} if args.out or args.model_dir else {
        ckpt: step for ckpt in ckpts
        if (step := checkpoint_step(paths.run_file(args.label, args.seed), ckpt)) is not None}
    if steps:
        check_trackers(train.report_to, train.wandb_mode)
    import_eval_stack(resolved.preset.eval.backend)
    mark_startup("eval")
    # One process for every checkpoint of a run and every benchmark: the imports happen once, a checkpoint's model
    # (vLLM: its engine) and tokenizer are loaded once for its benchmarks and released before the next checkpoint's;
    # each (checkpoint, benchmark) is its own lm-eval run, seeded the same way as in a process of its own.
    for ckpt, model_dir in model_dirs.items():
        loaded = load_checkpoint(model_dir, resolved.preset.eval)
        scores = {}
        for name in names:
            bench = benchmarks[name]
            data_file = paths.benchmark_data_file(bench.file)
            if args.out:
                out_dir = Path(args.out) / (ckpt if len(ckpts) > 1 else "") / name
            else:
                out_dir = paths.eval_dir(args.label, args.seed, ckpt, name)
            results = evaluate_benchmark(model_dir, name, bench, data_file, resolved.preset.eval,
                                         resolved.preset.prompt_template, out_dir, loaded=loaded)
            shown = {k: round(v, 4) for k, v in results["metrics"].items() if isinstance(v, float)}
            print(f"{name} on {model_dir}: {shown}", flush=True)
            scores[name] = results
        loaded.release()
        if ckpt in steps:
            logged = log_eval_scores(train.report_to, paths.run_dir(args.label, args.seed),
                                     tracker_run_name(resolved.sweep.name, args.label, args.seed), ckpt, steps[ckpt],
                                     eval_scalars(scores, mean=set(names) == set(benchmarks)), train.wandb_mode)
            for line in logged:
                print(f"{ckpt} scores at step {steps[ckpt]}: {line}", flush=True)


def cmd_report(args) -> None:
    from harness.report.leaderboard import write_leaderboard

    resolved, paths = _resolve(args)
    mark_startup("report")
    written = write_leaderboard(resolved, paths)
    print("wrote " + ", ".join(str(p) for p in written))


def cmd_summarize(args) -> None:
    from harness.report.across_sweeps import write_summary

    written = write_summary([Path(folder) for folder in args.folders], Path(args.out))
    print("wrote " + ", ".join(str(p) for p in written))


def cmd_plan(args) -> None:
    from harness.config.code_digests import stale_results
    from harness.config.paths import WARMSTART_LABEL
    from harness.ops.resources import format_plan, plan_memory_problems
    from harness.report.plan_power import plan_power_lines

    resolved, paths = _resolve(args)  # refuses a preset whose GPU jobs do not fit (harness/config/rules.py)
    print(format_plan(resolved))
    stale = stale_results(paths, [*resolved.sweep.methods, WARMSTART_LABEL])
    if stale:
        print("\nfinished results from other code (kept, not rerun; delete a result's folder to recompute it):",
              *stale, sep="\n  ")
    # sizing before spending: the effect the seeds detect, the seeds each claim needs (a shortfall reads
    # 'underpowered:', not 'warning:': it makes no job fail)
    lines, underpowered = plan_power_lines(resolved)
    print("\n".join(["", *lines, *underpowered]))
    problems = plan_memory_problems(resolved)  # also a reference model a method's needs add
    if problems:
        raise ConfigError(f"{resolved.source}: " + "; ".join(problems))


def cmd_power(args) -> None:
    from harness.report.power import power_report, read_pilot
    from harness.report.reported import load_reported
    from harness.report.verdicts import DEFAULT_CLAIM_POINTS, claim_effects

    resolved, paths = _resolve(args)
    pilot = read_pilot(Path(args.pilot) if args.pilot else paths.root)
    reported = load_reported(CONFIG_DIR / "reported" / f"{resolved.sweep.name}.yaml")
    effects = args.effect or claim_effects(reported.claims if reported else []) or [DEFAULT_CLAIM_POINTS]
    pairs = [tuple(pair.split(",", 1)) for pair in args.pair] if args.pair else [None, *pilot.aa_pairs()]
    print(power_report(pilot, pairs, effects, resolved))


def cmd_calibrate(args) -> None:
    from harness.config.paths import checkpoint_name
    from harness.data.files import write_json_atomic
    from harness.report.calibration import calibration_file, calibration_summary
    from harness.report.evidence import BASELINE_METHOD, baseline_scores

    resolved, paths = _resolve(args)
    preset = resolved.preset
    ckpt = checkpoint_name(max(preset.train.budget.checkpoint_fractions))
    seeds = list(range(args.seeds))
    scores = baseline_scores(resolved, paths, seeds, ckpt)
    record = calibration_summary(scores, preset.name, BASELINE_METHOD, seeds, ckpt, avg_at(preset.eval.k))
    path = write_json_atomic(Path(args.out) if args.out else calibration_file(preset.name), record)
    print(f"wrote {path}: " + ", ".join(f"{scope} training-noise sd {100 * n['variance'] ** 0.5:.2f} pts "
                                       f"({n['df']:g} df)" for scope, n in record["training_noise"].items()))


def cmd_extend_seeds(args) -> None:
    from harness.config.loading import dump_yaml
    from harness.data.files import write_text_atomic
    from harness.report.stages import next_stage

    # the next stage's file is this sweep YAML with other labels and seeds: what it does not hold would be lost
    if is_snapshot(args.sweep) or args.overrides:
        given = f"the resolved snapshot {args.sweep}" if is_snapshot(args.sweep) else ""
        given += f" --set {' '.join(args.overrides)}" if args.overrides else ""
        raise ConfigError(f"extend-seeds writes the next stage from the sweep YAML as written: pass that file, not "
                          f"{given.strip()} (put overrides in the YAML)")
    resolved, paths = _resolve(args)
    stage = next_stage(resolved, paths, Path(args.sweep), args.first, args.add, args.max_seeds)
    result = stage.look
    print(f"look at {result.n_seeds} seeds of the schedule {stage.schedule}: nominal one-sided level "
          f"{result.level:.2e} per test")
    for v in result.decided:
        print(f"  decided: {v.claim.describe()}: {v.verdict} ({v.reason})")
    if stage.sweep is None:
        print("no stage to add: " + ("the last look" if result.next_seeds is None else "every claim is decided"))
        return
    out = Path(args.out) if args.out else paths.root / f"stage-{result.next_seeds}-seeds.yaml"
    write_text_atomic(out, dump_yaml(stage.sweep))
    methods = stage.sweep["methods"]
    print(f"wrote {out}: {methods} with seeds 0..{result.next_seeds - 1}; run it with\n"
          f"  snakemake --cores all --configfile {out}\nthen `harness extend-seeds --sweep {out} --first {args.first} "
          f"--add {args.add} --max-seeds {args.max_seeds}` for the next look")


def cmd_inspect(args) -> None:
    from harness.ops.inspect_batch import inspect_batch

    output = inspect_batch(args.method, Path(args.batch), Path(args.out), args.overrides)
    print(f"wrote {args.out}")
    if output["non_finite"]:
        shown = ", ".join(output["non_finite"][:5]) + (", ..." if len(output["non_finite"]) > 5 else "")
        print(f"harness inspect: {len(output['non_finite'])} NaN or infinite values written as null ({shown}); "
              f"check the batch's rewards and log-probs", file=sys.stderr)


def cmd_new_method(args) -> None:
    from harness.ops.scaffold import scaffold_method

    for path in scaffold_method(args.name):
        print(f"created {path}")


def cmd_verify(args) -> None:
    from harness.ops.verify import read_run, verify_run

    record, _, _ = read_run(Path(args.run))
    # the replay runs the kernels the run was recorded with (runs recorded before the setting ran native ones)
    _use_cpu_kernels(args, record["config"]["preset"].get("cpu_kernels", "native"))
    verdict = verify_run(Path(args.run), Path(args.out), args.steps)
    print(verdict.describe())
    if not verdict.identical:
        raise SystemExit(1)


def cmd_progress(args) -> None:
    from harness.ops.progress import format_progress, sweep_progress

    resolved, paths = _resolve(args)
    print(format_progress(sweep_progress(resolved, paths)))


def cmd_prefetch(args) -> None:
    from harness.ops.prefetch import prefetch

    resolved, _ = _resolve(args)
    prefetch(resolved)


def cmd_rehearse(args) -> None:
    from harness.ops.rehearsal import rehearse

    labels = args.labels.split(",") if args.labels else None
    failed = [sweep for sweep in args.sweeps
              if rehearse(Path(sweep), Path(args.out), args.mode, args.cores, labels=labels)]
    if failed:
        raise SystemExit(f"harness rehearse: {len(failed)} of {len(args.sweeps)} rehearsals failed: {failed}")


DESCRIPTION = """\
Reproducibility harness for token-targeting RLVR methods: each command does one
step of a sweep (the Snakefile chains them) or reads its results."""
EPILOG = """\
Each command's --help says what it reads and writes and which document holds its
formats (paths in the checkout):
  README.md                  quickstart, the results folder, adding a method
  docs/statistics.md         report, summarize, power, calibrate, extend-seeds
  docs/cluster.md            plan, progress, rehearse, fetch, prefetch: clusters
  docs/performance.md        plan: where the time goes
  docs/config-reference.md   every --set key, its default and allowed values
  docs/protocol.md           train, eval: the training step and the evaluation
  docs/budgets.md            train: matched compute budgets
  docs/reproducibility.md    verify, progress: resume, determinism, run records
  docs/inspect.md            inspect: the batch format"""


class SubcommandHelpFormatter(argparse.HelpFormatter):
    """Wraps a command's help without breaking a path at a hyphen (docs/config-reference.md)."""

    def _fill_text(self, text, width, indent):
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse sizes the help column without a subcommand's own indent, so the longest name (extend-seeds) would sit
    on a line of its own with its help below: count the indent, so every command is one line."""

    def add_argument(self, action):
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            longest = max((len(self._format_action_invocation(a)) for a in action._get_subactions()), default=0)
            self._action_max_length = max(self._action_max_length, longest + self._current_indent + 2)


def _subcommand(sub, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand: ``summary`` is its one line in ``harness --help``, ``description`` heads its own help and names
    the document that holds its formats."""
    return sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {description}",
                          formatter_class=SubcommandHelpFormatter)


@dataclass(frozen=True)
class Command:
    """One subcommand: ``summary`` is its line in ``harness --help``; ``description`` heads its own help and names
    the document of its formats; ``sweep``: it takes ``--sweep`` and ``--set``; ``arguments``: its own, as
    ``arg(...)`` gives them (``add_argument``'s parameters)."""

    name: str
    summary: str
    description: str
    func: Callable[[argparse.Namespace], None]
    sweep: bool = True
    arguments: tuple[tuple[tuple, dict], ...] = ()


def arg(*flags: str, **options) -> tuple[tuple, dict]:
    return flags, options


COMMANDS = (
    Command("data", "write the sweep's data folder",
            "train.jsonl (synthetic, a shipped JSONL after its checksum is verified, or a hub dataset at its "
            "pinned commit) and, with synthetic data, the benchmark splits, with SHA256SUMS (the `data` keys: "
            "docs/config-reference.md).",
            cmd_data, sweep=True),
    Command("warmstart", "build the starting policy once per sweep",
            "Supervised warm start of the preset's model (docs/reproducibility.md).",
            cmd_warmstart, sweep=True),
    Command("train", "train one label with one seed under the budget",
            "Writes runs/<label>/seed<N>/: run.json, metrics.jsonl and a checkpoint at each budget fraction "
            "(README.md, 'Reading the results'; budgets: docs/budgets.md; the step: docs/protocol.md).",
            cmd_train, sweep=True, arguments=(
                arg("--method", required=True, help="method label: configs/method/<label>.yaml"),
                arg("--seed", type=int, required=True),
            )),
    Command("fetch", "save a released checkpoint as an eval-only run",
            "A label whose config names a `checkpoint:` is fetched instead of trained (docs/cluster.md, the "
            "published-checkpoints sweep).",
            cmd_fetch, sweep=True, arguments=(
                arg("--method", required=True, help="method label whose config names a checkpoint"),
                arg("--seed", type=int, required=True),
            )),
    Command("eval", "evaluate a run's checkpoints on the benchmarks",
            "Writes eval/<label>/seed<N>/<ckpt>/<bench>/results.json and samples.jsonl (README.md, 'Reading "
            "the results'; the protocol: docs/protocol.md).",
            cmd_eval, sweep=True, arguments=(
                arg("--bench", nargs="+", default=["all"], help="benchmark names of the preset, or 'all'"),
                arg("--label", default="warmstart", help="method label of the run (or 'warmstart')"),
                arg("--seed", default="0"),
                arg("--ckpt", nargs="+", default=["ckpt-100"],
                    help="checkpoint names of the run (ckpt-050 ckpt-100 ...), evaluated in this order in one process"),
                arg("--model-dir", help="evaluate this model directory instead of a run's checkpoint (one --ckpt)"),
                arg("--out", help="output directory, one sub-directory per benchmark, under one per checkpoint when "
                                  "there are several (default: the sweep's paths)"),
            )),
    Command("report", "write a sweep's leaderboard and report.html",
            "Writes leaderboard.md, .csv, .json, leaderboard_runs.csv, report.html and figures/ (columns: "
            "README.md, 'Reading the results'; intervals and verdicts: docs/statistics.md).",
            cmd_report, sweep=True),
    Command("summarize", "one page across sweeps: Δ forest plot, claims",
            "Reads each sweep result folder's leaderboard.json (and lists what a partial sweep lacks); writes "
            "summary.md, summary.html, summary.json and forest.png/.svg (docs/statistics.md, 'Across "
            "sweeps').",
            cmd_summarize, sweep=False, arguments=(
                arg("folders", nargs="+", metavar="FOLDER", help="sweep result folders, e.g. results/example"),
                arg("--out", default="results/summary", help="output folder (default: %(default)s)"),
            )),
    Command("plan", "job counts and GPU-hours of a sweep",
            "From its budget and resources, before anything runs (docs/cluster.md; the cost model: "
            "docs/performance.md).",
            cmd_plan, sweep=True),
    Command("power", "seeds needed to detect an effect, from a pilot",
            "The seeds (and GPU-hours) a claim needs, from a finished pilot sweep (docs/statistics.md, "
            "'harness power').",
            cmd_power, sweep=True, arguments=(
                arg("--pilot", help="a finished sweep's results folder (default: this sweep's), e.g. results/example"),
                arg("--pair", action="append", metavar="LABEL,BASELINE",
                    help="difference to size (repeatable; default: an A/A pair pooled over all labels, and the pilot's "
                         "own A/A pairs)"),
                arg("--effect", type=float, action="append", metavar="POINTS",
                    help="effect to detect, in points (repeatable; default: the claims of "
                         "configs/reported/<sweep>.yaml, else 2)"),
            )),
    Command("calibrate", "the preset's A/A training noise",
            "From the baseline's calibration seeds, which `snakemake calibrate` runs first; writes "
            "configs/calibration/<preset>.json (docs/statistics.md, 'The A/A calibration of a preset').",
            cmd_calibrate, sweep=True, arguments=(
                arg("--seeds", type=int, default=8, help="seeds 0..N-1 of the baseline (default: %(default)s)"),
                arg("--out", help="output JSON (default: configs/calibration/<preset>.json)"),
            )),
    Command("extend-seeds", "the next stage of seeds for claims still open",
            "Group-sequential stages: decides the claims this stage settles and writes the next stage's sweep "
            "for the labels still open (docs/statistics.md, 'harness extend-seeds').",
            cmd_extend_seeds, sweep=True, arguments=(
                arg("--first", type=int, required=True, help="seeds of the first stage"),
                arg("--add", type=int, required=True, help="seeds added per stage"),
                arg("--max-seeds", type=int, required=True, help="seeds of the last stage"),
                arg("--out", help="the next stage's sweep file (default: results/<sweep>/stage-<seeds>-seeds.yaml)"),
            )),
    Command("rehearse", "run a paper sweep's DAG at CPU scale, check it",
            "The sweep's own DAG, launcher, precision, loss and evaluation at CPU scale, with a kill and "
            "resume (docs/cluster.md, 'Rehearse first').",
            cmd_rehearse, sweep=False, arguments=(
                arg("sweeps", nargs="+", help="paper sweep files, e.g. configs/sweeps/paper-ktae.yaml"),
                arg("--out", default="results/rehearsal", help="results folder of the rehearsals (default: "
                                                               "%(default)s)"),
                arg("--cores", type=int, default=2, help="snakemake --cores (default: %(default)s)"),
                arg("--mode", choices=("cpu", "vllm-cpu", "cuda"), default="cpu",
                    help="cpu: 2 accelerate processes, transformers rollouts (default); vllm-cpu: vLLM's CPU build "
                         "in one training process; cuda: one GPU with the preset's colocated vLLM"),
                arg("--labels", help="only these of each sweep's methods, comma-separated, e.g. uniform,nat (default: "
                                     "all)"),
            )),
    Command("verify", "replay a recorded run's first steps here",
            "Reports the first divergence or bit-identical; exit status 1 when it diverges "
            "(docs/reproducibility.md, 'Checking a result on your own machine').",
            cmd_verify, sweep=False, arguments=(
                arg("run", help="a run folder holding run.json and metrics.jsonl, e.g. "
                                "results/example/runs/uniform/seed0"),
                arg("--steps", type=int, default=8, help="optimizer steps to replay (default: %(default)s, all the "
                                                         "steps a run records digests of)"),
                arg("--out", default="results/verify", help="where the data, warm start and replay are built "
                                                            "(reused by later verifications; default: %(default)s)"),
            )),
    Command("progress", "a sweep's training jobs: done, running, ETA",
            "Done, running (budget %, step, ETA) or pending (docs/reproducibility.md, 'Progress of a "
            "running sweep').",
            cmd_progress, sweep=True),
    Command("prefetch", "download a sweep's hub models and data for offline jobs",
            "On a node with hub access (the login node): every model, tokenizer, dataset and released "
            "checkpoint of the sweep at its pinned revision into the hub cache (HF_HUB_CACHE), with the commit "
            "each resolved to and, for an unpinned one, the line that pins it; the jobs then run with "
            "HF_HUB_OFFLINE=1 (docs/cluster.md, 'Login node and compute nodes').",
            cmd_prefetch, sweep=True),
    Command("inspect", "a method's token weights on a batch file",
            "Runs the method's hooks on a batch and writes its weights (the batch format: docs/inspect.md).",
            cmd_inspect, sweep=False, arguments=(
                arg("method", help="method label (configs/method/<label>.yaml) or registered name"),
                arg("--batch", required=True, help="input batch JSON (format: docs/inspect.md)"),
                arg("--out", required=True, help="output JSON"),
                arg("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a method Config field (rho=0.1) or a step setting (ctx.aggregation=...)"),
            )),
    Command("new-method", "scaffold a new method, its config and test",
            "Writes methods/<name>.py, configs/method/<name>.yaml and tests/methods/test_<name>.py "
            "(README.md, 'Adding a method'; docs/methods.md).",
            cmd_new_method, sweep=False, arguments=(
                arg("name"),
            )),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action=VersionAction, help="print the package version and git commit, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for command in COMMANDS:
        p = _subcommand(sub, command.name, command.summary, command.description)
        if command.sweep:
            _sweep_args(p)
        for flags, options in command.arguments:
            p.add_argument(*flags, **options)
        p.set_defaults(func=command.func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = sys.argv[1:] if argv is None else None  # what _use_cpu_kernels runs again
    from harness.model.hub import cache_miss, hub_setting, restore_hub_setting

    hub_before = hub_setting()
    try:
        args.func(args)
    except ConfigError as exc:
        print(f"harness {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        if miss := cache_miss(exc):  # a job offline whose model or data was not prefetched: the prefetch to run
            message = miss.for_sweep(getattr(args, "sweep", None))
        print(f"harness {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        if argv is not None:  # called in-process: the caller's hub setting as it was (a job process just ends)
            restore_hub_setting(hub_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
