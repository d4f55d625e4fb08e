"""``harness summarize``: one page across sweeps: every method's difference to its sweep's baseline as a forest
plot, every claim with its verdict, the training each sweep reached against the paper's run, and each sweep's
departures from its paper's protocol as footnotes.

Read per sweep result folder (``results/<sweep>/``), nothing statistical recomputed:
  * ``leaderboard.json`` (``harness report``): the summary rows at the full budget (Δ to the sweep's baseline on the
    mean over benchmarks, its 95% interval and the leaderboard's mark; the realised budget per label), the judged
    claims with their verdicts, and the resolved configuration the report ran with;
  * the paper's run (``training`` of configs/reported/<sweep>.yaml) and the protocol fidelity
    (configs/fidelity/<sweep>.yaml, checked against the configuration leaderboard.json holds): the files the report
    itself reads for these tables, which leaderboard.json does not copy;
  * for a partial sweep, the run and evaluation files on disk (``evidence.find_failures``), to say what is missing;
    a folder without leaderboard.json is named from its ``sweep.yaml`` (written when Snakemake parses the sweep).

Written into the output folder: ``summary.md``, ``summary.html`` (self-contained: the figure as a data URI),
``summary.json``, ``forest.png`` and ``forest.svg``; the pages come from ``templates/summary.*.j2``.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # as plots.py: no display, deterministic rendering

import seaborn as sns  # noqa: E402
from jinja2 import Environment, PackageLoader, StrictUndefined  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from harness.config.loading import merge_config, resolve  # noqa: E402
from harness.config.paths import CONFIG_DIR, WARMSTART_LABEL, SweepPaths, checkpoint_name, staging_file  # noqa: E402
from harness.config.schema import ConfigError, PresetConfig, Resolved, SweepConfig  # noqa: E402
from harness.data.files import read_json, write_json_atomic, write_text_atomic  # noqa: E402
from harness.data.score_names import AVG_AT_K, GREEDY, avg_at
from harness.report import plots  # noqa: E402
from harness.report.evidence import WARMSTART_CKPT, find_failures  # noqa: E402
from harness.report.fidelity import Fidelity, load_fidelity  # noqa: E402
from harness.report.reported import Reported, load_reported  # noqa: E402
from harness.report.tables import FLOOR_LEGEND, FLOOR_MARK, paper_training_cell, trained_cell, with_ci  # noqa: E402
from harness.report.verdicts import MEAN, Claim  # noqa: E402

FORMAT = "harness-summary/1"
LEADERBOARD = "leaderboard.json"
SWEEP_FILE = "sweep.yaml"  # SweepPaths.sweep_file: JSON, written by the Snakefile at every parse
SUMMARY_MEAN = "all"  # the summary rows' benchmark for the mean over benchmarks (a claim's "mean")
FIGURE = "forest"
LEADERBOARD_KEYS = ("config", "summary", "claims")
CLAIM_COLOUR = "crimson"  # the claimed difference's diamond, as on report.html's forest plot (plots.differences)


class NotASweepError(ValueError):
    """A folder given to ``harness summarize`` that is not a sweep result folder; the message names it."""


# --- one sweep ----------------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """One sweep result folder as read: its leaderboard.json (None: the report has not run), what is missing, and
    the paper's protocol fidelity and training length where the sweep has a paper."""

    folder: Path
    setting: str  # the folder's name in the summary (the parent's too where two folders share a name)
    name: str
    preset: str
    labels: list[str]
    seeds: list[int]
    leaderboard: dict | None
    missing: list[str] = field(default_factory=list)
    fidelity: Fidelity | None = None
    reported: Reported | None = None

    @property
    def state(self) -> str:
        if self.leaderboard is None:
            return "not reported"
        return "partial" if self.missing else "complete"

    @property
    def sampled_metric(self) -> str:
        """The summary rows' name of the sampled accuracy (the claims' ``avg@k``): ``avg@<k>``."""
        return avg_at(self.leaderboard['config']['preset']['eval']['k'])

    @property
    def final_ckpt(self) -> str | None:
        """The latest checkpoint leaderboard.json has rows for (the full budget unless it is missing)."""
        if self.leaderboard is None:
            return None
        fractions = {r["ckpt"]: r["budget_fraction"] for r in self.leaderboard["summary"]
                     if r["ckpt"] != WARMSTART_CKPT}
        return max(fractions, key=fractions.get) if fractions else None

    def full_budget_rows(self, metric: str | None = None, bench: str = SUMMARY_MEAN) -> list[dict]:
        """The summary rows of the mean at the latest checkpoint for ``metric`` (default: the sampled accuracy)."""
        metric = metric or self.sampled_metric
        return [r for r in self.leaderboard["summary"] if r["ckpt"] == self.final_ckpt and r["bench"] == bench
                and r["metric"] == metric and r["statistic"] == "mean"]

    @property
    def baseline(self) -> str | None:
        if self.leaderboard is None:
            return None
        return next((r["baseline"] for r in self.full_budget_rows() if r.get("baseline")), None)

    def method_name(self, label: str) -> str:
        return next((r["method_name"] for r in self.full_budget_rows() if r["method"] == label), label)


def read_leaderboard(folder: Path) -> dict | None:
    """``folder/leaderboard.json`` (None when absent); one that is not a harness leaderboard raises naming it."""
    path = folder / LEADERBOARD
    if not path.is_file():
        return None
    record = read_json(path)
    if not isinstance(record, dict) or any(key not in record for key in LEADERBOARD_KEYS):
        raise NotASweepError(f"{path}: not a leaderboard written by `harness report` (it needs the keys "
                             f"{list(LEADERBOARD_KEYS)})")
    return record


def sweep_mapping(folder: Path, leaderboard: dict | None) -> dict:
    """The sweep's name, preset, labels and seeds: leaderboard.json's configuration, else ``sweep.yaml``."""
    if leaderboard is not None:
        return leaderboard["config"]["sweep"]
    path = folder / SWEEP_FILE
    if not path.is_file():
        raise NotASweepError(f"{folder} is not a sweep result folder: it has neither {LEADERBOARD} (written by "
                             f"`harness report`) nor {SWEEP_FILE} (written when Snakemake parses a sweep)")
    mapping = read_json(path)
    if not isinstance(mapping, dict) or any(key not in mapping for key in ("name", "methods", "seeds")):
        raise NotASweepError(f"{path}: not a sweep mapping (it needs the keys name, methods and seeds)")
    return mapping


def resolved_config(folder: Path, leaderboard: dict | None, mapping: dict) -> Resolved:
    """The configuration the report ran with (leaderboard.json's), else the sweep.yaml's resolved now; a
    ConfigError when this checkout's schema cannot read it."""
    if leaderboard is None:
        return resolve(mapping)
    origin = str(folder / LEADERBOARD)
    config = leaderboard["config"]
    return Resolved(merge_config(SweepConfig, [(origin, config["sweep"])]),
                    merge_config(PresetConfig, [(origin, config["preset"])]), origin)


def missing_from_leaderboard(result: SweepResult, expected_ckpts: list[str]) -> tuple[list[str], list[str]]:
    """(sentences, labels absent from leaderboard.json): the labels and checkpoints the sweep names that its
    leaderboard lacks."""
    if result.leaderboard is None:
        return [f"no {LEADERBOARD}: `harness report` has not run on this sweep (or failed)"], list(result.labels)
    present: dict[str, set[str]] = {}
    for row in result.leaderboard["summary"]:
        present.setdefault(row["method"], set()).add(row["ckpt"])
    sentences, absent = [], [label for label in result.labels if label not in present]
    sentences += [f"label `{label}`: not in {LEADERBOARD}" for label in absent]
    for label in result.labels:
        lacking = [c for c in expected_ckpts if label in present and c not in present[label]]
        if lacking:
            sentences.append(f"label `{label}`: checkpoint(s) {', '.join(lacking)} not in {LEADERBOARD}")
    final = result.final_ckpt
    if final is not None and expected_ckpts and final != expected_ckpts[-1]:
        sentences.append(f"the full budget ({expected_ckpts[-1]}) is not in {LEADERBOARD}: the differences below "
                         f"are at {final}")
    return sentences, absent


def missing_on_disk(resolved: Resolved, folder: Path, labels: list[str]) -> list[str]:
    """The runs and evaluations of ``labels`` whose files are missing, one sentence per label and stage, with the
    head of the first one's log (``evidence.find_failures``); the warm start's evaluation too."""
    preset = resolved.preset
    ckpts = [checkpoint_name(f) for f in sorted(preset.train.budget.checkpoint_fractions)]
    benches = sorted(preset.eval.benchmarks)
    paths = SweepPaths(folder)
    only = dataclasses.replace(resolved, sweep=dataclasses.replace(resolved.sweep, methods=labels))
    grouped: dict[tuple[str, str], list[dict]] = {}
    for failure in find_failures(only, paths, ckpts, benches):
        grouped.setdefault((failure["label"], failure["stage"]), []).append(failure)
    sentences = [f"`{label}` {stage}: missing for seed(s) {', '.join(str(f['seed']) for f in failures)} "
                 f"({failures[0]['error']}; log: {failures[0]['log']})"
                 for (label, stage), failures in grouped.items()]
    unevaluated = [b for b in benches if not paths.results_file(WARMSTART_LABEL, 0, WARMSTART_CKPT, b).is_file()]
    if unevaluated:
        sentences.append(f"the warm start's evaluation: missing on {', '.join(unevaluated)}")
    return sentences


def read_sweep_result(folder: Path, setting: str) -> SweepResult:
    """One sweep result folder: a finished or partly finished sweep; anything else raises NotASweepError."""
    if not folder.is_dir():
        raise NotASweepError(f"{folder}: no such folder (give sweep result folders, e.g. results/example)")
    leaderboard = read_leaderboard(folder)
    mapping = sweep_mapping(folder, leaderboard)
    result = SweepResult(folder, setting, str(mapping["name"]), str(mapping.get("preset", "")),
                         [str(label) for label in mapping["methods"]], [int(s) for s in mapping["seeds"]],
                         leaderboard)
    try:
        resolved = resolved_config(folder, leaderboard, mapping)
    except ConfigError as exc:  # a sweep of an older schema: its leaderboard still reads, its paper files do not
        result.missing.append(f"this checkout cannot read the sweep's configuration, so its protocol fidelity and "
                              f"run files are not checked: {exc}")
        resolved = None
    expected_ckpts = [] if resolved is None else [
        checkpoint_name(f) for f in sorted(resolved.preset.train.budget.checkpoint_fractions)]
    sentences, absent = missing_from_leaderboard(result, expected_ckpts)
    result.missing += sentences
    if resolved is not None:
        on_disk = missing_on_disk(resolved, folder, absent)
        if leaderboard is None and not on_disk:
            on_disk = ["every run and evaluation is on disk: `harness report` would write the leaderboard"]
        result.missing += on_disk
        fidelity_file = CONFIG_DIR / "fidelity" / f"{result.name}.yaml"
        result.fidelity = load_fidelity(fidelity_file, resolved) if fidelity_file.is_file() else None
    result.reported = load_reported(CONFIG_DIR / "reported" / f"{result.name}.yaml")
    return result


def setting_names(folders: list[Path]) -> list[str]:
    """A short, unique name per folder: its own name, with its parent's where two folders share one."""
    names = [f.name for f in folders]
    return [f"{f.parent.name}/{f.name}" if names.count(f.name) > 1 else f.name for f in folders]


def read_sweep_results(folders: list[Path]) -> list[SweepResult]:
    """Every folder once, in the order given; each keeps the path as given (the pages show it)."""
    unique: dict[Path, Path] = {}  # absolute -> as given
    for folder in folders:
        unique.setdefault(Path(os.path.abspath(folder)), Path(folder))
    names = setting_names(list(unique))
    return [read_sweep_result(given, name) for given, name in zip(unique.values(), names, strict=True)]


# --- the forest plot's rows ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForestRow:
    """One comparison as its sweep's leaderboard.json holds it: Δ (method - baseline) and its 95% interval in
    accuracy fractions, the leaderboard's mark (better / worse / tied) or, for a claim's own comparison, the claim's
    verdict, and the paper's claims on it."""

    setting: str
    label: str  # the figure's row label
    method: str
    baseline: str
    metric: str  # the summary rows' metric: avg@<k> or greedy
    benchmark: str  # "mean" (over the sweep's benchmarks) or a benchmark
    ckpt: str
    diff: float
    diff_ci_low: float
    diff_ci_high: float
    diff_ci_at_floor: bool | None
    verdict: str
    aa: bool  # an A/A pair: the method is the baseline's own, under another label (other seeds)
    claims: tuple[dict, ...] = ()  # {difference, kind, margin, headline}: points


def claim_key(result: SweepResult, claim: dict) -> tuple[str, str, str, str]:
    """(method, baseline, summary metric, summary benchmark) of a claim record: its comparison's summary row."""
    metric = result.sampled_metric if claim["metric"] == AVG_AT_K else GREEDY
    return claim["method"], claim["baseline"], metric, SUMMARY_MEAN if claim["benchmark"] == MEAN else claim[
        "benchmark"]


def headline(claim: dict) -> str:
    """A claim record's headline verdict (a leaderboard.json written before headlines has its verdict only)."""
    return claim.get("headline") or claim["verdict"]


def claim_marker(claim: dict) -> dict:
    return {**{key: claim[key] for key in ("difference", "kind", "margin")}, "headline": headline(claim)}


def row_label(result: SweepResult, method: str, baseline: str, metric: str, bench: str) -> str:
    scope = "" if (metric, bench) == (result.sampled_metric, SUMMARY_MEAN) else (
        f" ({metric}, {'mean' if bench == SUMMARY_MEAN else bench})")
    return f"{result.setting}: {method} vs {baseline}{scope}"


def forest_rows(result: SweepResult) -> list[ForestRow]:
    """Every label against the sweep's baseline on the mean over benchmarks (sampled accuracy, latest checkpoint),
    the paper's claims marked on their comparison; a claim on another comparison (another baseline, benchmark or
    metric) gets a row of its own from its claim record."""
    if result.leaderboard is None:
        return []
    claims: dict[tuple[str, str, str, str], list[dict]] = {}
    for claim in result.leaderboard["claims"]:
        claims.setdefault(claim_key(result, claim), []).append(claim)
    rows = []
    for r in result.full_budget_rows():
        if r.get("diff") is None:
            continue
        key = (r["method"], r["baseline"], r["metric"], SUMMARY_MEAN)
        rows.append(ForestRow(
            result.setting, row_label(result, *key), r["method"], r["baseline"], r["metric"], MEAN, r["ckpt"],
            r["diff"], r["diff_ci_low"], r["diff_ci_high"], r.get("diff_ci_at_floor"), r.get("verdict") or "",
            result.method_name(r["method"]) == result.method_name(r["baseline"]),
            tuple(claim_marker(c) for c in claims.pop(key, []))))
    for key, records in claims.items():
        for claim in records:
            if claim.get("diff") is None:  # not evaluated: the claims table says so
                continue
            method, baseline, metric, bench = key
            rows.append(ForestRow(
                result.setting, row_label(result, *key), method, baseline, metric,
                MEAN if bench == SUMMARY_MEAN else bench, result.final_ckpt, claim["diff"], claim["diff_ci_low"],
                claim["diff_ci_high"], claim.get("diff_ci_at_floor"), headline(claim),
                result.method_name(method) == result.method_name(baseline), (claim_marker(claim),)))
    return rows


# --- training reached, claims, fidelity ---------------------------------------------------------------------------


def training_reached(result: SweepResult) -> dict[str, dict[str, float]]:
    """Per label, what its runs trained by the latest checkpoint, seed means as leaderboard.json's summary rows
    hold them (``spent/*``, from each run's metrics.jsonl): generation batches, optimizer updates, rollouts and
    response tokens generated. The same quantities as ``summary.training_reached``; labels without a trained run
    (released checkpoints) are absent."""
    if result.leaderboard is None:
        return {}
    train = result.leaderboard["config"]["preset"]["train"]
    updates_per_batch = train["mini_batches"] * train["ppo_epochs"]
    reached = {}
    for r in result.full_budget_rows():
        spent = [r.get(key) for key in ("spent/steps", "spent/budget/samples", "spent/tokens/generated")]
        if any(value is None for value in spent):
            continue
        updates, rollouts, tokens = spent
        reached[r["method"]] = {"batches": updates / updates_per_batch, "updates": updates, "rollouts": rollouts,
                                "tokens": tokens}
    return reached


def claim_description(claim: dict) -> str:
    """The claim's text as the sweep's own claims table writes it (``verdicts.Claim.describe``)."""
    known = {f.name for f in dataclasses.fields(Claim)}
    return Claim(**{key: value for key, value in claim.items() if key in known}).describe()


def fidelity_record(fidelity: Fidelity | None) -> dict | None:
    if fidelity is None:
        return None
    return {"source": fidelity.source, "verdict": fidelity.verdict(), "elements": len(fidelity.rows),
            "departures": [dataclasses.asdict(row) for row in fidelity.departures]}


def paper_training_record(reported: Reported | None) -> dict | None:
    return None if reported is None or reported.training is None else dataclasses.asdict(reported.training)


# --- the figure ---------------------------------------------------------------------------------------------------


def forest_figure(rows: list[ForestRow]) -> Figure:
    """Δ with its 95% interval per row, in points, one colour per setting; open markers for A/A pairs, a diamond at
    a paper's claimed difference, a grey band for a parity claim's ±margin."""
    settings = list(dict.fromkeys(r.setting for r in rows))
    colours = plots.palette(settings)
    with sns.axes_style(plots.STYLE), sns.plotting_context(plots.CONTEXT):
        fig = Figure(figsize=(8.0, 0.32 * len(rows) + 1.6), dpi=plots.DPI, layout="constrained")
        ax = fig.subplots()
    for y, row in enumerate(rows):
        colour = colours[row.setting]
        ax.errorbar([100 * row.diff], [y], xerr=[[100 * (row.diff - row.diff_ci_low)],
                                                 [100 * (row.diff_ci_high - row.diff)]],
                    fmt="o", color=colour, markerfacecolor="white" if row.aa else colour, capsize=3)
        for claim in row.claims:
            if claim["kind"] == "parity":
                ax.fill_betweenx([y - 0.4, y + 0.4], -claim["margin"], claim["margin"], color="0.5", alpha=0.2,
                                 linewidth=0)
            ax.plot([claim["difference"]], [y], marker="D", markersize=6, markerfacecolor="none",
                    markeredgecolor=CLAIM_COLOUR, linestyle="none")
        if y and row.setting != rows[y - 1].setting:
            ax.axhline(y - 0.5, color="0.6", linewidth=0.8)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r.label for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.set_xlabel("Δ vs the sweep's baseline (points), 95% interval")
    fig.legend(handles=[Line2D([], [], marker="o", color="0.3", linestyle="none", label="Δ, 95% interval"),
                        Line2D([], [], marker="o", color="0.3", markerfacecolor="white", linestyle="none",
                               label="A/A pair"),
                        Line2D([], [], marker="D", markersize=6, markerfacecolor="none",
                               markeredgecolor=CLAIM_COLOUR, linestyle="none", label="paper's claimed Δ"),
                        Patch(color="0.5", alpha=0.2, label="parity claim's ±margin")],
               fontsize="small", loc="outside lower center", ncols=4)  # below the axes: never over a row
    return fig


def save_svg(fig: Figure, path: Path) -> Path:
    """The figure as SVG with its text kept as text (searchable, and a test can read the row labels)."""
    tmp = staging_file(path)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": FIGURE}):  # fixed ids: same file each run
        fig.savefig(tmp, format="svg", metadata={"Date": None})
    tmp.replace(path)
    return path


def write_forest(rows: list[ForestRow], out: Path) -> dict[str, Path]:
    """forest.png and forest.svg in ``out``; none (and an earlier summary's removed) when no sweep has a row."""
    files = {"png": out / f"{FIGURE}.png", "svg": out / f"{FIGURE}.svg"}
    if not rows:
        for stale in files.values():
            stale.unlink(missing_ok=True)
        return {}
    fig = forest_figure(rows)
    return {"png": plots.save_png(fig, files["png"]), "svg": save_svg(fig, files["svg"])}


# --- the pages ----------------------------------------------------------------------------------------------------


def fidelity_cell(result: SweepResult) -> str:
    if result.fidelity is None:
        return f"no fidelity file (configs/fidelity/{result.name}.yaml): no paper protocol to compare"
    if result.fidelity.is_reproduction:
        return f"reproduction: all {len(result.fidelity.rows)} elements match"
    return (f"simplified comparison: {len(result.fidelity.departures)} of {len(result.fidelity.rows)} elements "
            "depart or are unknown (footnote)")


def claim_marker_cell(row: ForestRow) -> str:
    return "; ".join(f"{c['difference']:+.2f}" + (f" (parity, ±{c['margin']:g})" if c["kind"] == "parity" else "")
                     for c in row.claims)


def table_row(cells: list[str], setting: str, footnotes: dict[str, int]) -> dict:
    """A body row; ``note``: the footnote number of its setting's protocol departures (None: none), which the
    templates set after the first cell."""
    return {"cells": cells, "note": footnotes.get(setting)}


def sweeps_table(results: list[SweepResult], footnotes: dict[str, int]) -> dict:
    header = ["setting", "sweep (preset)", "state", "labels x seeds", "baseline", "Δ at", "protocol fidelity"]
    body = [table_row([r.setting, f"{r.name} ({r.preset})", r.state, f"{len(r.labels)} x {len(r.seeds)}",
                       r.baseline or ("none" if r.leaderboard else ""), r.final_ckpt or "", fidelity_cell(r)],
                      r.setting, footnotes) for r in results]
    return {"header": header, "body": body}


def forest_table(rows: list[ForestRow], footnotes: dict[str, int]) -> dict:
    header = ["setting", "comparison", "metric", "benchmark", "Δ [95% CI]", "verdict", "claimed Δ", "A/A"]
    body = [table_row([r.setting, f"{r.method} vs {r.baseline}", r.metric, r.benchmark,
                       with_ci(dataclasses.asdict(r), "diff", signed=True), r.verdict, claim_marker_cell(r),
                       "yes" if r.aa else ""], r.setting, footnotes) for r in rows]
    return {"header": header, "body": body}


def claims_table(results: list[SweepResult], footnotes: dict[str, int]) -> dict:
    """Every claim of every sweep with its verdict, beside the training the compared runs reached and the paper's."""
    header = ["setting", "claim", "where", "Δ [95% CI]", "detectable at 80% power", "verdict (Holm)",
              "per-claim verdict", "trained here (method; baseline)", "paper's run"]
    body = []
    for result in results:
        if result.leaderboard is None:
            continue
        reached = training_reached(result)
        for claim in result.leaderboard["claims"]:
            trained = "; ".join(f"{label}: {trained_cell(reached.get(label))}"
                                for label in (claim["method"], claim["baseline"]))
            detectable = "" if claim.get("detectable") is None else f"{100 * claim['detectable']:.1f}"
            body.append(table_row([result.setting, claim_description(claim), claim["where"],
                                   with_ci(claim, "diff", signed=True), detectable, headline(claim),
                                   claim["verdict"], trained, paper_training_cell(result.reported)],
                                  result.setting, footnotes))
    return {"header": header, "body": body}


def footnote_numbers(results: list[SweepResult]) -> dict[str, int]:
    """setting -> footnote number, for the sweeps whose protocol departs from their paper's."""
    departing = [r.setting for r in results if r.fidelity is not None and not r.fidelity.is_reproduction]
    return {setting: i for i, setting in enumerate(departing, start=1)}


def page_context(results: list[SweepResult], rows: list[ForestRow], figures: dict[str, Path]) -> dict:
    """Everything both pages show, as text: the templates only lay it out."""
    footnotes = footnote_numbers(results)
    tables = {"sweeps": sweeps_table(results, footnotes), "forest": forest_table(rows, footnotes),
              "claims": claims_table(results, footnotes)}
    return {
        "n_sweeps": len(results), "tables": tables,
        "missing": [{"setting": r.setting, "folder": str(r.folder), "items": r.missing} for r in results
                    if r.missing],
        "figure": {name: path.name for name, path in figures.items()},
        "floor_legend": FLOOR_LEGEND if any(FLOOR_MARK in cell for t in tables.values() for row in t["body"]
                                            for cell in row["cells"]) else "",
        "footnotes": [{"number": footnotes[r.setting], "setting": r.setting, **fidelity_record(r.fidelity)}
                      for r in results if r.setting in footnotes],
    }


def markdown_cell(value) -> str:
    """A markdown table cell: pipes escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def environment(html: bool) -> Environment:
    env = Environment(loader=PackageLoader("harness.report", "templates"), autoescape=html, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["cell"] = markdown_cell
    return env


def image_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def summary_record(results: list[SweepResult], rows: list[ForestRow], figures: dict[str, Path]) -> dict:
    """summary.json: per sweep what was read and what is missing, the forest plot's rows and every claim."""
    sweeps = [{"setting": r.setting, "folder": str(r.folder), "sweep": r.name, "preset": r.preset, "state": r.state,
               "labels": r.labels, "seeds": r.seeds, "missing": r.missing,
               "baseline": r.baseline, "ckpt": r.final_ckpt,
               "training_reached": training_reached(r), "paper_training": paper_training_record(r.reported),
               "fidelity": fidelity_record(r.fidelity)} for r in results]
    claims = [{"setting": r.setting, **claim} for r in results if r.leaderboard for claim in r.leaderboard["claims"]]
    return {"format": FORMAT, "units": "diff, diff_ci_low, diff_ci_high, detectable: accuracy fractions; a claim's "
                                       "difference and margin: points",
            "sweeps": sweeps, "forest": [dataclasses.asdict(row) for row in rows], "claims": claims,
            "figures": {name: path.name for name, path in figures.items()}}


def write_summary(folders: list[Path], out: Path) -> list[Path]:
    """Read every sweep result folder, write summary.md, summary.html, summary.json and the forest plot into
    ``out``; return what was written."""
    results = read_sweep_results(folders)
    rows = [row for result in results for row in forest_rows(result)]
    out.mkdir(parents=True, exist_ok=True)
    figures = write_forest(rows, out)
    context = page_context(results, rows, figures)
    html_context = {**context, "image": image_uri(figures["png"]) if figures else ""}
    written = [
        write_text_atomic(out / "summary.md", environment(html=False).get_template("summary.md.j2").render(context)),
        write_text_atomic(out / "summary.html",
                          environment(html=True).get_template("summary.html.j2").render(html_context)),
        write_json_atomic(out / "summary.json", summary_record(results, rows, figures)),
    ]
    return written + list(figures.values())
