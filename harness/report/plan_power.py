"""Sizing before spending: the lines ``harness plan`` prints beside the GPU-hours, from a preset's prior
(``configs/priors/<preset>.yaml``, format in configs/priors/README.md) instead of a pilot sweep.

Per scope (the mean over the sweep's benchmarks, or one benchmark) the prior gives the variance components of a
paired difference (``power.prior_components``): per benchmark its problems (the benchmark file's rows, or
``data.synthetic.n_eval`` / ``n_ood`` for a generated one, capped by ``limit``), the baseline's accuracy p (the
paper's reported number for the baseline label in configs/reported/<sweep>.yaml, else uniform's there, else the
prior's), the sampling part 2 p (1 - p) / k (k = ``eval.k``, 1 for a greedy claim) and the method x problem
interaction (the prior's sd in logits; 0 for two labels of one method); the training noise of a paired difference
from the preset's A/A calibration (configs/calibration/<preset>.json) where it fits the sweep's benchmarks and
problem counts, as the report pools it, else the prior's (an assumption where no measurement exists). The
detectable effect and the seeds needed are ``power.detectable_effect`` and ``power.seeds_needed`` on those
components, the seed part pooled over the sweep's trained labels as the report pools it (its moderation toward a
pair's own seeds, which acts only where the labels' noise differs, is not foreseen). What the prior assumes is
printed with the detectable effect at half and twice its size. docs/statistics.md, 'Sizing a sweep before running
it'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config.paths import CONFIG_DIR, REPO_ROOT, resolve_repo_path
from harness.config.schema import ConfigError, PresetConfig, Resolved
from harness.data.score_names import GREEDY, avg_at
from harness.ops.resources import released_checkpoints
from harness.report import power
from harness.report.calibration import Calibration, calibration_file, load_calibration
from harness.report.reported import Reported, load_reported
from harness.report.verdicts import DEFAULT_BASELINE, MEAN, PARITY_POWER, Claim, default_claims

PRIOR_DIR = CONFIG_DIR / "priors"
PRIOR_KEYS = {"preset", "accuracy", "training_noise", "interaction"}
SEED_COUNTS = (5, 10)  # more seeds the detectable effect is printed at, beside the sweep's own
SENSITIVITY = (0.5, 2.0)  # an assumed sd is also tried at these multiples


@dataclass(frozen=True)
class Prior:
    """A preset's prior: the baseline's accuracy per benchmark (percent; where the paper reports none), the sd of a
    paired difference's training noise on the benchmark mean (points) and of the method x problem interaction
    (logits), each with its source."""

    path: Path
    preset: str
    accuracy: dict[str, float]
    accuracy_source: str
    noise_sd: float
    noise_source: str
    interaction_sd: float
    interaction_source: str


def prior_file(preset: str) -> Path:
    return PRIOR_DIR / f"{preset}.yaml"


def _section(path: Path, raw: dict, key: str, value_key: str) -> tuple[object, str]:
    """(value, source) of a ``{<value_key>: ..., source: text}`` section; errors name the file and the key."""
    section = raw.get(key)
    if not isinstance(section, dict) or set(section) != {value_key, "source"}:
        raise ConfigError(f"{path}: key '{key}' must map exactly '{value_key}' and 'source'")
    if not isinstance(section["source"], str) or not section["source"].strip():
        raise ConfigError(f"{path}: key '{key}.source' must say where the number comes from (or that it is assumed)")
    return section[value_key], section["source"].strip()


def _number(path: Path, key: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{path}: key '{key}': {value!r} is not a number in [{low:g}, {high:g}]")
    return float(value)


def load_prior(path: Path) -> Prior | None:
    """The prior at ``path``, or None when there is none; a malformed file raises naming the key."""
    import yaml

    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or set(raw) != PRIOR_KEYS:
        raise ConfigError(f"{path}: the top level must map exactly {sorted(PRIOR_KEYS)}")
    percent, accuracy_source = _section(path, raw, "accuracy", "percent")
    if not isinstance(percent, dict):
        raise ConfigError(f"{path}: key 'accuracy.percent' must map benchmark -> percent")
    accuracy = {str(b): _number(path, f"accuracy.percent.{b}", v, 0, 100) for b, v in percent.items()}
    noise, noise_source = _section(path, raw, "training_noise", "sd")
    interaction, interaction_source = _section(path, raw, "interaction", "logit_sd")
    return Prior(path, str(raw["preset"]), accuracy, accuracy_source,
                 _number(path, "training_noise.sd", noise, 0, 100), noise_source,
                 _number(path, "interaction.logit_sd", interaction, 0, 10), interaction_source)


def benchmark_problems(preset: PresetConfig) -> dict[str, int]:
    """Problems per benchmark of ``eval.benchmarks``: the file's non-blank rows, or for a file the sweep generates
    (``{data_dir}/eval.jsonl`` / ``ood.jsonl``) ``data.synthetic.n_eval`` / ``n_ood``; capped by ``limit``. A
    benchmark whose count cannot be known before the sweep raises naming it."""
    counts = {}
    for name, bench in preset.eval.benchmarks.items():
        if "{data_dir}" in bench.file:
            split = Path(bench.file).stem
            if preset.data.kind not in ("synthetic", "mixed") or split not in ("eval", "ood"):
                raise ValueError(f"eval.benchmarks.{name}: {bench.file} is generated by the sweep; its problems are "
                                 "not known before it runs")
            total = getattr(preset.data.synthetic, f"n_{split}")
        else:
            with resolve_repo_path(bench.file).open(encoding="utf-8") as rows:
                total = sum(1 for line in rows if line.strip())
        counts[name] = min(total, bench.limit) if bench.limit > 0 else total
    return counts


@dataclass(frozen=True)
class Noise:
    """The training noise a sizing uses: variance of a paired difference (fraction^2) on its scope, the degrees of
    freedom the report adds to the sweep's own (an A/A calibration's; 0 for an assumption), and where it comes
    from; ``assumed`` when it is not a measurement of this preset."""

    variance: float
    external_df: float
    source: str
    assumed: bool


def scope_noise(scope: Sequence[str], n_problems: Mapping[str, int], prior: Prior,
                calibration: Calibration | None) -> Noise | None:
    """The calibration's noise for ``scope`` where it fits the sweep (the same benchmarks and problems: the report's
    rule, ``Calibration.mismatch``), else the prior's for the mean over all benchmarks; None for a single benchmark
    without a calibration (the prior sizes the mean only)."""
    fits = calibration is not None and not calibration.mismatch(n_problems)
    measured = calibration.noise_for(list(scope)) if fits else None
    if measured is not None:
        return Noise(measured.variance, measured.df, f"{calibration.describe()}, {measured.df:g} df", False)
    if sorted(scope) != sorted(n_problems):
        return None
    return Noise((prior.noise_sd / 100) ** 2, 0.0, f"{prior.noise_source}; {_relative(prior.path)}", True)


def baseline_accuracy(benches: Sequence[str], baseline: str, reported: Reported | None,
                      prior: Prior) -> tuple[dict[str, float], dict[str, str]]:
    """Per benchmark the baseline's accuracy (fraction) and where it comes from: the paper's number for ``baseline``,
    else for uniform (configs/reported/<sweep>.yaml), else the prior's; a benchmark with none raises naming it."""
    accuracy, sources = {}, {}
    for bench in benches:
        for label in (baseline, DEFAULT_BASELINE):
            number = reported.get(label, bench) if reported else None
            if number is not None:
                accuracy[bench], sources[bench] = number / 100, f"{_relative(reported.path)}, {label}"
                break
        else:  # no paper number: the prior's
            if bench not in prior.accuracy:
                raise ValueError(f"{_relative(prior.path)}: no accuracy for benchmark {bench!r} (key "
                                 f"accuracy.percent.{bench}) and {baseline!r} has none reported")
            accuracy[bench] = prior.accuracy[bench] / 100
            sources[bench] = f"{_relative(prior.path)}: {prior.accuracy_source}"
    return accuracy, sources


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


# --- the lines of ``harness plan`` --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """Everything a sizing of this sweep reads: its trained labels and seeds, benchmarks, problems and k, the
    prior, the paper's numbers and claims, and the preset's calibration."""

    resolved: Resolved
    labels: list[str]
    n_seeds: int
    n_problems: dict[str, int]
    k: int
    prior: Prior
    reported: Reported | None
    calibration: Calibration | None

    def components(self, baseline: str, scope: Sequence[str], k: int, interaction_sd: float,
                   noise: Noise, noise_scale: float = 1.0) -> power.VarianceComponents:
        """A paired difference against ``baseline`` on ``scope`` (``noise_scale`` multiplies its sd)."""
        accuracy, _ = baseline_accuracy(scope, baseline, self.reported, self.prior)
        return power.prior_components(accuracy, {b: self.n_problems[b] for b in scope}, k,
                                      noise.variance * noise_scale**2, len(self.labels), self.n_seeds,
                                      interaction_sd, noise.external_df)

    def same_method(self, a: str, b: str) -> bool:
        """Two labels of one method with the same parameters (an A/A pair: no method x problem interaction)."""
        spec_a, spec_b = self.resolved.methods.get(a), self.resolved.methods.get(b)
        return spec_a is not None and spec_b is not None and (spec_a.name, spec_a.params) == (spec_b.name,
                                                                                              spec_b.params)


def read_sizing(resolved: Resolved) -> Sizing | str:
    """The sizing of ``resolved``, or why it cannot be sized (a line for the plan)."""
    released = released_checkpoints(resolved)
    labels = [label for label in resolved.sweep.methods if label not in released]
    preset = resolved.preset
    if DEFAULT_BASELINE not in labels:
        return f"power: not sized: the sweep trains no {DEFAULT_BASELINE!r} baseline to pair a method with"
    prior = load_prior(prior_file(preset.name))
    if prior is None:
        return (f"power: not sized: preset {preset.name!r} has no prior ({_relative(prior_file(preset.name))}; "
                "configs/priors/README.md)")
    reported = load_reported(CONFIG_DIR / "reported" / f"{resolved.sweep.name}.yaml")
    try:  # every benchmark needs its problems and the baseline's accuracy (claims fall back to the latter)
        n_problems = benchmark_problems(preset)
        baseline_accuracy(list(n_problems), DEFAULT_BASELINE, reported, prior)
    except ValueError as exc:
        return f"power: not sized: {exc}"
    return Sizing(resolved, labels, len(resolved.sweep.seeds), n_problems, preset.eval.k, prior, reported,
                  load_calibration(calibration_file(preset.name)))


def sweep_claims(sizing: Sizing) -> list[Claim]:
    """The claims the report will judge: the paper's, else the stand-in claims of a sweep without a paper."""
    if sizing.reported and sizing.reported.claims:
        return sizing.reported.claims
    names = {label: spec.name for label, spec in sizing.resolved.methods.items()}
    return default_claims(sizing.labels, names, DEFAULT_BASELINE)


def detectable_text(components: power.VarianceComponents, n_seeds: int, power_level: float) -> str:
    """'X pts with S seeds', or why S seeds detect nothing (one seed: no verdict)."""
    if n_seeds < 2:
        return f"nothing with {n_seeds} seed (a verdict needs 2 or more)"
    return f"{100 * power.detectable_effect(components, n_seeds, power_level):.1f} pts with {n_seeds} seeds"


def seeds_text(sizing: Sizing, components: power.VarianceComponents, effect: float, power_level: float) -> str:
    """The seeds (and GPU-hours of the whole sweep at that count) that detect ``effect`` (points); where none up to
    ``power.MAX_SEEDS`` do, what the problems' part alone leaves, and the seeds without the assumed interaction."""
    if power.detectable_effect(components, power.MAX_SEEDS, power_level) <= effect / 100:  # monotone in S
        needed = power.seeds_needed(components, effect / 100, power_level)
        hours = power.gpu_hours(sizing.resolved, needed)
        return f"{needed} seeds needed" + (f" ({hours:,.0f} GPU-hours for the sweep)" if hours > 0 else "")
    text = f"more than {power.MAX_SEEDS} seeds needed"
    no_interaction = dataclasses.replace(components, problem={b: 0.0 for b in components.problem})
    if no_interaction != components:  # the floor is the assumed method x problem interaction's
        text += (f": the problems' part alone detects {100 * problems_floor(components, power_level):.1f} pts; "
                 f"with no method x problem interaction: {seeds_text(sizing, no_interaction, effect, power_level)}")
    return text


def problems_floor(components: power.VarianceComponents, power_level: float) -> float:
    """The effect (fraction) detected with unlimited seeds: the problem part alone (training noise and residual,
    divided by the seeds, gone)."""
    limit = dataclasses.replace(components, seed=0.0, residual={b: 0.0 for b in components.residual})
    return power.detectable_effect(limit, 2, power_level)


def design_lines(sizing: Sizing, noise: Noise) -> list[str]:
    """The benchmarks, their problems and the baseline's accuracy, k, where the accuracies come from, and the noise
    and interaction the sizing takes."""
    accuracy, sources = baseline_accuracy(list(sizing.n_problems), DEFAULT_BASELINE, sizing.reported, sizing.prior)
    benches = ", ".join(f"{b} {n} at {100 * accuracy[b]:.1f}%" for b, n in sizing.n_problems.items())
    groups = dict.fromkeys(sources.values())
    origin = [f"    accuracy from {s}" + (f" ({', '.join(b for b in sources if sources[b] == s)})" if len(groups) > 1
                                          else "") for s in groups]
    prior = sizing.prior
    return [f"  benchmarks (problems, {DEFAULT_BASELINE}'s accuracy p): {benches}; k = {sizing.k}", *origin,
            "  per problem: sampling 2 p (1 - p) / k (k = 1 for a greedy claim), method x problem interaction "
            "(sd / 2)^2 p (1 - p): upper bounds at p",
            f"  training noise of a paired difference on the mean: sd {100 * math.sqrt(noise.variance):.2f} pts, "
            f"pooled over {len(sizing.labels)} labels as the report pools it; from {noise.source}",
            f"  method x problem interaction: sd {prior.interaction_sd:g} logit; from {prior.interaction_source}"]


def sensitivity_line(sizing: Sizing, noise: Noise) -> str:
    """The detectable effect on the mean when each assumed sd is halved and doubled (the interaction also at 0)."""
    scope, n = list(sizing.n_problems), sizing.n_seeds
    interaction = sizing.prior.interaction_sd

    def mde(scale: float = 1.0, sd: float = interaction) -> str:
        comp = sizing.components(DEFAULT_BASELINE, scope, sizing.k, sd, noise, scale)
        return f"{100 * power.detectable_effect(comp, n):.1f}"

    parts = [f"training-noise sd x{SENSITIVITY[0]:g} / x{SENSITIVITY[1]:g}: "
             + " / ".join(mde(scale=s) for s in SENSITIVITY)] if noise.assumed else []
    parts.append(f"interaction sd 0 / x{SENSITIVITY[1]:g}: {mde(sd=0.0)} / {mde(sd=interaction * SENSITIVITY[1])}")
    return f"    if the assumptions are off ({n} seeds, pts): " + "; ".join(parts)


def headline_lines(sizing: Sizing, noise: Noise) -> list[str]:
    """The detectable effect of a method against the baseline on the mean, at the sweep's seeds and more."""
    scope, n = list(sizing.n_problems), sizing.n_seeds
    comp = sizing.components(DEFAULT_BASELINE, scope, sizing.k, sizing.prior.interaction_sd, noise)
    more = ", ".join(f"{s} seeds {100 * power.detectable_effect(comp, s):.1f}" for s in SEED_COUNTS if s > n)
    lines = [f"  detectable on the mean ({avg_at(sizing.k)}, a method - {DEFAULT_BASELINE}, {power.POWER:.0%} power): "
             f"{detectable_text(comp, n, power.POWER)}" + (f"; {more}" if more else "")]
    return lines + ([sensitivity_line(sizing, noise)] if n >= 2 else [])


def claim_lines(sizing: Sizing, claim: Claim) -> tuple[list[str], list[str]]:
    """(lines, underpowered) for one claim: the effect this sweep detects for it and the seeds its effect needs, and
    a line when the claim is below what the sweep detects (its verdict would read 'insufficient replication')."""
    head = f"  claim: {claim.describe()}: "
    comp = claim_components(sizing, claim)
    if isinstance(comp, str):
        return [head + f"not sized: {comp}"], []
    level = PARITY_POWER if claim.kind == "parity" else power.POWER
    what = (f"a margin of ±{claim.effect:g} pts (each one-sided test at {level:.0%})" if claim.kind == "parity"
            else f"{claim.effect:g} pts at {level:.0%} power")
    needed = seeds_text(sizing, comp, claim.effect, level)
    n = sizing.n_seeds
    detectable = 100 * power.detectable_effect(comp, n, level) if n >= 2 else math.inf
    line = head + f"detects {detectable_text(comp, n, level)}; {what}: {needed}"
    if detectable <= claim.effect:
        return [line], []
    return [line], [f"underpowered: {claim.describe()}: the sweep detects {detectable_text(comp, n, level)}, "
                    f"more than the claim's {claim.effect:g}: its verdict would read 'insufficient replication'"]


def claim_components(sizing: Sizing, claim: Claim) -> power.VarianceComponents | str:
    """The components of the claim's paired difference on its scope and metric, or why it cannot be sized."""
    scope = list(sizing.n_problems) if claim.benchmark == MEAN else [claim.benchmark]
    missing = [label for label in (claim.method, claim.baseline) if label not in sizing.labels]
    if missing or not set(scope) <= set(sizing.n_problems):
        return f"{', '.join(missing) or claim.benchmark} not trained or scored in this sweep"
    if claim.metric == GREEDY and not sizing.resolved.preset.eval.greedy:
        return "the preset scores no greedy answer (eval.greedy)"
    noise = scope_noise(scope, sizing.n_problems, sizing.prior, sizing.calibration)
    if noise is None:
        return "the prior gives the training noise of the mean over benchmarks only"
    interaction = 0.0 if sizing.same_method(claim.method, claim.baseline) else sizing.prior.interaction_sd
    return sizing.components(claim.baseline, scope, 1 if claim.metric == GREEDY else sizing.k, interaction, noise)


def plan_power_lines(resolved: Resolved) -> tuple[list[str], list[str]]:
    """(lines, underpowered): what ``harness plan`` prints about the sweep's power from the preset's prior, and a
    line per claim whose effect is below what the sweep's seeds detect."""
    sizing = read_sizing(resolved)
    if isinstance(sizing, str):
        return [sizing], []
    noise = scope_noise(list(sizing.n_problems), sizing.n_problems, sizing.prior, sizing.calibration)
    lines = [f"power, from the prior {_relative(sizing.prior.path)} (docs/statistics.md, 'Sizing a sweep before "
             f"running it'): the verdict's 95% interval of the paired difference, benchmarks weighted equally",
             *design_lines(sizing, noise), *headline_lines(sizing, noise)]
    warning = sizing.calibration.mean_warning() if noise is not None and not noise.assumed else ""
    if warning:  # the mean scope sizes every claim on the mean: say when it is implausibly small
        lines.append(f"  calibration suspect: {warning}")
    underpowered = []
    for claim in sweep_claims(sizing):
        claim_text, short = claim_lines(sizing, claim)
        lines += claim_text
        underpowered += short
    return lines, underpowered
