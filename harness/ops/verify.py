"""``harness verify``: replay the first optimizer steps of a recorded run on this machine and say where it diverges.

A run's ``run.json`` holds everything the replay needs: the resolved configuration, the seeds, the sha256 of its
training data and of its warm start, and the digests of its first steps (``harness.train.budget.RunDigests``:
the rollout chain and the weights after each step); its ``metrics.jsonl`` holds each step's logged numbers. The
replay regenerates the data and rebuilds the warm start from the recorded configuration (both are deterministic
for the synthetic data and char_llama of the CPU presets; reused when the replay folder already holds them with
the recorded digests), trains the first steps in a fresh trainer, and compares step by step: the data, the warm
start, then per step the rollout digest, the weight digest and every logged number but the timings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.config.loading import merge_config
from harness.config.paths import SweepPaths
from harness.config.schema import MethodSpec, PresetConfig, Resolved, SweepConfig
from harness.config.snapshot import method_spec
from harness.data.files import sha256_file, write_text_atomic

# logged numbers that measure time, not what was computed: never compared
TIMING_KEYS = ("seconds/", "time/", "step_time", "budget/accel_seconds_total")


@dataclass
class Verdict:
    """The outcome: ``identical`` over ``steps`` steps, else the first step that differs (0: before training, the
    data or the warm start), what differs there, and the largest differences of the logged numbers at that step
    (name -> [recorded, replayed, |difference|], largest first)."""

    identical: bool
    steps: int
    first_step: int | None = None
    differs: list[str] = field(default_factory=list)
    metric_differences: dict[str, list[float]] = field(default_factory=dict)
    recorded_on: dict = field(default_factory=dict)
    replayed_on: dict = field(default_factory=dict)

    def describe(self) -> str:
        machines = (f"recorded on {_machine(self.recorded_on)}\nreplayed on {_machine(self.replayed_on)}\n")
        if self.identical:
            return machines + (f"bit-identical: the first {self.steps} steps' rollouts, weights and logged numbers "
                               "match the record")
        if self.first_step == 0:
            return machines + f"diverges before the first step: the {self.differs[0]} differs from the record"
        lines = [f"first divergence at step {self.first_step}: {', '.join(self.differs)} differ"]
        for name, (recorded, replayed, difference) in list(self.metric_differences.items())[:5]:
            lines.append(f"  {name}: recorded {recorded!r}, replayed {replayed!r}, |difference| {difference:.3g}")
        if not self.metric_differences:
            lines.append("  every logged number of that step still matches")
        return machines + "\n".join(lines)


def _machine(provenance: dict) -> str:
    hardware, kernels = provenance.get("hardware", {}), provenance.get("kernels", {})
    versions = provenance.get("versions", {})
    return (f"{hardware.get('cpu_model', hardware.get('processor', '?'))}, torch {versions.get('torch', '?')}, "
            f"kernels {kernels.get('cpu_kernels', '?')} (torch dispatch {kernels.get('torch_cpu_capability', '?')}), "
            f"{_lock(provenance)}")


def _lock(provenance: dict) -> str:
    """Which lock file the packages matched (harness/config/package_lock.py), in words."""
    if "lock" not in provenance:
        return "package lock not recorded"
    if provenance["lock"]:
        return f"packages of {provenance['lock']['file']} (sha256 {provenance['lock']['sha256'][:12]})"
    closest = provenance.get("lock_closest")
    return "packages of no lock" + (f" ({len(closest['differs'])} differ from {closest['file']})" if closest else "")


def read_run(run: Path) -> tuple[dict, list[dict], Path]:
    """run.json (``run`` is it or its folder) and its metrics.jsonl records; clear errors for what verify needs."""
    run_file = run if run.name == "run.json" else run / "run.json"
    if not run_file.is_file():
        raise FileNotFoundError(f"{run_file}: no run.json (harness verify takes a run folder, e.g. "
                                "results/example/runs/uniform/seed0)")
    record = json.loads(run_file.read_text())
    if "external" in record:
        raise ValueError(f"{run_file}: a released checkpoint (fetched, not trained here): nothing to replay")
    if not record.get("digests", {}).get("first_steps"):
        raise ValueError(f"{run_file}: key 'digests.first_steps' is missing: the run was recorded before runs "
                         "carried digests; train it again to verify it")
    metrics_file = run_file.with_name("metrics.jsonl")
    if not metrics_file.is_file():
        raise FileNotFoundError(f"{metrics_file}: the run's per-step numbers are needed beside its run.json")
    metrics = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return record, metrics, run_file


def recorded_sweep(record: dict, origin: str, results_dir: Path) -> tuple[Resolved, MethodSpec]:
    """The recorded configuration and method label, with the results folder moved to ``results_dir``."""
    config = record["config"]
    sweep = merge_config(SweepConfig, [(origin, {**config["sweep"], "results_dir": str(results_dir)})])
    preset = merge_config(PresetConfig, [(f"{origin} (config.preset)", config["preset"])])
    method = record["method"]
    spec = method_spec(method["label"], {"method": method["name"], "params": method["params"],
                                         "seed_offset": record["run_seed"] - record["seed"], "checkpoint": None},
                       origin)
    return Resolved(sweep, preset, origin, {spec.label: spec}), spec


def metric_differences(recorded: dict, replayed: dict) -> dict[str, list[float]]:
    """Logged numbers of one step that differ (timings aside), largest |difference| first; a number logged on one
    side only counts as infinitely different."""
    out = {}
    for name in sorted(set(recorded) | set(replayed)):
        if name.startswith(TIMING_KEYS):
            continue
        a, b = recorded.get(name), replayed.get(name)
        if a != b:
            numeric = isinstance(a, int | float) and isinstance(b, int | float)
            out[name] = [a, b, abs(a - b) if numeric else float("inf")]
    return dict(sorted(out.items(), key=lambda item: -item[1][2]))


def compare_steps(recorded: list[dict], replayed: list[dict], recorded_metrics: list[dict],
                  replayed_metrics: list[dict]) -> tuple[int, list[str], dict] | None:
    """The first step whose digests or logged numbers differ: (step, what differs, metric differences)."""
    by_step = {m["step"]: m for m in recorded_metrics}
    replayed_by_step = {m["step"]: m for m in replayed_metrics}
    for want, got in zip(recorded, replayed, strict=False):
        step = want["step"]
        differs = [name for name, key in (("rollouts", "rollouts_sha256"), ("weights", "weights_sha256"))
                   if want[key] != got[key]]
        numbers = metric_differences(by_step.get(step, {}), replayed_by_step.get(step, {}))
        if numbers:
            differs.append("logged numbers")
        if differs:
            return step, differs, numbers
    return None


def verify_run(run: Path, out: Path, steps: int) -> Verdict:
    """Replay the first ``steps`` steps of the run recorded in ``run`` under ``out`` and compare them."""
    from harness.config.kernels import kernels_in_effect
    from harness.config.package_lock import lock_provenance
    from harness.config.provenance import hardware, package_versions
    from harness.data.prepare import prepare_data
    from harness.model.warmstart import warmstart
    from harness.train.run import build_trainer, warmstart_sha256

    record, metrics, run_file = read_run(run)
    recorded_steps = record["digests"]["first_steps"]
    if steps > len(recorded_steps):
        raise ValueError(f"--steps {steps}: {run_file} records digests of its first {len(recorded_steps)} steps")
    resolved, spec = recorded_sweep(record, str(run_file), out)
    paths = SweepPaths(resolved.results_dir)
    here = {"hardware": hardware(), "versions": package_versions(), **lock_provenance(),
            "kernels": kernels_in_effect(resolved.preset.cpu_kernels)}
    verdict = Verdict(identical=False, steps=steps, recorded_on=record["provenance"], replayed_on=here)
    prepare_data(resolved, paths)
    if sha256_file(paths.data_dir / "train.jsonl") != record["provenance"]["data_sha256"]["train"]:
        verdict.first_step, verdict.differs = 0, ["training data"]
        return verdict
    if not paths.warmstart_file.is_file() or warmstart_sha256(paths.warmstart_dir) != record["warmstart_sha256"]:
        warmstart(resolved, paths)
        if warmstart_sha256(paths.warmstart_dir) != record["warmstart_sha256"]:
            verdict.first_step, verdict.differs = 0, ["warm start"]
            return verdict
    replay_dir = paths.run_dir(spec.label, record["seed"])
    replay_dir.mkdir(parents=True, exist_ok=True)
    (replay_dir / "metrics.jsonl").unlink(missing_ok=True)
    trainer = build_trainer(resolved, spec, record["seed"], paths, replay_dir, checkpoint_dirs={},
                            metrics_path=replay_dir / "metrics.jsonl",
                            sample_batch_path=replay_dir / "sample_batch.json")
    trainer.args.max_steps = steps
    trainer.train()
    replayed_metrics = [json.loads(line) for line in (replay_dir / "metrics.jsonl").read_text().splitlines()]
    replayed = trainer.accounting.digests.first_steps
    write_text_atomic(replay_dir / "verify.json", json.dumps({"first_steps": replayed}, indent=1))
    divergence = compare_steps(recorded_steps[:steps], replayed, metrics, replayed_metrics)
    if divergence is None:
        verdict.identical = True
    else:
        verdict.first_step, verdict.differs, verdict.metric_differences = divergence
    return verdict
