"""Score matrices, the data every statistic of the leaderboard takes, and the variance of their grand mean over the
crossed seed x problem design. Pure functions over numpy arrays; no I/O. Measurements of these rules:
docs/statistics.md.

Data. For one method, checkpoint and benchmark the evidence is a matrix ``scores`` (S, P): S seeds (the unit of
replication: one trained model each) by P problems (the unit of evaluation), each cell the mean correctness of the
k sampled completions of that problem (avg@k of one problem). Every method of a sweep shares the seeds' indices
(the sweep's seed list) and the benchmark's problems, so two methods' matrices are paired cell by cell.

Means: a t interval on the crossed seed x problem variance (``crossed_variance``). The cells follow the two-way
random-effects model x_sp = mu + a_s + b_p + e_sp (seeds and problems crossed), so the grand mean has variance
sigma_a^2 / S + sigma_b^2 / P + sigma_e^2 / (S P). From the mean squares (ANOVA; Searle, Casella & McCulloch 1992,
"Variance Components", ch. 4)

    MS_seed = P var(row means)  (S - 1 df),   E = P sigma_a^2 + sigma_e^2
    MS_problem = S var(column means)  (P - 1 df),   E = S sigma_b^2 + sigma_e^2
    MS_resid = residual mean square  ((S - 1)(P - 1) df),   E = sigma_e^2

it splits into

    seed part = MS_seed / (S P) = var(row means) / S,  S - 1 df (it holds the residual part as well),
    problem part = max(0, MS_problem - MS_resid) / (S P)  (a variance component is not negative), P - 1 df,
    residual part = MS_resid / (S P),  (S - 1)(P - 1) df.

The half-width is the wider of the seed-level sqrt((t_{S-1} sqrt(seed))^2 + (t_{P-1} sqrt(problem))^2) and the
residual floor sqrt((t_{(S-1)(P-1)} sqrt(residual))^2 + (t_{P-1} sqrt(problem))^2) (``CrossedVariance.half_width``):
with S = 2 the seed part rests on one degree of freedom, and when two seeds agree by chance it falls below the
residual it contains; the floor keeps the interval from collapsing there, and such intervals are marked
(``rests_on_floor``, ‡ in the reports): a floor cannot tell chance agreement from small training randomness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

CONFIDENCE = 0.95


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile, ``scipy.stats.t.ppf(q, df)`` to the bit: scipy's t distribution computes it as
    ``special.stdtrit(df, q)`` inside a generic wrapper (argument checks, broadcasting) that costs 40x the function
    itself; the report asks for tens of thousands of quantiles (p-values solve for a level). nan for df <= 0 or nan,
    as ``ppf`` gives (tests/test_stats.py compares them)."""
    return special.stdtrit(df, q)


# --- per-problem scores -------------------------------------------------------------------------------------------


def per_problem_scores(samples: Iterable[Mapping], mode: str = "sampled") -> dict[str, float]:
    """Rows of ``samples.jsonl`` -> {problem id: mean correctness of its ``mode`` samples}.

    Problems with an ungradable sample are left out, as ``harness.evaluation.driver.summarize`` leaves them out of
    avg@k.
    """
    correct: dict[str, list[bool]] = {}
    ungradable: set[str] = set()
    for row in samples:
        if row["mode"] != mode:
            continue
        pid = str(row["id"])
        correct.setdefault(pid, []).append(bool(row["correct"]))
        if not row.get("gradable", True):
            ungradable.add(pid)
    return {pid: sum(c) / len(c) for pid, c in correct.items() if pid not in ungradable}


def score_matrix(per_seed: Sequence[Mapping[str, float]], problem_ids: Sequence[str]) -> np.ndarray:
    """Per-seed {problem id: score} -> (S, P) in ``problem_ids`` order; a missing problem raises."""
    matrix = np.empty((len(per_seed), len(problem_ids)))
    for i, scores in enumerate(per_seed):
        missing = [pid for pid in problem_ids if pid not in scores]
        if missing:
            raise ValueError(f"seed index {i}: no score for problem(s) {missing[:5]} (of {len(missing)})")
        matrix[i] = [scores[pid] for pid in problem_ids]
    return matrix


# --- the crossed seed x problem variance --------------------------------------------------------------------------


@dataclass(frozen=True)
class CrossedVariance:
    """The parts of the variance of a (benchmark-averaged) grand mean over a seed x problem design.

    ``seed``: var_s(R_s) / S = MS_seed / (S P), the spread of the seeds' (benchmark-averaged) rows, with ``seed_df``
    = S - 1 (0 and nan with one seed); ``problem``: sum_b w^2 max(0, MS_problem_b - MS_resid_b) / (S P_b), the
    sampling of the problems, with ``problem_df`` = min_b P_b - 1 (with one seed: sum_b w^2 var(column means) /
    P_b); ``residual``: sum_b w^2 MS_resid_b / (S P_b), the seed x problem part that the seed part holds in
    expectation, with ``residual_df`` = min_b (S - 1)(P_b - 1) (0 and nan with one seed).
    """

    seed: float
    seed_df: float
    problem: float
    problem_df: float
    residual: float = 0.0
    residual_df: float = math.nan
    basis: str = "own seeds"  # which seed variance the interval used: ``VARIANCE_BASES``

    @property
    def total(self) -> float:
        """The variance the interval stands on: the seed part, never below the residual part, plus the problem
        part."""
        return max(self.seed, self.residual) + self.problem

    def _terms(self, one_sided_level: float) -> tuple[float, float, float]:
        """The squared half-width terms t^2 * part of the problem, seed and residual parts at this level."""
        def term(variance: float, df: float) -> float:
            return t_quantile(1 - one_sided_level, df) ** 2 * variance if variance > 0 else 0.0

        return (term(self.problem, self.problem_df), term(self.seed, self.seed_df),
                term(self.residual, self.residual_df))

    def half_width(self, one_sided_level: float) -> float:
        """The wider of the seed-level half-width sqrt((t_{S-1} sqrt(seed))^2 + (t_{P-1} sqrt(problem))^2) and the
        residual floor sqrt((t_{(S-1)(P-1)} sqrt(residual))^2 + (t_{P-1} sqrt(problem))^2) (module docstring)."""
        problem, seed, residual = self._terms(one_sided_level)
        return math.sqrt(problem + max(seed, residual))

    @property
    def rests_on_floor(self) -> bool:
        """Whether the 95% (``CONFIDENCE``) interval is the residual floor: the residual term t_{(S-1)(P-1)}^2
        residual exceeds the seed term t_{S-1}^2 seed, i.e. the seeds agreed more closely than their seed x problem
        residual implies. Such an interval is too narrow if training randomness is in fact large (docs/statistics.md,
        "Means"), so the reports mark it. Never with one seed (no residual part)."""
        _, seed, residual = self._terms((1 - CONFIDENCE) / 2)
        return bool(residual > seed)  # a Python bool: it goes into leaderboard.json


def crossed_variance(scores: Mapping[str, np.ndarray]) -> CrossedVariance:
    """The seed, problem and residual parts of the variance of the benchmark-averaged grand mean of ``scores``
    {bench: (S, P_b)} (module docstring). Each benchmark weighs 1/M; the seeds (rows) are shared by the benchmarks.

    seed = var_s(R_s) / S,   R_s = sum_b w mean_p x_b[s, p]
    problem = sum_b w^2 max(0, MS_problem_b - MS_resid_b) / (S P_b)
    residual = sum_b w^2 MS_resid_b / (S P_b)
    """
    benches = sorted(scores)
    w = 1.0 / len(benches)
    n_seeds = scores[benches[0]].shape[0]
    seed, seed_df = 0.0, math.nan
    if n_seeds > 1:
        rows = np.mean([scores[b].mean(axis=1) for b in benches], axis=0)  # (S,) benchmark-averaged seed scores
        seed, seed_df = float(rows.var(ddof=1)) / n_seeds, n_seeds - 1
    problem, residual, residual_dfs = 0.0, 0.0, []
    for bench in benches:
        x = scores[bench]
        assert x.shape[0] == n_seeds, (bench, x.shape, n_seeds)
        n_problems = x.shape[1]
        if n_problems < 2:
            continue
        columns = x.mean(axis=0)
        if n_seeds == 1:  # no seed part: the column variance is the problem sampling of the one model
            problem += w**2 * float(columns.var(ddof=1)) / n_problems
            continue
        ms_problem = n_seeds * float(columns.var(ddof=1))
        cells = x - x.mean(axis=1, keepdims=True) - columns + x.mean()
        df = (n_seeds - 1) * (n_problems - 1)
        ms_resid = float((cells**2).sum()) / df
        problem += w**2 * max(0.0, ms_problem - ms_resid) / (n_seeds * n_problems)
        residual += w**2 * ms_resid / (n_seeds * n_problems)
        residual_dfs.append(df)
    problem_df = max(1, min(scores[b].shape[1] for b in benches) - 1)
    return CrossedVariance(seed, seed_df, problem, problem_df, residual, min(residual_dfs, default=math.nan))
