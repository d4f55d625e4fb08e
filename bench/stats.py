"""Robust statistics of paired, interleaved measurements: medians with interquartile ranges, per-pair ratios and a
percentile-bootstrap interval of their median (numpy-free, so a summary can be recomputed anywhere)."""

from __future__ import annotations

import random
import statistics


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) without numpy."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: list[float]) -> dict:
    """median, interquartile range, min, max, n of a sample."""
    if not values:
        return {"n": 0, "median": float("nan"), "q25": float("nan"), "q75": float("nan"),
                "min": float("nan"), "max": float("nan")}
    return {"n": len(values), "median": statistics.median(values), "q25": quantile(values, 0.25),
            "q75": quantile(values, 0.75), "min": min(values), "max": max(values)}


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Ratios of paired measurements (same block, interleaved): the median of the per-pair ratios with their
    interquartile range and extremes, plus the ratio of the medians."""
    pairs = [(a, b) for a, b in zip(numerator, denominator, strict=True) if b > 0]
    ratios = [a / b for a, b in pairs]
    out = describe(ratios)
    med_b = statistics.median([b for _, b in pairs]) if pairs else float("nan")
    out["ratio_of_medians"] = (statistics.median([a for a, _ in pairs]) / med_b) if pairs and med_b else float("nan")
    out["ratio_of_sums"] = sum(a for a, _ in pairs) / sum(b for _, b in pairs) if pairs else float("nan")
    out["ci90_median"] = bootstrap_median_ci(ratios)
    return out


def bootstrap_median_ci(values: list[float], level: float = 0.90, resamples: int = 2000, seed: int = 0) -> list:
    """Percentile bootstrap interval of the median (fixed seed: the same data give the same interval)."""
    if len(values) < 3:
        return [float("nan"), float("nan")]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return [quantile(medians, tail), quantile(medians, 1 - tail)]


def fmt_ratio(r: dict, digits: int = 2, ci: bool = True) -> str:
    """'1.01 [0.95-1.06] (0.98-1.03)': median of per-pair ratios [interquartile range] (90% bootstrap interval
    of the median)."""
    if not r or r.get("n", 0) == 0:
        return "n/a"
    text = f"{r['median']:.{digits}f} [{r['q25']:.{digits}f}-{r['q75']:.{digits}f}]"
    if ci and r.get("ci90_median") and r["ci90_median"][0] == r["ci90_median"][0]:
        lo, hi = r["ci90_median"]
        text += f" ({lo:.{digits}f}-{hi:.{digits}f})"
    return text
