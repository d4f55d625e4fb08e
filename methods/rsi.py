"""RSI: Relative Surprisal Index token selection (Lv, Zheng, ..., Chen; arXiv 2606.31575, Jun 2026).

No official code was found (docs/methods.md, "RSI"). The definition used by every reimplementation found
(TRL-style ``relative_surprisal_index``, open-instruct ``rsi_token_selection``, OpenRLHF ``token_surprisal_filter``)
and supported by the abstract's claim (docs/methods.md "RSI", derived: d ln||grad_z|| / d ln H = 1 / (1 - RSI)):

    RSI_{i,t} = s_{i,t} / H_{i,t} = -log pi_theta(y_{i,t}) / H_{i,t}          (surprisal relative to its expectation)
    S_{i,t}   = M_{i,t} & (H_{i,t} > 0) & (low <= RSI_{i,t} <= high)          (RSI-S: the "stable interval")
    L         = sum_{i,t} S l / sum_{i,t} M                                  (token-mean; denominator="all")

THE BAND [0.5, 2.0] IS AN ASSUMPTION: the paper's values are not known; [0.5, 2.0] is the default of the
third-party ports ([0.1, 3.0] in another). A fixed band is an entropy-adaptive surprisal band s in [low H, high H].

Denominator: "all" (default) keeps the baseline's denominator over every completion token, as the
reimplementations do (they multiply the per-token loss by the mask); "selected" divides by the selected tokens.
The official choice is unknown.

H = 0 (a one-hot policy; in float arithmetic also H < 0): RSI = s / 0 is undefined, so the token is not kept. Its
policy gradient vanishes anyway: with p = e_y the logit gradient p - e_y is zero.

Deviations (also in ``RSI.deviations``): no official code; band, fixed (not batch-quantile) interval, denominator and
the H = 0 rule are this project's assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from methods.base import (
    Method,
    RolloutBatch,
    StepContext,
    TokenStats,
    TokenWeights,
    aggregate,
)
from methods.declaration import check_declared, setting
from methods.registry import register_method

DENOMINATORS = ("all", "selected")


def relative_surprisal_index(logp: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """RSI = -logp / H, (B, T) float64 (so the band ends compare exactly); NaN where H <= 0 (undefined)."""
    entropy = entropy.to(torch.float64)
    rsi = -logp.to(torch.float64) / entropy.clamp(min=torch.finfo(torch.float64).tiny)
    return torch.where(entropy > 0, rsi, torch.full_like(rsi, math.nan))


@register_method("rsi")
class RSI(Method):
    """Keep tokens whose surprisal / entropy lies in a fixed band [low, high] (band assumed, see module docstring)."""

    needs = frozenset({"entropy"})
    deviations = (
        "no official code: RSI = -logp / H as in the third-party ports",
        "band [0.5, 2.0] assumed (third-party default); fixed interval, not batch quantiles",
        "denominator 'all' (the ports keep the usual denominator) assumed; switch: denominator",
        "H <= 0 (RSI undefined) is not kept",
    )

    @dataclass
    class Config:
        low: float = setting(
            0.5, "Lower end a of the kept RSI band (inclusive); ASSUMED, the paper's value is unknown.", low=0.0)
        high: float | None = setting(
            2.0, "Upper end b of the kept RSI band (inclusive); null: no upper end, every token from a up is kept; "
            "ASSUMED, the paper's value is unknown.")
        denominator: str = setting(
            "all", '"all": the run\'s aggregation over every completion token, unselected ones weigh 0 (ports); '
            '"selected": the run\'s aggregation over the selected tokens.', choices=DENOMINATORS)

        def __post_init__(self):
            check_declared(self, "method.")
            if self.high is not None and not self.high >= self.low:  # also rejects NaN
                raise ValueError(f"method.high must be >= method.low = {self.low!r} or null, got {self.high!r}")

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        if stats.entropy is None:
            raise ValueError("method 'rsi' needs stats.entropy (declared in RSI.needs)")
        mask = batch.completion_mask > 0  # (B, T)
        rsi = relative_surprisal_index(stats.logp.detach(), stats.entropy.detach())  # (B, T), NaN where H <= 0
        # S = M & (a <= s/H <= b); NaN compares False, so H <= 0 is never kept
        high = math.inf if self.config.high is None else self.config.high
        selected = (mask & (rsi >= self.config.low) & (rsi <= high)).to(torch.float32)
        n = max(int(mask.sum()), 1)
        defined = mask & ~torch.isnan(rsi)
        metrics = {"tokens_selected_frac": float(selected.sum()) / n,
                   "rsi_below_frac": float((defined & (rsi < self.config.low)).sum()) / n,
                   "rsi_above_frac": float((defined & (rsi > high)).sum()) / n,
                   "rsi_undefined_frac": float((mask & torch.isnan(rsi)).sum()) / n}
        if self.config.denominator == "selected":
            return aggregate(selected, ctx, metrics)
        return aggregate(batch.completion_mask, ctx, metrics, trained=selected)
