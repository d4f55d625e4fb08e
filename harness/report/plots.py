"""The report's figures (seaborn on matplotlib's Agg canvas; no pyplot state): accuracy against spent compute with
interval bands, per-benchmark point estimates, paired differences to the baseline, and training curves.

Intervals are drawn from the leaderboard's own rows (``harness.report.bootstrap``), never recomputed by seaborn, so a
band in a figure is the interval in the table. The training curves are the exception: the mean over seeds of
``metrics.jsonl`` with the seeds' range as its band (a diagnostic, not a claim; a bootstrap over 2-5 seeds would
claim more than it knows, and seaborn's resampling per step was the report job's largest cost).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: no display, deterministic rendering

import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from harness.config.paths import WARMSTART_LABEL, staging_file  # noqa: E402
from harness.data.score_names import AVG_AT_K
from harness.report.verdicts import MEAN  # noqa: E402

DPI = 110
STYLE = "whitegrid"
CONTEXT = "paper"
TRAINING_CURVES = {"reward": "training reward", "entropy": "entropy (nats)",
                   "completions/mean_length": "response length (tokens)"}
COMPUTE_AXES = {"spent/steps": "optimizer steps", "spent/tokens/generated": "tokens generated",
                "spent/tokens/forwarded": "tokens forwarded (training passes)"}
BUDGET_AXES = {"spent/budget/flops": "FLOPs (analytic, all phases)",
               "spent/budget/accel_seconds": "device-seconds of the training processes"}


def palette(labels: list[str]) -> dict[str, tuple]:
    colours = sns.color_palette("colorblind", max(len(labels), 1))
    return {label: colours[i] for i, label in enumerate(labels)}


def _new_figure(ncols: int, nrows: int = 1, width: float = 3.6, height: float = 3.0) -> tuple[Figure, list]:
    with sns.axes_style(STYLE), sns.plotting_context(CONTEXT):
        fig = Figure(figsize=(width * ncols, height * nrows), dpi=DPI, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    return fig, axes


def _accuracy_rows(summary: list[dict], metric: str) -> pd.DataFrame:
    rows = [r for r in summary if r["metric"] == metric and r["statistic"] == "mean"]
    return pd.DataFrame(rows)


def accuracy_vs_compute(summary: list[dict], labels: list[str], benches: list[str], metric: str,
                        x_key: str) -> Figure | None:
    """One panel per benchmark (and 'all'): the mean with its 95% band at each checkpoint, from the warm start."""
    frame = _accuracy_rows(summary, metric)
    runs = frame[frame.method != WARMSTART_LABEL]
    if x_key not in runs or runs[x_key].isna().any():
        return None
    frame.loc[frame.method == WARMSTART_LABEL, x_key] = 0.0  # the warm start has spent nothing
    colours = palette(labels)
    panels = [*benches, "all"]
    fig, axes = _new_figure(len(panels))
    for ax, bench in zip(axes, panels, strict=True):
        start = frame[(frame.method == WARMSTART_LABEL) & (frame.bench == bench)]
        for label in labels:
            line = pd.concat([start, frame[(frame.method == label) & (frame.bench == bench)]]).sort_values(x_key)
            x = line[x_key]
            ax.plot(x, 100 * line.estimate, marker="o", color=colours[label], label=label)
            ax.fill_between(x, 100 * line.ci_low, 100 * line.ci_high, color=colours[label], alpha=0.18, linewidth=0)
        if not start.empty:
            ax.errorbar([0.0], 100 * start.estimate, yerr=[100 * (start.estimate - start.ci_low),
                                                            100 * (start.ci_high - start.estimate)],
                        fmt="s", color="black", label="warm start")
        ax.set_title(bench if bench != "all" else "mean over benchmarks")
        ax.set_xlabel({**COMPUTE_AXES, **BUDGET_AXES}[x_key])
        ax.set_ylabel(f"{metric} (%)")
    axes[-1].legend(fontsize="small", loc="best")
    return fig


def per_benchmark(summary: list[dict], labels: list[str], benches: list[str], metric: str, ckpt: str) -> Figure:
    """Point estimates with 95% intervals per benchmark at one checkpoint, methods side by side."""
    frame = _accuracy_rows(summary, metric)
    colours = palette(labels)
    fig, (ax,) = _new_figure(1, width=max(4.0, 1.6 * (len(benches) + 1) + 0.4 * len(labels)))
    panels = [*benches, "all"]
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        rows = frame[(frame.method == label) & (frame.ckpt == ckpt)].set_index("bench").reindex(panels)
        x = [j - 0.4 + width * (i + 0.5) for j in range(len(panels))]
        ax.errorbar(x, 100 * rows.estimate, yerr=[100 * (rows.estimate - rows.ci_low),
                                                   100 * (rows.ci_high - rows.estimate)],
                    fmt="o", color=colours[label], label=label, capsize=3)
    start = frame[frame.method == WARMSTART_LABEL].set_index("bench").reindex(panels)
    ax.scatter(range(len(panels)), 100 * start.estimate, marker="_", s=600, color="black", label="warm start")
    ax.set_xticks(range(len(panels)), [b if b != "all" else "mean over benchmarks" for b in panels])
    ax.set_ylabel(f"{metric} (%), 95% CI")
    ax.set_title(f"{ckpt}")
    ax.legend(fontsize="small", loc="best")
    return fig


def differences(summary: list[dict], labels: list[str], benches: list[str], metric: str, ckpt: str,
                baseline: str, claimed: dict[tuple[str, str], float] | None = None) -> Figure | None:
    """The forest plot: paired difference to the baseline with its 95% interval, per benchmark and averaged; 0 = no
    difference; ``claimed``: (label, benchmark or 'all') -> the paper's claimed difference (points), marked."""
    rows = [r for r in summary if r["metric"] == metric and r["statistic"] == "mean" and r["ckpt"] == ckpt
            and r.get("diff") is not None]
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    compared = [lab for lab in labels if lab in set(frame.method)]
    colours = palette(labels)
    panels = [*benches, "all"]
    fig, axes = _new_figure(len(panels), width=3.0, height=0.5 * len(compared) + 1.4)
    for ax, bench in zip(axes, panels, strict=True):
        part = frame[frame.bench == bench].set_index("method").reindex(compared)
        y = list(range(len(compared)))
        for yi, label in zip(y, compared, strict=True):
            row = part.loc[label]
            ax.errorbar([100 * row["diff"]], [yi], xerr=[[100 * (row["diff"] - row.diff_ci_low)],
                                                         [100 * (row.diff_ci_high - row["diff"])]],
                        fmt="o", color=colours[label], capsize=3)
            if (label, bench) in (claimed or {}):
                ax.plot([claimed[(label, bench)]], [yi], marker="D", markersize=6, markerfacecolor="none",
                        markeredgecolor="crimson", linestyle="none", label="claimed")
        ax.axvline(0.0, color="black", linewidth=0.8)
        if ax.get_legend_handles_labels()[0]:
            handles, names = ax.get_legend_handles_labels()
            ax.legend(handles[:1], names[:1], loc="best", fontsize="small")
        ax.set_yticks(y, compared)
        ax.invert_yaxis()
        ax.set_title(bench if bench != "all" else "mean over benchmarks")
        ax.set_xlabel(f"Δ {metric} vs {baseline} (points)")
    return fig


def training_curves(metrics: dict[tuple[str, int], list[dict]], labels: list[str]) -> Figure | None:
    """Reward, entropy and response length per optimizer step: the mean over seeds, the band their range."""
    records = [{"method": label, "seed": seed, **{k: m.get(k) for k in ("step", *TRAINING_CURVES)}}
               for (label, seed), ms in metrics.items() for m in ms]
    if not records:
        return None
    frame = pd.DataFrame(records)
    keys = [k for k in TRAINING_CURVES if k in frame and frame[k].notna().any()]
    if not keys:
        return None
    colours = palette(labels)
    fig, axes = _new_figure(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        sns.lineplot(data=frame, x="step", y=key, hue="method", hue_order=labels, palette=colours,
                     errorbar=("pi", 100), ax=ax, legend=key == keys[-1])
        ax.set_ylabel(TRAINING_CURVES[key])
        ax.set_title(TRAINING_CURVES[key])
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    tmp = staging_file(path)
    fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
    tmp.replace(path)
    return path


def claimed_differences(claims, baseline: str | None) -> dict[tuple[str, str], float]:
    """(label, benchmark or 'all') -> the claimed difference (points) of each improvement claim on the sampled
    metric against the sweep's baseline (``verdicts.Claim``), for the forest plot."""
    return {(c.method, "all" if c.benchmark == MEAN else c.benchmark): c.difference for c in claims
            if c.kind == "improvement" and c.metric == AVG_AT_K and c.baseline == baseline}


def write_figures(evidence, summary: list[dict], out_dir: Path, claims=()) -> dict[str, Path]:
    """Render every figure the sweep has data for; return {name: PNG path}. ``claims``: the judged claims, marked
    on the forest plot."""
    metric, labels, benches = evidence.avg_metric, evidence.labels, evidence.benches
    final = evidence.final_ckpt
    # steps and tokens always; the budget's FLOPs and accelerator seconds too once the trainer logs them. The
    # per-phase splits (generation, old log-probs, reference, train) stay in the CSV: as figures they repeated the
    # totals' picture (and flops/generation and seconds/generation shared one file name)
    axes = [*COMPUTE_AXES, *(x for x in BUDGET_AXES if any(x in row for row in summary))]
    figures = {f"accuracy_vs_{x.split('/')[-1]}": accuracy_vs_compute(summary, labels, benches, metric, x)
               for x in axes}
    figures["per_benchmark"] = per_benchmark(summary, labels, benches, metric, final)
    if evidence.baseline:
        figures["difference_to_baseline"] = differences(summary, labels, benches, metric, final, evidence.baseline,
                                                        claimed_differences(claims, evidence.baseline))
    figures["training_curves"] = training_curves(evidence.metrics, labels)
    written = {name: save_png(fig, out_dir / f"{name}.png") for name, fig in figures.items() if fig is not None}
    for stale in set(out_dir.glob("*.png")) - set(written.values()):  # an earlier report's figure this one lacks
        stale.unlink()
    return written
