"""Reproduction verdicts per paper claim: what a paper says (``claims`` in configs/reported/<sweep>.yaml), judged by
the sweep's paired difference and its 95% interval at the full budget, per comparison and with Holm's family-wise
correction over the sweep's claims. Pure functions; the report renders them.

A claim: ``method`` vs ``baseline`` (labels of the sweep), on a ``benchmark`` or ``mean`` (the unweighted mean over
the sweep's benchmarks), ``metric`` ``avg@k`` (our sampled accuracy, whatever k) or ``greedy``, the paper's
``difference`` in points, ``kind`` ``improvement`` or ``parity``, and ``where`` the paper says it.

Verdicts, from the interval I of the paired difference (method - baseline) and the paper's difference delta:

- improvement (delta > 0):  reproduced    I excludes 0 on the claimed side (low > 0); when I also excludes delta the
                                          effect is there but smaller than the paper's, which the reason says;
                            contradicted  I excludes delta (high < delta): no effect as large as claimed, or the
                                          opposite sign (high < 0);
                            inconclusive  I covers both 0 and delta: the reason gives the effect this sweep detects
                                          at 80% power (``harness.report.power``).
- parity, margin m:         reproduced    I inside (-m, m): equivalent (two one-sided tests at 2.5% each, TOST);
                            contradicted  I entirely beyond +m or -m: a difference larger than the margin;
                            inconclusive  otherwise.

Not judged: a claim whose runs have one seed per label (the interval would hold the problems' sampling only, not
training randomness: rehearsals, pilots) or whose paired differences are all the same (an interval without width,
e.g. both arms at 0 on every problem). Holm's family leaves these out.

The parity margin is ``PARITY_MARGIN_POINTS`` = 1 point of accuracy unless a claim sets ``margin``: below every
improvement the papers in configs/reported claim on their mean (+1.1 to +4.5 points) except 80/20's +0.5 at 8B
(a parity claim in configs/reported: the paper calls 8B comparable), so "equivalent" cannot hide a gain of the size
these papers report as one.

Each verdict is a pair of one-sided t tests on the interval's estimate, se and df (``intervals.p_value``): p_reproduce
(H0: delta <= 0; parity: |delta| >= m) and p_contradict (H0: delta >= claimed; parity: |delta| <= m); a verdict is
called at p < 0.025, which is exactly "the 95% interval excludes ...". Holm (1979, Scand. J. Statist. 6(2)) adjusts
each of the two p-value families over all claims of the sweep: p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j)).

The headline of a claim (``Verdict.headline``) is its Holm verdict, or "insufficient replication (detects X, claim
Y)" when the sweep's detectable effect X exceeds the claim's effect Y (an improvement's difference, a parity
claim's margin): such a sweep calls the claim mostly by chance, whichever way. A verdict cannot come from
under-training: a parity claim judged "reproduced" whose baseline gained less than ``Claim.learned_threshold``
points over the warm start (the step-0 reference row; the claim's ``min_baseline_gain``, default its margin: both
arms still within the margin of the base model are equivalent by construction) reads "under-trained", and an
improvement claim judged "contradicted" under such a baseline says so ("contradicted, baseline under-trained").
For parity the detectable effect is
the smallest margin the sweep establishes with 80% power when the truth is 0: TOST passes when both one-sided tests
do, so each at ``PARITY_POWER`` = 90% gives >= 80% (``power.detectable_effect`` at 90%). The intervals and detectable
effects pool the sweep's training noise over its labels (``training_noise.pooled_variance``) when given it. A
detectable effect, and the seeds that would settle a claim, take that pooled noise at its one-sided
``power.UPPER_LEVEL`` upper confidence bound, as ``harness power`` plans seeds (a 2-seed sweep's 7-df estimate is
below the truth about half the time); the interval and the verdict take the estimate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.config.schema import ConfigError
from harness.data.score_names import AVG_AT_K, GREEDY
from harness.report import power
from harness.report.intervals import Interval, difference_interval, holm_adjust, p_value
from harness.report.scores import CONFIDENCE, CrossedVariance, crossed_variance
from harness.report.training_noise import OWN, TrainingNoise

KINDS = ("improvement", "parity")
METRICS = (AVG_AT_K, GREEDY)
MEAN = "mean"  # the claim's benchmark for the unweighted mean over the sweep's benchmarks
UNDERTRAINED = "under-trained"  # a parity verdict while the baseline did not learn (module docstring)
NOT_JUDGED = "not judged"  # evaluated, but the sweep cannot judge it: one seed, or an interval without width
PARITY_MARGIN_POINTS = 1.0
DEFAULT_CLAIM_POINTS = 2.0  # the default sweep's stand-in claim: each method improves the mean by 2 points
DEFAULT_BASELINE = "uniform"
CLAIM_REQUIRED = {"method", "benchmark", "metric", "difference", "kind", "where"}
CLAIM_KEYS = CLAIM_REQUIRED | {"baseline", "margin", "min_baseline_gain"}
ALPHA_ONE_SIDED = (1 - CONFIDENCE) / 2  # 0.025: the 95% interval's side
PARITY_POWER = 1 - (1 - power.POWER) / 2  # each one-sided test of TOST at 90%: both pass with >= 80% (docstring)


@dataclass(frozen=True)
class Claim:
    """One comparison a paper makes; ``difference`` and ``margin`` in points of accuracy."""

    method: str
    baseline: str
    benchmark: str  # a benchmark name or MEAN
    metric: str  # "avg@k" or "greedy"
    difference: float
    kind: str  # "improvement" or "parity"
    where: str
    margin: float = PARITY_MARGIN_POINTS
    min_baseline_gain: float | None = None  # points; None: ``learned_threshold``'s default

    @property
    def learned_threshold(self) -> float:
        """The gain (points) over the warm start the baseline must reach for a parity verdict to count (module
        docstring): the claim's own, else the parity margin (an arm that moved less than the margin from the start
        makes equivalence within it true by construction)."""
        return self.margin if self.min_baseline_gain is None else self.min_baseline_gain

    @property
    def effect(self) -> float:
        """The effect (points) the sweep must detect: an improvement's difference, a parity claim's margin."""
        return self.difference if self.kind == "improvement" else self.margin

    def describe(self) -> str:
        scope = "mean over benchmarks" if self.benchmark == MEAN else self.benchmark
        if self.kind == "parity":
            return (f"{self.method} matches {self.baseline} on {scope} ({self.metric}; paper {self.difference:+.2f} "
                    f"pts, margin ±{self.margin:g})")
        return f"{self.method} beats {self.baseline} on {scope} by {self.difference:+.2f} pts ({self.metric})"


def parse_claims(path: Path, raw) -> list[Claim]:
    """The ``claims`` list of a reported-numbers file; every error names the file and the key."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: key 'claims' must be a list of mappings with keys {sorted(CLAIM_KEYS)}")
    claims = []
    for i, entry in enumerate(raw):
        key = f"claims[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: key '{key}' must be a mapping with keys {sorted(CLAIM_KEYS)}")
        missing, unknown = CLAIM_REQUIRED - set(entry), set(entry) - CLAIM_KEYS
        if missing:
            raise ConfigError(f"{path}: key '{key}' lacks {sorted(missing)}; required: {sorted(CLAIM_REQUIRED)}")
        if unknown:
            raise ConfigError(f"{path}: key '{key}' has unknown key(s) {sorted(unknown)}; allowed: "
                              f"{sorted(CLAIM_KEYS)}")
        for name in ("method", "baseline", "benchmark", "where"):
            if name in entry and (not isinstance(entry[name], str) or not entry[name].strip()):
                raise ConfigError(f"{path}: key '{key}.{name}': {entry[name]!r} is not a non-empty string")
        if entry["metric"] not in METRICS:
            raise ConfigError(f"{path}: key '{key}.metric': {entry['metric']!r}; allowed: {list(METRICS)}")
        if entry["kind"] not in KINDS:
            raise ConfigError(f"{path}: key '{key}.kind': {entry['kind']!r}; allowed: {list(KINDS)}")
        for name in ("difference", "margin", "min_baseline_gain"):
            value = entry.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
                raise ConfigError(f"{path}: key '{key}.{name}': {value!r} is not a number of points in [-100, 100]")
        if entry.get("min_baseline_gain", 0.0) < 0:
            raise ConfigError(f"{path}: key '{key}.min_baseline_gain': the baseline's gain over the warm start "
                              f"must be >= 0 points, got {entry['min_baseline_gain']!r}")
        margin = float(entry.get("margin", PARITY_MARGIN_POINTS))
        if "margin" in entry and entry["kind"] != "parity":
            raise ConfigError(f"{path}: key '{key}.margin' applies to kind 'parity' only")
        if entry["kind"] == "improvement" and not entry["difference"] > 0:
            raise ConfigError(f"{path}: key '{key}.difference': an improvement claim needs a difference > 0 points, "
                              f"got {entry['difference']!r}")
        if entry["kind"] == "parity" and not (margin > 0 and abs(entry["difference"]) < margin):
            raise ConfigError(f"{path}: key '{key}.margin': a parity claim needs margin > 0 and |difference| < "
                              f"margin, got margin {margin!r}, difference {entry['difference']!r}")
        baseline = entry.get("baseline", DEFAULT_BASELINE)
        if baseline == entry["method"]:
            raise ConfigError(f"{path}: key '{key}.baseline': the same label as its method ({baseline!r})")
        gain = entry.get("min_baseline_gain")
        claims.append(Claim(entry["method"], baseline, entry["benchmark"], entry["metric"],
                            float(entry["difference"]), entry["kind"], entry["where"].strip(), margin,
                            None if gain is None else float(gain)))
    return claims


def default_claims(labels: Sequence[str], method_names: Mapping[str, str], baseline: str | None) -> list[Claim]:
    """Stand-in claims for a sweep without a paper (the default sweep): each label against the baseline on the
    mean over benchmarks; an improvement of DEFAULT_CLAIM_POINTS for a label of another method, parity for a label
    of the baseline's own method (the A/A pair)."""
    if baseline is None:
        return []
    claims = []
    for label in labels:
        if label == baseline:
            continue
        if method_names.get(label) == method_names.get(baseline):
            claims.append(Claim(label, baseline, MEAN, AVG_AT_K, 0.0, "parity",
                                "harness default (no paper): an A/A pair must be equivalent"))
        else:
            claims.append(Claim(label, baseline, MEAN, AVG_AT_K, DEFAULT_CLAIM_POINTS, "improvement",
                                f"harness default (no paper): a {DEFAULT_CLAIM_POINTS:g}-point gain on the mean"))
    return claims


def claim_effects(claims: Sequence[Claim]) -> list[float]:
    """The effect sizes (points) the claims need detected: an improvement's difference, a parity claim's margin."""
    return sorted({c.effect for c in claims})


# --- judging ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A claim judged on the sweep. ``interval`` and ``detectable`` in accuracy fractions (None: not evaluated, or
    one seed); ``holm``: the verdict under Holm's correction over the sweep's claims (``with_holm``)."""

    claim: Claim
    verdict: str  # reproduced / contradicted / inconclusive / not judged / not evaluated
    reason: str
    interval: Interval | None = None
    detectable: float | None = None
    p_reproduce: float = math.nan
    p_contradict: float = math.nan
    holm: str = ""
    holm_p_reproduce: float = math.nan
    holm_p_contradict: float = math.nan
    baseline_gain: float | None = None  # points the baseline gained over the warm start (None: no warm-start row)
    seeds_to_settle: int | None = None  # seeds per label whose detectable effect reaches the claim's (None: > max)

    @property
    def underpowered(self) -> bool:
        """The sweep's detectable effect exceeds the claim's effect (module docstring)."""
        return self.detectable is not None and 100 * self.detectable > self.claim.effect

    @property
    def undertrained(self) -> bool:
        """The baseline gained less than ``Claim.learned_threshold`` over the warm start (module docstring)."""
        return self.baseline_gain is not None and self.baseline_gain < self.claim.learned_threshold

    @property
    def headline(self) -> str:
        """What the claims table leads with: the Holm verdict, or insufficient replication, or under-trained
        (module docstring)."""
        if self.underpowered:
            return (f"insufficient replication (detects {100 * self.detectable:.1f}, claim "
                    f"{self.claim.effect:.1f})")
        verdict = self.holm or self.verdict
        if self.undertrained and verdict in ("reproduced", "contradicted"):
            gain = (f"{self.claim.baseline} {self.baseline_gain:+.1f} pts over the warm start, threshold "
                    f"{self.claim.learned_threshold:+.1f}")
            if self.claim.kind == "parity" and verdict == "reproduced":
                return f"{UNDERTRAINED} ({gain})"
            if self.claim.kind == "improvement" and verdict == "contradicted":
                return f"contradicted, baseline {UNDERTRAINED} ({gain})"
        return verdict


def claim_pvalues(claim: Claim, interval: Interval) -> tuple[float, float]:
    """(p_reproduce, p_contradict), one-sided (module docstring)."""
    delta, margin = claim.difference / 100, claim.margin / 100
    if claim.kind == "improvement":
        return p_value(interval, 0.0, "greater"), p_value(interval, delta, "less")
    equivalent = max(p_value(interval, -margin, "greater"), p_value(interval, margin, "less"))
    beyond = min(p_value(interval, margin, "greater"), p_value(interval, -margin, "less"))
    return equivalent, beyond


def decide(claim: Claim, interval: Interval, p_reproduce: float, p_contradict: float,
           detectable: float) -> tuple[str, str]:
    """(verdict, reason) from the two p-values at ALPHA_ONE_SIDED."""
    points = f"{claim.difference:+.2f}"
    if claim.kind == "improvement":
        if p_reproduce < ALPHA_ONE_SIDED:
            smaller = p_contradict < ALPHA_ONE_SIDED
            return "reproduced", "interval excludes 0" + (f", but also the paper's {points}: a smaller effect"
                                                          if smaller else "")
        if p_contradict < ALPHA_ONE_SIDED:
            if interval.estimate < 0 and p_reproduce > 1 - ALPHA_ONE_SIDED:
                return "contradicted", "interval below 0: the opposite of the claim"
            return "contradicted", f"interval excludes the paper's {points}"
    else:
        established = f"the smallest margin this sweep establishes is ±{100 * max(-interval.low, interval.high):.1f}"
        if p_reproduce < ALPHA_ONE_SIDED:
            return "reproduced", f"interval inside ±{claim.margin:g} pts: equivalent; {established}"
        if p_contradict < ALPHA_ONE_SIDED:
            return "contradicted", f"interval beyond ±{claim.margin:g} pts: not equivalent"
        return "inconclusive", (f"interval covers the margin ±{claim.margin:g}; {established} (±"
                                f"{100 * detectable:.1f} with {power.POWER:.0%} power)")
    return "inconclusive", (f"interval covers 0 and the paper's {points}; this sweep detects "
                            f"{100 * detectable:.1f} pts at {power.POWER:.0%} power")


def claim_differences(claim: Claim, scores: Mapping[tuple[str, str, str, str], np.ndarray], benches: Sequence[str],
                      ckpt: str, avg_metric: str) -> dict[str, np.ndarray] | None:
    """{bench: (S, P) method - baseline} for the claim's scope, or None if the sweep lacks any of it."""
    metric = avg_metric if claim.metric == AVG_AT_K else GREEDY
    scope = list(benches) if claim.benchmark == MEAN else [claim.benchmark]
    keys = [(label, ckpt, b, metric) for label in (claim.method, claim.baseline) for b in scope]
    if not scope or any(key not in scores for key in keys):
        return None
    return {b: scores[(claim.method, ckpt, b, metric)] - scores[(claim.baseline, ckpt, b, metric)] for b in scope}


def judge(claim: Claim, differences: Mapping[str, np.ndarray] | None,
          noise: TrainingNoise | None = None) -> Verdict:
    """The per-comparison verdict of one claim from its paired-difference matrices, with the sweep's pooled training
    noise for the claim's scope when given."""
    if differences is None:
        return Verdict(claim, "not evaluated", "the sweep has no scores for this method, baseline, benchmark or "
                                               "metric at the full budget")
    interval = difference_interval(differences, noise)
    n_seeds = next(iter(differences.values())).shape[0]
    if n_seeds < 2:  # a rehearsal, or a pilot: the interval would be over problems only
        return Verdict(claim, NOT_JUDGED, "one seed per label: the interval holds the problems' sampling, not "
                                          "training randomness; a verdict needs 2 or more seeds", interval)
    if interval.high == interval.low:
        return Verdict(claim, NOT_JUDGED, "every paired difference is the same (e.g. both at 0 on every problem): an "
                                          "interval without width says nothing about the claim", interval)
    components = pair_components(differences, interval.variance, noise, upper=True)
    detectable = power.detectable_effect(components, n_seeds,
                                         PARITY_POWER if claim.kind == "parity" else power.POWER)
    p_reproduce, p_contradict = claim_pvalues(claim, interval)
    verdict, reason = decide(claim, interval, p_reproduce, p_contradict, detectable)
    settle = power.seeds_needed(components, claim.effect / 100,
                                PARITY_POWER if claim.kind == "parity" else power.POWER)
    return Verdict(claim, verdict, reason, interval, detectable, p_reproduce, p_contradict, seeds_to_settle=settle)


def pair_components(differences: Mapping[str, np.ndarray], variance: CrossedVariance,
                    noise: TrainingNoise | None, upper: bool = False) -> power.VarianceComponents:
    """The variance components behind a pair's interval: its seed part pooled where the interval's is; with
    ``upper``, that pooled noise at its ``power.UPPER_LEVEL`` upper confidence bound (module docstring)."""
    own = power.variance_components(differences)
    if variance.basis == OWN:
        return own
    pooled = noise.for_pair(crossed_variance(differences))
    return own.pooled(power.upper_bound(pooled) if upper else pooled)


def with_holm(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts with Holm's family-wise version beside them (family: the judged claims of one sweep)."""
    judged = [i for i, v in enumerate(verdicts) if v.interval is not None and v.verdict != NOT_JUDGED]
    out = [dataclasses.replace(v, holm=NOT_JUDGED) if v.verdict == NOT_JUDGED else v for v in verdicts]
    if not judged:
        return out
    reproduce = holm_adjust([verdicts[i].p_reproduce for i in judged])
    contradict = holm_adjust([verdicts[i].p_contradict for i in judged])
    for i, p_rep, p_con in zip(judged, reproduce, contradict, strict=True):
        v = verdicts[i]
        holm, _ = decide(v.claim, v.interval, p_rep, p_con, v.detectable)
        out[i] = dataclasses.replace(v, holm=holm, holm_p_reproduce=p_rep, holm_p_contradict=p_con)
    return out


def baseline_gain(claim: Claim, scores: Mapping[tuple[str, str, str, str], np.ndarray], benches: Sequence[str],
                  ckpt: str, avg_metric: str, reference: Mapping[tuple[str, str], np.ndarray]) -> float | None:
    """Points the claim's baseline gained at ``ckpt`` over the warm start on the claim's benchmarks and metric (its
    mean over seeds and problems minus the warm start's, unweighted over benchmarks for the mean); ``reference``:
    (benchmark, metric) -> the warm start's (1, P) scores. None when the sweep lacks either."""
    metric = avg_metric if claim.metric == AVG_AT_K else GREEDY
    scope = list(benches) if claim.benchmark == MEAN else [claim.benchmark]
    if not scope or any((claim.baseline, ckpt, b, metric) not in scores or (b, metric) not in reference
                        for b in scope):
        return None
    return 100 * float(np.mean([scores[(claim.baseline, ckpt, b, metric)].mean() - reference[(b, metric)].mean()
                                for b in scope]))


def judge_claims(claims: Sequence[Claim], scores: Mapping[tuple[str, str, str, str], np.ndarray],
                 benches: Sequence[str], ckpt: str, avg_metric: str,
                 noise: Mapping[str, Mapping[tuple[str, ...], TrainingNoise]] | None = None,
                 reference: Mapping[tuple[str, str], np.ndarray] | None = None) -> list[Verdict]:
    """Every claim judged at ``ckpt`` (the full budget), with Holm over the evaluated ones; ``noise``: metric ->
    scope (sorted benchmark tuple) -> the sweep's pooled training noise; ``reference``: the warm start's scores
    ((benchmark, metric) -> (1, P)), for the baseline's gain over it."""
    noise = noise or {}
    judged = []
    for claim in claims:
        metric = avg_metric if claim.metric == AVG_AT_K else GREEDY
        scope = tuple(sorted(benches)) if claim.benchmark == MEAN else (claim.benchmark,)
        verdict = judge(claim, claim_differences(claim, scores, benches, ckpt, avg_metric),
                        noise.get(metric, {}).get(scope))
        gain = baseline_gain(claim, scores, benches, ckpt, avg_metric, reference or {})
        judged.append(dataclasses.replace(verdict, baseline_gain=gain))
    return with_holm(judged)


def detectability_rows(scores: Mapping[tuple[str, str, str, str], np.ndarray], labels: Sequence[str],
                       baseline: str | None, benches: Sequence[str], ckpt: str, metric: str,
                       noise: Mapping[tuple[str, ...], TrainingNoise] | None = None) -> list[dict]:
    """Per label vs the baseline, per benchmark and the mean: variance components (sd in points) of the paired
    difference, pooled as its interval is (``noise``: scope -> the sweep's training noise), which variance that is,
    and the detectable effect at 80% power for this sweep's S x P (points; None with one seed), the pooled training
    noise at its ``power.UPPER_LEVEL`` upper bound (``seed_sd_bound``), as the claims' detectable effects."""
    noise = noise or {}
    rows = []
    if baseline is None:
        return rows
    for label in labels:
        if label == baseline or any((lab, ckpt, b, metric) not in scores for lab in (label, baseline)
                                    for b in benches):
            continue
        for scope in [*benches, MEAN]:
            chosen = list(benches) if scope == MEAN else [scope]
            differences = {b: scores[(label, ckpt, b, metric)] - scores[(baseline, ckpt, b, metric)] for b in chosen}
            n_seeds = next(iter(differences.values())).shape[0]
            row = {"method": label, "baseline": baseline, "bench": scope, "n_seeds": n_seeds,
                   "n_problems": sum(d.shape[1] for d in differences.values()), "seed_sd": None,
                   "seed_sd_bound": None, "problem_sd": None, "residual_sd": None, "detectable": None,
                   "variance": None}
            if n_seeds > 1:
                scope_noise = noise.get(tuple(sorted(chosen)))
                interval = difference_interval(differences, scope_noise)
                comp = pair_components(differences, interval.variance, scope_noise)
                bound = pair_components(differences, interval.variance, scope_noise, upper=True)
                row["variance"] = interval.variance.basis
                row.update(seed_sd=100 * math.sqrt(comp.seed), seed_sd_bound=100 * math.sqrt(bound.seed),
                           problem_sd=100 * math.sqrt(max(comp.problem.values())),
                           residual_sd=100 * math.sqrt(max(comp.residual.values())),
                           detectable=100 * power.detectable_effect(bound, n_seeds))
            rows.append(row)
    return rows
