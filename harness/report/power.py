"""Power: the variance components of a paired difference, the smallest effect a sweep of S seeds detects, and the
seeds (and GPU-hours) a given effect needs. Pure functions over numpy arrays, plus ``read_pilot`` and
``power_report`` for ``harness power``.

Model (the one behind ``scores.crossed_variance``): a paired difference cell d_sp = delta + a_s + b_p + e_sp,
with seed (training randomness), problem (the method x problem interaction) and residual (sampling of the k
completions and seed x problem) components. Estimated from one (S, P) matrix per benchmark by ANOVA moments:

    sigma_e^2 = MS_resid,   sigma_b^2 = max(0, (MS_problem - MS_resid) / S),
    sigma_A^2 = max(0, var_s(R_s) - sum_b w^2 sigma_e,b^2 / P_b)        (R_s: benchmark-averaged row of seed s)

so that, with the same benchmarks, a sweep of S seeds has

    V(S) = sigma_A^2 / S + sum_b w^2 (sigma_b,b^2 / P_b + sigma_e,b^2 / (S P_b)),

split as the interval splits it: the seed part (sigma_A^2 + sum_b w^2 sigma_e,b^2 / P_b) / S with S - 1 degrees of
freedom, the problem part, and the residual part sum_b w^2 sigma_e,b^2 / (S P_b) with (S - 1)(P - 1), the floor under
the seed part. The verdict "reproduced" is "the 95% interval excludes 0 on the claimed side"; its power at a true
effect delta is ``power_at`` (the estimate against the wider of the seed-level half-width, random with the seed
part's few degrees of freedom, and the residual floor), and the minimum detectable effect (MDE) is the delta where
that reaches 80%. tests/test_power.py checks the formula against simulated sweeps.

Pooled (``VarianceComponents.pooled``): sigma_A^2 is the training noise pooled over the sweep's labels
(``training_noise.pooled_training_noise``), whose (L - 1)(S - 1) degrees of freedom grow with S (``seed_df``), as the
report's Δ intervals pool it. ``harness power`` plans seeds on the one-sided ``UPPER_LEVEL`` upper confidence bound of
that variance and compares the levers: more seeds, more samples per problem k (the sampling part of the residual,
``sampling_variance``, scales by k / k'), more problems.

Only per-seed accuracies (``results.json``, no ``samples.jsonl``, as in the committed results/example/): the
per-seed rows give the labels x seeds table but not its split into seed and problem-level parts, so the problem and
residual terms are taken as 0 and the pooled noise holds the residual's share (no floor). For an A/A pair the problem
term is 0 in expectation anyway; for a method whose effect varies across problems it is a floor that more seeds do
not lower, which this path cannot see.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

from harness.data.score_names import avg_at
from harness.report.outliers import COLLAPSE_ADVICE, OUTLIER_K, outlying_runs, scores_table
from harness.report.scores import CONFIDENCE, CrossedVariance, per_problem_scores, score_matrix
from harness.report.training_noise import TrainingNoise, pooled_training_noise

POWER = 0.80
TAIL = 12.0  # power_at integrates the standard normal over [-TAIL, TAIL] ...
NODES, WEIGHTS = np.polynomial.legendre.leggauss(200)  # ... with 200 Gauss-Legendre nodes (error < 1e-9, tested)
MAX_SEEDS = 200  # ``seeds_needed`` gives up beyond this (the problem term alone may never get there)
UPPER_LEVEL = 0.90  # the one-sided level of the upper confidence bound on the training noise seeds are planned on


@dataclass(frozen=True)
class VarianceComponents:
    """Variance components of a paired difference (in accuracy fractions^2), benchmarks weighted 1/M.

    ``seed``: of the benchmark-averaged seed effect; ``problem`` and ``residual``: per benchmark;
    ``n_problems``: per benchmark; ``n_seeds``: the pilot's S (what the components were estimated from).
    The seed part's degrees of freedom at S seeds: ``df_per_seed`` (S - 1) + ``external_df`` (1 and 0 for one pair's
    own seeds; L - 1 and an A/A calibration's df when pooled over L labels: ``pooled``).
    """

    seed: float
    problem: Mapping[str, float]
    residual: Mapping[str, float]
    n_problems: Mapping[str, int]
    n_seeds: int
    df_per_seed: float = 1.0
    external_df: float = 0.0

    @property
    def weight(self) -> float:
        return 1.0 / len(self.n_problems)

    def seed_df(self, n_seeds: int) -> float:
        return max(1.0, self.df_per_seed * (n_seeds - 1) + self.external_df)

    def pooled(self, noise: TrainingNoise) -> VarianceComponents:
        """These components with the seed part from a sweep's pooled training noise (``training_noise.TrainingNoise``,
        estimated at this ``n_seeds``): its df less a calibration's grow with the seeds, (L - 1)(S - 1)."""
        return dataclasses.replace(self, seed=noise.variance, df_per_seed=(noise.df - noise.external_df)
                                   / max(1, self.n_seeds - 1), external_df=noise.external_df)


def variance_components(differences: Mapping[str, np.ndarray]) -> VarianceComponents:
    """Components from paired-difference matrices {bench: (S, P_b)} with S >= 2 (module docstring)."""
    benches = sorted(differences)
    n_seeds = differences[benches[0]].shape[0]
    if n_seeds < 2:
        raise ValueError("variance_components: one seed shows no seed-to-seed variance; a pilot needs >= 2 seeds")
    w = 1.0 / len(benches)
    problem, residual, n_problems = {}, {}, {}
    for bench in benches:
        x = differences[bench]
        n = x.shape[1]
        columns = x.mean(axis=0)
        resid = x - x.mean(axis=1, keepdims=True) - columns + x.mean()
        ms_resid = float((resid**2).sum()) / ((n_seeds - 1) * max(n - 1, 1))
        ms_problem = n_seeds * float(columns.var(ddof=1)) if n > 1 else 0.0
        residual[bench], problem[bench], n_problems[bench] = ms_resid, max(0.0, (ms_problem - ms_resid) / n_seeds), n
    rows = np.mean([differences[b].mean(axis=1) for b in benches], axis=0)
    seed = max(0.0, float(rows.var(ddof=1)) - sum(w**2 * residual[b] / n_problems[b] for b in benches))
    return VarianceComponents(seed, problem, residual, n_problems, n_seeds)


def components_from_seed_means(rows: Mapping[str, np.ndarray], n_problems: Mapping[str, int]) -> VarianceComponents:
    """Components from per-seed mean differences only ({bench: (S,)}): the seed-level variance of the
    benchmark-averaged rows, at the pilot's problem counts; problem and residual terms 0 (module docstring)."""
    benches = sorted(rows)
    n_seeds = len(rows[benches[0]])
    if n_seeds < 2:
        raise ValueError("components_from_seed_means: a pilot needs >= 2 seeds")
    averaged = np.mean([np.asarray(rows[b], dtype=float) for b in benches], axis=0)
    zeros = {b: 0.0 for b in benches}
    return VarianceComponents(float(averaged.var(ddof=1)), zeros, dict(zeros), {b: n_problems[b] for b in benches},
                              n_seeds)


def mean_variance(components: VarianceComponents, n_seeds: int) -> CrossedVariance:
    """The expected seed, problem and residual parts of the variance of the benchmark-averaged paired difference
    with ``n_seeds`` seeds (what ``scores.crossed_variance`` estimates from such a sweep)."""
    w = components.weight
    residual = sum(w**2 * components.residual[b] / n for b, n in components.n_problems.items())
    problem = sum(w**2 * components.problem[b] / n for b, n in components.n_problems.items())
    fewest = min(components.n_problems.values())
    return CrossedVariance((components.seed + residual) / n_seeds, components.seed_df(n_seeds), problem,
                           max(1, fewest - 1), residual / n_seeds, max(1, (n_seeds - 1) * (fewest - 1)))


def power_at(effect: float, variance: CrossedVariance, confidence: float = CONFIDENCE) -> float:
    """P(the interval's low end > 0) at a true paired effect ``effect`` > 0.

    In units of the standard error sqrt(V): the estimate is N(effect, 1); the seed-level half-width is c sqrt(X)
    with c = its value at the expected parts and X ~ chi2_nu / nu, nu the Satterthwaite degrees of freedom of the
    seed and problem parts, V^2 / (seed^2 / (S - 1) + problem^2 / (P - 1)); the residual floor f is taken as known
    (it has (S - 1)(P - 1) degrees of freedom). So, with n = effect / sqrt(V),

        power = P(Z + n > max(c sqrt(X), f)) = integral over z > f - n of phi(z) F_nu(nu (n + z)^2 / c^2) dz,

    which without a floor (f = 0) is the noncentral t's P(T_nu(n) > c): exact when the seed part dominates (a
    seed-level t test) or the problem part does (the normal test over problems), an approximation between, checked
    by simulation in tests/test_power.py.
    """
    total = variance.total
    if total <= 0:
        return 1.0 if effect > 0 else 0.0
    level = (1 - confidence) / 2
    scale = math.sqrt(total)
    shift = effect / scale
    floor = dataclasses.replace(variance, seed=0.0).half_width(level) / scale
    if variance.seed + variance.problem <= 0:
        return float(scipy_stats.norm.sf(floor - shift))
    critical = dataclasses.replace(variance, residual=0.0).half_width(level) / scale
    df = (variance.seed + variance.problem) ** 2 / (variance.seed**2 / variance.seed_df
                                                    + variance.problem**2 / variance.problem_df)
    low = max(floor - shift, -TAIL)  # phi beyond +-TAIL is below 1e-30
    if low >= TAIL:
        return 0.0
    z = low + (TAIL - low) * (NODES + 1) / 2  # Gauss-Legendre on [low, TAIL]: smooth integrand, one vector call
    values = scipy_stats.norm.pdf(z) * scipy_stats.chi2.cdf(df * (shift + z) ** 2 / critical**2, df)
    return float(min(1.0, (TAIL - low) / 2 * np.dot(WEIGHTS, values)))


def detectable_effect(components: VarianceComponents, n_seeds: int, power: float = POWER,
                      confidence: float = CONFIDENCE) -> float:
    """The smallest paired effect (fraction) the verdict calls at ``power`` with ``n_seeds`` seeds (>= 2)."""
    if n_seeds < 2:
        raise ValueError("detectable_effect: one seed cannot separate a method effect from training randomness")
    variance = mean_variance(components, n_seeds)
    if variance.total <= 0:
        return 0.0
    scale = math.sqrt(variance.total)
    return scale * optimize.brentq(lambda nc: power_at(nc * scale, variance, confidence) - power, 0.0, 1e4)


def seeds_needed(components: VarianceComponents, effect: float, power: float = POWER,
                 confidence: float = CONFIDENCE, max_seeds: int = MAX_SEEDS) -> int | None:
    """The smallest S >= 2 whose detectable effect is <= ``effect`` (fraction); None if none up to ``max_seeds``."""
    for n_seeds in range(2, max_seeds + 1):
        if detectable_effect(components, n_seeds, power, confidence) <= effect:
            return n_seeds
    return None


# --- a prior in place of a pilot, for ``harness plan`` (harness/report/plan_power.py) ------------------------------


def sampling_part(accuracy: float, k: int) -> float:
    """The residual variance of one paired-difference cell from sampling k completions per problem in each arm:
    2 p (1 - p) / k at the benchmark's accuracy p (fraction), the arms taken at the same p (a small effect). Over
    problems of accuracies q with mean p, E[q (1 - q)] <= p (1 - p) (Jensen), so this bounds the sampling part from
    above. With k = 1 (a greedy answer) it bounds instead how a problem's one answer varies across training seeds."""
    return 2 * accuracy * (1 - accuracy) / k


def interaction_part(accuracy: float, logit_sd: float) -> float:
    """The method x problem interaction's variance on one benchmark when the method moves each problem's log-odds by
    its mean effect plus N(0, logit_sd^2): to first order a problem's accuracy q moves by q (1 - q) times the shift,
    and E[(q (1 - q))^2] <= E[q (1 - q)] / 4 <= p (1 - p) / 4 (q (1 - q) <= 1/4; Jensen), so logit_sd^2 p (1 - p) / 4
    bounds it from above at the benchmark's accuracy p."""
    return logit_sd**2 * accuracy * (1 - accuracy) / 4


def prior_components(accuracy: Mapping[str, float], n_problems: Mapping[str, int], k: int, seed_variance: float,
                     n_labels: int, n_seeds: int, interaction_logit_sd: float = 0.0,
                     external_df: float = 0.0) -> VarianceComponents:
    """The components of a paired difference (method - baseline) before any run, from a prior instead of a pilot:
    per benchmark the baseline's accuracy (fraction) and its problems, k samples per problem (1 for greedy), the
    training noise of a paired difference on the benchmark mean (``seed_variance``, fraction^2; beyond the residual,
    as ``training_noise.pooled_training_noise`` and an A/A calibration give it), and the sd in logits of the method x
    problem interaction (0 for two labels of one method). Residual: ``sampling_part``; problem: ``interaction_part``.
    The seed part's degrees of freedom are the report's, pooled over the sweep's ``n_labels`` labels,
    (L - 1)(S - 1), plus ``external_df`` from an A/A calibration the report pools in (none for an assumed noise)."""
    benches = sorted(n_problems)
    return VarianceComponents(
        seed_variance, {b: interaction_part(accuracy[b], interaction_logit_sd) for b in benches},
        {b: sampling_part(accuracy[b], k) for b in benches}, {b: n_problems[b] for b in benches}, n_seeds,
        df_per_seed=max(1, n_labels - 1), external_df=external_df)


# --- a pilot sweep on disk, for ``harness power`` -----------------------------------------------------------------


@dataclass
class Pilot:
    """Per-seed (and, where ``samples.jsonl`` exist, per-problem) scores of a finished sweep at its last checkpoint."""

    root: Path
    labels: list[str]
    seeds: list[int]
    ckpt: str
    benches: list[str]
    methods: dict[str, tuple[str, str]]  # label -> (method name, params as JSON): A/A pairs share it
    seed_means: dict[tuple[str, str], np.ndarray]  # (label, bench) -> (S,) accuracy per seed (avg@k)
    matrices: dict[tuple[str, str], np.ndarray]  # (label, bench) -> (S, P); empty without samples.jsonl
    n_problems: dict[str, int]
    k: int  # samples per problem of the pilot's evaluations

    def aa_pairs(self) -> list[tuple[str, str]]:
        return [(b, a) for i, a in enumerate(self.labels) for b in self.labels[i + 1:]
                if self.methods[a] == self.methods[b]]

    def components(self, label: str, baseline: str, benches: Sequence[str] | None = None) -> VarianceComponents:
        """Components of label - baseline over ``benches`` (default all): per problem if the samples are there."""
        benches = list(benches or self.benches)
        if self.per_problem(benches):
            return variance_components({b: self.matrices[(label, b)] - self.matrices[(baseline, b)] for b in benches})
        return components_from_seed_means({b: self.seed_means[(label, b)] - self.seed_means[(baseline, b)]
                                           for b in benches}, self.n_problems)

    def per_problem(self, benches: Sequence[str]) -> bool:
        return all((lab, b) in self.matrices for lab in self.labels for b in benches)

    def training_noise(self, benches: Sequence[str]) -> TrainingNoise:
        """The training noise of a paired difference pooled over every label (``training_noise.pooled_training_noise``;
        from the per-seed accuracies alone, without samples.jsonl: its residual share taken as 0)."""
        if self.per_problem(benches):
            return pooled_training_noise({lab: {b: self.matrices[(lab, b)] for b in benches}
                                          for lab in self.labels})
        return pooled_training_noise({lab: {b: self.seed_means[(lab, b)][:, None] for b in benches}
                                      for lab in self.labels})

    def sampling(self, label: str, baseline: str, benches: Sequence[str]) -> dict[str, float]:
        """Per benchmark, the part of a paired difference's residual that is the sampling of the k completions
        (``sampling_variance``); 0 without per-problem scores."""
        if not self.per_problem(benches):
            return {b: 0.0 for b in benches}
        return {b: sampling_variance(self.matrices[(label, b)], self.k) + sampling_variance(
            self.matrices[(baseline, b)], self.k) for b in benches}


def read_pilot(root: Path) -> Pilot:
    """A finished sweep folder (``results/<sweep>/``, or the committed ``results/example/``): its ``sweep.yaml``
    names the labels and seeds; the last checkpoint every run was evaluated at is used."""
    sweep_file = root / "sweep.yaml"
    if not sweep_file.is_file():
        raise FileNotFoundError(f"power: {sweep_file} is missing; point --pilot at a finished sweep's results folder")
    sweep = json.loads(sweep_file.read_text(encoding="utf-8"))
    labels, seeds = list(sweep["methods"]), list(sweep["seeds"])
    runs = [(lab, s) for lab in labels for s in seeds]
    first = root / "eval" / labels[0] / f"seed{seeds[0]}"
    ckpts = sorted(p.name for p in first.glob("ckpt-*")) if first.is_dir() else []
    ckpts = [c for c in ckpts if all((root / "eval" / lab / f"seed{s}" / c).is_dir() for lab, s in runs)]
    if not ckpts:
        raise FileNotFoundError(f"power: no checkpoint of {root} is evaluated for every label and seed")
    ckpt = ckpts[-1]
    benches = sorted(p.name for p in (first / ckpt).iterdir() if (p / "results.json").is_file())
    methods, seed_means, matrices, n_problems, ks = {}, {}, {}, {}, set()
    for label in labels:
        run = json.loads((root / "runs" / label / f"seed{seeds[0]}" / "run.json").read_text(encoding="utf-8"))
        methods[label] = (run["method"]["name"], json.dumps(run["method"].get("params", {}), sort_keys=True))
        for bench in benches:
            folders = [root / "eval" / label / f"seed{s}" / ckpt / bench for s in seeds]
            results = [json.loads((f / "results.json").read_text(encoding="utf-8")) for f in folders]
            seed_means[(label, bench)] = np.array([r["metrics"][avg_at(r["k"])] for r in results])
            n_problems[bench] = int(results[0]["n_problems"])
            ks.update(r["k"] for r in results)
            if all((f / "samples.jsonl").is_file() for f in folders):
                per_seed = [per_problem_scores(json.loads(line) for line in (f / "samples.jsonl").open()
                                               if line.strip()) for f in folders]
                matrices[(label, bench)] = per_seed
    # per-problem matrices on the problems every run scored (as the report pairs them)
    for bench in benches:
        cells = [matrices.get((lab, bench)) for lab in labels]
        if all(c is not None for c in cells):
            common = sorted(set.intersection(*(set(s) for c in cells for s in c)))
            for label in labels:
                matrices[(label, bench)] = score_matrix(matrices[(label, bench)], common)
        else:
            for label in labels:
                matrices.pop((label, bench), None)
    if len(ks) != 1:
        raise ValueError(f"power: the pilot {root} mixes samples per problem k = {sorted(ks)}; rerun the stale ones")
    return Pilot(root, labels, seeds, ckpt, benches, methods, seed_means, matrices, n_problems, ks.pop())


def with_seeds(resolved, n_seeds: int):
    """The resolved sweep with seeds 0..n-1 (for ``harness plan``'s arithmetic at another seed count)."""
    return dataclasses.replace(resolved, sweep=dataclasses.replace(resolved.sweep, seeds=list(range(n_seeds))))


def gpu_hours(resolved, n_seeds: int) -> float:
    """Total GPU-hours of the sweep run with ``n_seeds`` seeds: ``harness.ops.resources.plan`` at that count."""
    from harness.ops.resources import plan

    return sum(row.gpu_hours for row in plan(with_seeds(resolved, n_seeds)))


def sampling_variance(scores: np.ndarray, k: int) -> float:
    """The mean over cells of the variance of an avg@k cell given its problem's p, p (1 - p) / k, estimated without
    bias by x (1 - x) / (k - 1) (0 with k = 1: greedy, no sampling)."""
    return float(np.mean(scores * (1 - scores))) / (k - 1) if k > 1 else 0.0


def upper_bound(noise: TrainingNoise, level: float = UPPER_LEVEL) -> TrainingNoise:
    """The one-sided ``level`` upper confidence bound on a training-noise variance: df T / chi2_{1 - level, df}
    (a 2-seed pilot underestimates the variance about half the time; planning on the bound does not)."""
    if noise.df <= 0 or noise.variance <= 0:
        return noise
    bound = noise.df * noise.variance / scipy_stats.chi2.ppf(1 - level, noise.df)
    return dataclasses.replace(noise, variance=bound)


def with_samples(components: VarianceComponents, sampling: Mapping[str, float], k: int,
                 new_k: int) -> VarianceComponents:
    """The components at ``new_k`` samples per problem: the sampling part of each residual scales by k / new_k,
    the rest of it (seed x problem) stays."""
    residual = {b: max(0.0, r - sampling[b]) + sampling[b] * k / new_k for b, r in components.residual.items()}
    return dataclasses.replace(components, residual=residual)


def with_problems(components: VarianceComponents, factor: float) -> VarianceComponents:
    """The components with ``factor`` times the problems of each benchmark (drawn like the pilot's)."""
    return dataclasses.replace(components, n_problems={b: round(n * factor) for b, n in
                                                       components.n_problems.items()})


def aa_components(pilot: Pilot, benches: Sequence[str]) -> VarianceComponents:
    """An A/A pair's components: the pooled training noise, no problem term (two labels of one method share the
    problems' effects), twice the labels' mean seed x problem residual."""
    noise = pilot.training_noise(benches)
    residual = {b: 0.0 for b in benches}
    if pilot.per_problem(benches):
        residual = {b: 2 * float(np.mean([variance_components({b: pilot.matrices[(lab, b)]}).residual[b]
                                          for lab in pilot.labels])) for b in benches}
    comp = VarianceComponents(noise.variance, {b: 0.0 for b in benches}, residual,
                              {b: pilot.n_problems[b] for b in benches}, len(pilot.seeds))
    return comp.pooled(noise)


def eval_gpu_hours(resolved, n_seeds: int) -> float:
    """GPU-hours of the sweep's evaluation jobs at ``n_seeds`` seeds (what more samples or problems multiply)."""
    from harness.ops.resources import plan

    return sum(row.gpu_hours for row in plan(with_seeds(resolved, n_seeds)) if row.rule.startswith("eval"))


def lever_lines(comp: VarianceComponents, sampling: Mapping[str, float], k: int, n_seeds: int,
                effect: float, resolved, power: float) -> list[str]:
    """The cheapest routes to ``effect`` (fraction) from the pilot's design: more seeds, more samples per problem
    (k; evaluation only), more problems (evaluation only, and the benchmark must have them)."""
    seeds = seeds_needed(comp, effect, power)
    lines = [f"    now ({n_seeds} seeds, k = {k}): detects {100 * detectable_effect(comp, n_seeds, power):.1f} pts",
             f"    more seeds: {seeds} seeds" if seeds else f"    more seeds: not within {MAX_SEEDS} seeds"]
    if resolved is not None and seeds:
        lines[-1] += f" ({gpu_hours(resolved, seeds):.1f} GPU-hours for the sweep)"
    evals = eval_gpu_hours(resolved, n_seeds) if resolved is not None else None
    for name, factors, changed in (("samples per problem", (2, 4, 8), lambda f: with_samples(comp, sampling, k, k * f)),
                                   ("problems", (2, 4), lambda f: with_problems(comp, f))):
        cells = []
        for factor in factors:
            detectable = detectable_effect(changed(factor), n_seeds, power)
            cost = "" if evals is None else f", evaluation {factor * evals:.1f} GPU-hours"
            cells.append(f"x{factor}: detects {100 * detectable:.1f} pts{cost}")
        lines.append(f"    more {name} at {n_seeds} seeds: " + "; ".join(cells))
    return lines


def outlier_lines(pilot: Pilot) -> list[str]:
    """The pilot's outlying runs (``outliers.outlying_runs`` on the mean over its benchmarks; the residual floor
    only where per-problem scores are there), and what collapse-prone training needs."""
    table = np.array([np.mean([pilot.seed_means[(lab, b)] for b in pilot.benches], axis=0) for lab in pilot.labels])
    floor = 0.0
    if pilot.per_problem(pilot.benches):
        floor = scores_table({lab: {b: pilot.matrices[(lab, b)] for b in pilot.benches} for lab in pilot.labels})[2]
    found = outlying_runs(table, pilot.labels, pilot.seeds, floor)
    rule = f"a seed more than {OUTLIER_K:g} robust scales below its label's other seed(s) on the mean over benchmarks"
    if not found:
        return [f"outlying runs ({rule}): none. {COLLAPSE_ADVICE[0].upper()}{COLLAPSE_ADVICE[1:]}"]
    return [f"outlying runs ({rule}): " + "; ".join(run.describe().replace("`", "") for run in found),
            f"  the pooled noise below holds them: {COLLAPSE_ADVICE}"]


def power_report(pilot: Pilot, pairs: Sequence[tuple[str, str] | None], effects_points: Sequence[float],
                 resolved=None, power: float = POWER) -> str:
    """The text ``harness power`` prints: per pair (None: an A/A pair of the pooled noise), the components with the
    training noise pooled over every label of the pilot, the detectable effect at the pilot's S and at a few more,
    and per effect the seeds needed at the estimate and at its ``UPPER_LEVEL`` upper bound, with the levers (seeds,
    samples per problem, problems) and their GPU-hours (with ``resolved``)."""
    n = len(pilot.seeds)
    basis = "per-problem scores" if pilot.matrices else "per-seed accuracies only (no samples.jsonl)"
    lines = [f"pilot {pilot.root} at {pilot.ckpt}: {len(pilot.labels)} labels x {n} seeds, k = {pilot.k}, benchmarks "
             + ", ".join(f"{b} ({pilot.n_problems[b]} problems)" for b in pilot.benches) + f"; from {basis}",
             f"power {power:.0%}, verdict 'reproduced' = the 95% interval excludes 0 on the claimed side; training "
             f"noise pooled over the {len(pilot.labels)} labels (same size for every method assumed); seeds "
             f"planned on its {UPPER_LEVEL:.0%} upper confidence bound", *(outlier_lines(pilot) if n > 1 else []), ""]
    for pair in pairs:
        for label in pair or ():
            if label not in pilot.labels:
                raise ValueError(f"power: label {label!r} is not in the pilot {pilot.root} (labels: {pilot.labels})")
        name = f"{pair[0]} - {pair[1]}" if pair else "A/A (two labels of one method)"
        for scope in [*pilot.benches, "mean"]:
            benches = pilot.benches if scope == "mean" else [scope]
            noise = pilot.training_noise(benches)
            comp = (pilot.components(*pair, benches).pooled(noise) if pair else aa_components(pilot, benches))
            upper = comp.pooled(upper_bound(noise))
            sampling = pilot.sampling(*pair, benches) if pair else {
                b: 2 * float(np.mean([sampling_variance(pilot.matrices[(lab, b)], pilot.k) for lab in pilot.labels]))
                if pilot.per_problem(benches) else 0.0 for b in benches}
            lines.append(
                f"{name}, {scope}: training-noise sd {100 * math.sqrt(comp.seed):.2f} pts ({noise.df:g} df; "
                f"{UPPER_LEVEL:.0%} bound {100 * math.sqrt(upper.seed):.2f}), problem sd "
                f"{100 * math.sqrt(max(comp.problem.values())):.2f}, residual sd "
                f"{100 * math.sqrt(max(comp.residual.values())):.2f}; detectable with {n} seeds "
                f"{100 * detectable_effect(comp, max(n, 2), power):.1f} pts" + "".join(
                    f", {s} seeds {100 * detectable_effect(comp, s, power):.1f}" for s in (3, 5, 10) if s > n))
            for effect in effects_points:
                needed = seeds_needed(comp, effect / 100, power)
                lines.append(f"  effect {effect:g} pts: {needed or f'more than {MAX_SEEDS}'} seeds at the estimate; "
                             f"at its {UPPER_LEVEL:.0%} upper bound:")
                lines += lever_lines(upper, sampling, pilot.k, max(n, 2), effect / 100, resolved, power)
        lines.append("")
    return "\n".join(lines)
