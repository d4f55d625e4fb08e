"""The training noise of a paired difference, pooled over the sweep's labels and moderated toward each pair's own,
and a pair's crossed variance with its seed part taken from it. Pure functions over numpy arrays; no I/O.
Measurements of these rules: docs/statistics.md.

Paired differences pool the training noise (``pooled_training_noise``, ``pooled_variance``). The same training
randomness recurs in every label of a sweep, so the seed variance of a paired difference beyond its seed x problem
residual is estimated from all L labels: a randomised-block analysis of the labels x seeds table of seed means (the
seed index is the block: what a seed shares across labels cancels in a paired difference), (L - 1)(S - 1) degrees of
freedom where one pair has S - 1. Each pair keeps its own residual and problem parts. This assumes training noise of
one size for every method. Where the labels' own seed variances spread more than their sampling explains, each
pair's training noise is moderated toward its own (empirical Bayes, limma: Smyth 2004, Stat. Appl. Genet. Mol.
Biol. 3(1) art. 3): (d0 T + d T_own) / (d0 + d) with the pooled T as the prior, the pair's own T_own (d = S - 1 df)
and the prior degrees of freedom d0 from the spread of the labels' log seed variances (``labels_prior_df``,
``TrainingNoise.for_pair``; ``MODERATED``). A preset's A/A calibration (harness/report/calibration.py) adds its noise
estimate with its degrees of freedom (``TrainingNoise.combined``). Every interval records which seed variance it
used (``CrossedVariance.basis``). Over benchmarks (each weighted 1/M, seeds shared) the rows are the
benchmark-averaged per-seed scores, each benchmark adds its own problem and residual terms (w^2 each), and the
degrees of freedom are the smallest benchmark's. With one seed the seed part cannot be estimated and the interval
covers problem sampling only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import special

from harness.report.scores import CrossedVariance, crossed_variance

OWN, POOLED, CALIBRATED = "own seeds", "pooled", "pooled + A/A calibration"
MODERATED = {POOLED: "pooled, moderated toward own seeds",
             CALIBRATED: "pooled + A/A calibration, moderated toward own seeds"}  # ``TrainingNoise.for_pair``
VARIANCE_BASES = (OWN, POOLED, CALIBRATED, *MODERATED.values())


@dataclass(frozen=True)
class TrainingNoise:
    """The training-noise variance of a paired difference of two labels' (benchmark-averaged) seed means beyond
    their seed x problem residual (accuracy fractions^2), its degrees of freedom (``external_df`` of them from an A/A
    calibration, which more seeds of the sweep do not add to), the variance basis it gives, and the prior degrees of
    freedom with which each pair's own seed variance is moderated toward it (``labels_prior_df``; inf: not at all)."""

    variance: float
    df: float
    basis: str = POOLED
    external_df: float = 0.0
    prior_df: float = math.inf

    def combined(self, external: TrainingNoise) -> TrainingNoise:
        """Both estimates pooled by their degrees of freedom (an external A/A calibration added to a sweep's)."""
        df = self.df + external.df
        return TrainingNoise((self.df * self.variance + external.df * external.variance) / df, df, CALIBRATED,
                             self.external_df + external.df, self.prior_df)

    def for_pair(self, own: CrossedVariance) -> TrainingNoise:
        """The training noise one pair's interval uses: this one, or with a finite ``prior_df`` d0 moderated toward
        the pair's own, T~ = max(0, (d0 T + d T_own) / (d0 + d)) with d = S - 1 and min(d0 + d, df) degrees of
        freedom (basis ``MODERATED[basis]``); T_own = S (seed - residual) is the pair's own seed variance beyond its
        residual. Its ``external_df`` (what more seeds do not add to, ``power.VarianceComponents.pooled``) is d0 where
        d0 + d sets the degrees of freedom (each seed adds one), else this noise's own."""
        if math.isinf(self.prior_df):
            return self
        n_seeds = own.seed_df + 1
        own_noise = n_seeds * (own.seed - own.residual)
        weights = self.prior_df + own.seed_df
        variance = max(0.0, (self.prior_df * self.variance + own.seed_df * own_noise) / weights)
        external = self.prior_df if weights < self.df else self.external_df
        return TrainingNoise(variance, min(weights, self.df), MODERATED[self.basis], external)


def row_residual(scores: Mapping[str, np.ndarray]) -> float:
    """sum_b w^2 MS_resid_b / P_b: the seed x problem residual's share of the variance of one seed's benchmark-averaged
    row (S x ``crossed_variance(...).residual``); 0 with one seed."""
    n_seeds = next(iter(scores.values())).shape[0]
    return n_seeds * crossed_variance(scores).residual if n_seeds > 1 else 0.0


def pooled_training_noise(scores: Mapping[str, Mapping[str, np.ndarray]]) -> TrainingNoise:
    """The training noise of a paired difference from every label's scores {label: {bench: (S, P_b)}}, a
    randomised-block analysis of the labels x seeds table of benchmark-averaged seed means (seeds are the blocks:
    seed index i is shared by every label, so what it shares cancels in each paired difference).

    With L labels the interaction mean square MS_LS ((L - 1)(S - 1) df) is half the mean over all label pairs of
    the variance of their per-seed difference, and the three-way label x seed x problem interaction MS_LSP_b is half
    the mean of their seed x problem residuals. So

        T = max(0, 2 MS_LS - 2 sum_b w^2 MS_LSP_b / P_b)     ((L - 1)(S - 1) df)

    is the mean pair's seed variance less its residual share. It assumes training noise of one size for every label;
    ``prior_df`` says how far the labels' own seed variances bear that out (``labels_prior_df``). One label (an A/A
    calibration sweep): no blocks to remove, T = 2 max(0, var_s(R_s) - row residual), S - 1 df.
    """
    labels = sorted(scores)
    benches = sorted(scores[labels[0]])
    n_labels, n_seeds = len(labels), scores[labels[0]][benches[0]].shape[0]
    if n_seeds < 2:
        raise ValueError("pooled_training_noise: one seed shows no training noise; it needs >= 2 seeds")
    if n_labels == 1:
        only = scores[labels[0]]
        rows = np.mean([only[b].mean(axis=1) for b in benches], axis=0)
        return TrainingNoise(2 * max(0.0, float(rows.var(ddof=1)) - row_residual(only)), n_seeds - 1, POOLED)
    w = 1.0 / len(benches)
    table = np.mean([np.stack([scores[lab][b].mean(axis=1) for lab in labels]) for b in benches], axis=0)  # (L, S)
    df = (n_labels - 1) * (n_seeds - 1)
    ms_ls = float((_doubly_centred(table) ** 2).sum()) / df
    residual = 0.0
    for bench in benches:
        cube = np.stack([scores[lab][bench] for lab in labels])  # (L, S, P)
        n_problems = cube.shape[2]
        if n_problems < 2:
            continue
        ms_lsp = float((_triply_centred(cube) ** 2).sum()) / (df * (n_problems - 1))
        residual += w**2 * ms_lsp / n_problems
    return TrainingNoise(max(0.0, 2 * ms_ls - 2 * residual), df, POOLED, prior_df=labels_prior_df(table))


def training_share(scores: Mapping[str, Mapping[str, np.ndarray]]) -> float:
    """The share of a paired difference's per-seed variance that is training noise, T / 2 MS_LS (the rest, 2 sum_b
    w^2 MS_LSP_b / P_b, is the seed x problem residual: sampling), from {label: {bench: (S, P_b)}} of >= 2 labels
    and seeds; nan when the labels x seeds table has no interaction at all. The coverage study's cells are indexed by
    it (docs/statistics.md, 'Coverage')."""
    labels = sorted(scores)
    benches = sorted(scores[labels[0]])
    table = np.mean([np.stack([scores[lab][b].mean(axis=1) for lab in labels]) for b in benches], axis=0)
    per_seed = 2 * float((_doubly_centred(table) ** 2).sum()) / ((len(labels) - 1) * (table.shape[1] - 1))
    return pooled_training_noise(scores).variance / per_seed if per_seed > 0 else math.nan


def labels_prior_df(table: np.ndarray) -> float:
    """limma's prior degrees of freedom d0 from the labels x seeds table (L, S) of seed means (Smyth 2004, section
    6.2): each label's seed variance s_l^2 = L / ((L - 1)(S - 1)) sum_s e_ls^2 from the doubly-centred table e (seeds
    as blocks), which under one noise size is sigma^2 chi2_{S-1} / (S - 1); log s_l^2 then varies by
    trigamma((S - 1) / 2), and what the labels' log variances vary beyond it is trigamma(d0 / 2). inf (moderate
    nothing) when they vary no more than sampling explains, or fewer than 3 labels show any spread."""
    n_labels, n_seeds = table.shape
    spread = n_labels / ((n_labels - 1) * (n_seeds - 1)) * (_doubly_centred(table) ** 2).sum(axis=1)
    logs = np.log(spread[spread > 0])
    if len(logs) < 3:
        return math.inf
    excess = float(logs.var(ddof=1) - special.polygamma(1, (n_seeds - 1) / 2))
    return 2 * float(trigamma_inverse(np.array(excess))) if excess > 0 else math.inf


def trigamma_inverse(x: np.ndarray) -> np.ndarray:
    """y > 0 with trigamma(y) = x > 0 (limma's Newton iteration from y = 1/2 + 1/x, which converges from below)."""
    y = 0.5 + 1 / x
    for _ in range(50):
        trigamma = special.polygamma(1, y)
        step = trigamma * (1 - trigamma / x) / special.polygamma(2, y)
        y = y + step
        if np.all(-step / y < 1e-12):
            break
    return y


def _doubly_centred(x: np.ndarray) -> np.ndarray:
    """x (A, B, ...) less its row and column means plus the grand mean over the first two axes."""
    return x - x.mean(axis=0, keepdims=True) - x.mean(axis=1, keepdims=True) + x.mean(axis=(0, 1), keepdims=True)


def _triply_centred(cube: np.ndarray) -> np.ndarray:
    """The three-way interaction of cube (L, S, P): each cell less every one- and two-way mean."""
    return _doubly_centred(cube - cube.mean(axis=2, keepdims=True))  # less the label x seed (and lower) means


def pooled_variance(own: CrossedVariance, noise: TrainingNoise | None) -> CrossedVariance:
    """A pair's crossed variance with its seed part from the pooled training noise, (T + r) / S with T's degrees of
    freedom and r the pair's own row residual, T moderated toward the pair's own where the labels' seed variances
    spread (``TrainingNoise.for_pair``). One seed: its own."""
    if noise is None or not own.seed_df >= 1:
        return own
    n_seeds = own.seed_df + 1
    noise = noise.for_pair(own)
    return dataclasses.replace(own, seed=(noise.variance + n_seeds * own.residual) / n_seeds, seed_df=noise.df,
                               basis=noise.basis)
