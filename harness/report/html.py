"""``report.html``: one self-contained page (inline CSS, figures as data URIs, no script, nothing fetched).

Sections: the leaderboard per checkpoint, per-benchmark tables, figures, token highlights (what each method selects
or weights on the same rollouts of the first run's first generation batch), reported numbers, provenance (resolved
configs, method deviations, versions, git, data checksums, hardware, realised budget per run) and definitions.
The tables are the ones ``leaderboard.md`` shows, built once in ``harness.report.tables``; the notes are
``harness.report.markdown``'s.
"""

from __future__ import annotations

import base64
import html
import importlib.metadata
import json
import statistics
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from harness.config.paths import WARMSTART_LABEL
from harness.config.schema import Resolved
from harness.report.evidence import Evidence
from harness.report.fidelity import Fidelity
from harness.report.markdown import (
    FIDELITY_HEADER,
    bottom_line_intro,
    budget_warnings,
    calibration_lines,
    claims_note,
    code_warnings,
    outlier_lines,
    overlap_note,
    overlap_table,
    protocol_note,
    reported_lines,
)
from harness.report.reported import Reported
from harness.report.summary import (
    baseline_level,
    claim_verdicts,
    detectability,
    training_reached,
    without_stand_ins,
)
from harness.report.tables import (
    FLOOR_LEGEND,
    FLOOR_MARK,
    STAND_IN_NOTE,
    bench_table,
    bottom_line,
    claims_table,
    detectability_table,
    overview_table,
    runs_table,
    select,
    stand_in_table,
    with_ci,
)

REPORT_PACKAGES = ("numpy", "scipy", "pandas", "matplotlib", "seaborn")
TOKEN_RGB = (230, 120, 20)  # orange: a token the method trains on; intensity grows with its weight
NEGATIVE_RGB = (40, 110, 220)  # blue, should a method ever return a negative weight
N_HIGHLIGHT_ROLLOUTS = 6
VERDICT_CLASSES = ("better", "worse", "tied", "reproduced", "contradicted", "inconclusive")  # coloured cells

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
nav a { margin-right: 1rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .85rem; margin: .6rem 0 1rem; }
th, td { border: 1px solid #d0d0d0; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.reference td { color: #555; font-style: italic; }
td.better, td.reproduced { background: #dff3df; } td.worse, td.contradicted { background: #f8dddd; }
td.tied, td.inconclusive { background: #f2f2f2; }
.note { font-size: .9rem; color: #333; max-width: 70rem; }
.warn { color: #9a3412; font-weight: 600; }
figure { margin: 1rem 0 2rem; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #444; }
.rollout { border: 1px solid #ddd; border-radius: 4px; padding: .5rem .8rem; margin: 1rem 0; }
.rollout .prompt { font-family: ui-monospace, monospace; font-size: .85rem; color: #444; white-space: pre-wrap; }
.tokens { font-family: ui-monospace, monospace; font-size: .85rem; white-space: pre-wrap; line-height: 1.7; }
.tokrow { display: grid; grid-template-columns: 9rem 1fr; gap: .5rem; border-top: 1px dotted #ddd; padding: .2rem 0; }
.tokrow .label { font-weight: 600; font-size: .85rem; }
.tok { border-radius: 2px; }
.dropped .tokens { color: #9a9a9a; background: #ececec; text-decoration: line-through; }
.error { color: #b91c1c; font-family: ui-monospace, monospace; font-size: .85rem; }
pre { background: #f7f7f7; padding: .6rem; overflow-x: auto; font-size: .8rem; }
details { margin: .4rem 0; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def table(header: list[str], body: list[list[str]], verdict_column: str | None = "verdict") -> str:
    """An HTML table; a row whose first cell is 'ref' is the reference row; verdict cells get a colour class."""
    index = header.index(verdict_column) if verdict_column in header else None
    out = ["<div class='scroll'><table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in header), "</tr></thead><tbody>"]
    for row in body:
        out.append("<tr class='reference'>" if row and row[0] == "ref" else "<tr>")
        for i, cell in enumerate(row):
            css = f" class='{esc(cell)}'" if i == index and cell in VERDICT_CLASSES else ""
            out.append(f"<td{css}>{esc(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<img src='data:image/png;base64,{data}' alt='{esc(alt)}'>"


FIGURE_CAPTIONS = {
    "accuracy_vs_steps": "Accuracy against optimizer steps spent, at each checkpoint; bands: 95% intervals over seeds "
                         "and problems (the table's). The black square is the warm start (step 0).",
    "accuracy_vs_generated": "Accuracy against tokens generated (rollouts) up to each checkpoint.",
    "accuracy_vs_forwarded": "Accuracy against tokens forwarded in the training passes up to each checkpoint (what "
                             "rollout dropping and prefix cutting save).",
    "accuracy_vs_flops": "Accuracy against the analytic FLOPs spent up to each checkpoint (generation, old log-probs, "
                         "reference and training passes): the budget the matched-compute comparison holds equal.",
    "accuracy_vs_accel_seconds": "Accuracy against the training processes' step seconds summed up to each checkpoint "
                                 "(device-seconds; on a CPU preset process CPU time, a noisy clock).",
    "per_benchmark": "Per benchmark at the full budget: mean and 95% interval; the black bar is the warm start.",
    "difference_to_baseline": "Paired difference to the baseline (same seeds and problems) with its 95% interval; an "
                              "interval crossing 0 is a tie.",
    "training_curves": "Training reward, entropy and response length per optimizer step (metrics.jsonl): mean "
                       "over seeds; bands: the seeds' range (min to max).",
}


# --- token highlights ---------------------------------------------------------------------------------------------


def choose_rollouts(batch: dict, n: int = N_HIGHLIGHT_ROLLOUTS) -> list[int]:
    """Fixed, deterministic rollouts: the best and worst of each group with mixed rewards (where the advantage is
    non-zero, so every method has a learning signal to shape), then the first rollout of other groups."""
    rewards, groups = batch["rewards"], batch["group_ids"]
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    chosen: list[int] = []
    for rows in members.values():
        if len({rewards[i] for i in rows}) > 1 and len(chosen) + 2 <= n:
            chosen += [max(rows, key=lambda i: (rewards[i], -i)), min(rows, key=lambda i: (rewards[i], i))]
    for rows in members.values():
        if len(chosen) >= n:
            break
        if not set(rows) & set(chosen):
            chosen.append(rows[0])
    return chosen[:n]


def display_token(token: str) -> str:
    """Byte-level BPE / sentencepiece markers as text: Ġ and ▁ are spaces, Ċ a newline; newlines get a visible ↵."""
    text = token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n")
    return text.replace("\n", "↵\n")


def token_span(text: str, weight: float, entropy: float | None, advantage: float | None, scale: float) -> str:
    """One token, coloured by its weight (``scale`` maps to half intensity); the title holds its numbers."""
    parts = [f"weight {weight:.3g}"]
    if entropy is not None:
        parts.insert(0, f"entropy {entropy:.3f}")
    if advantage is not None:
        parts.append(f"advantage {advantage:+.3f}")
    title = esc(" | ".join(parts))
    if weight == 0:
        return f"<span class='tok' title='{title}'>{esc(text)}</span>"
    intensity = abs(weight) / (abs(weight) + scale)  # the method's median weight maps to 0.5
    r, g, b = TOKEN_RGB if weight > 0 else NEGATIVE_RGB
    return (f"<span class='tok' style='background: rgba({r},{g},{b},{0.15 + 0.75 * intensity:.2f})' "
            f"title='{title}'>{esc(text)}</span>")


def highlight_rollout(batch: dict, row: int, label: str, output: dict | str) -> str:
    """One method's weights on one rollout's completion tokens; ``output`` is its inspect output or an error."""
    if isinstance(output, str):
        return f"<div class='tokrow'><div class='label'>{esc(label)}</div><div class='error'>{esc(output)}</div></div>"
    mask = batch["completion_mask"][row]
    tokens = batch.get("completion_tokens", [[str(i) for i in r] for r in batch["completion_ids"]])[row]
    entropy = batch["entropy"][row] if "entropy" in batch else None
    weights, advantages = output["weights"][row], output["advantages"][row]
    positive = [abs(w) for r in output["weights"] for w in r if w != 0]
    scale = statistics.median(positive) if positive else 1.0
    kept = bool(output["keep"][row])
    spans = [token_span(display_token(tokens[t]), float(weights[t]) if kept else 0.0,
                        None if entropy is None else float(entropy[t]), float(advantages[t]), scale)
             for t in range(len(mask)) if mask[t]]
    css = "tokrow" if kept else "tokrow dropped"
    status = "" if kept else " (dropped)"
    return (f"<div class='{css}' title='{esc(label + status)}'><div class='label'>{esc(label)}{esc(status)}</div>"
            f"<div class='tokens'>{''.join(spans)}</div></div>")


def highlights_section(batch_file: Path | None, inspected: dict[str, dict | str]) -> str:
    """The chosen rollouts of the sample batch, each with every method's token weights beneath its prompt."""
    if batch_file is None:
        return ("<p class='note'>No <code>sample_batch.json</code> in the first run (written by the trainer at its "
                "first step); rerun training to see token highlights.</p>")
    batch = json.loads(batch_file.read_text(encoding="utf-8"))
    rows = choose_rollouts(batch)
    parts = [f"<p class='note'>The first generation batch of <code>{esc(batch_file.parent.parent.name)}/"
             f"{esc(batch_file.parent.name)}</code> (before any update), scored by each method's hooks exactly as "
             "the trainer runs them (<code>harness inspect</code>). Coloured: tokens with a non-zero weight, darker "
             "for larger weights (relative to the method's median weight); uncoloured: weight 0; greyed and struck "
             "through: rollouts the method drops. Hover a token for its entropy, weight and advantage.</p>"]
    prompts = batch.get("prompts")
    for row in rows:
        prompt = prompts[row] if prompts else ""
        parts.append(f"<div class='rollout'><div><b>Rollout {row}</b> (group {batch['group_ids'][row]}, reward "
                     f"{batch['rewards'][row]:g})</div><div class='prompt'>{esc(prompt)}</div>")
        parts += [highlight_rollout(batch, row, label, output) for label, output in inspected.items()]
        parts.append("</div>")
    return "".join(parts)


# --- provenance ---------------------------------------------------------------------------------------------------


def _distinct(values: list) -> list:
    seen, out = set(), []
    for value in values:
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


def _versions_table(evidence: Evidence) -> str:
    """Package versions seen in training, evaluation and this report."""
    seen: dict[str, set[str]] = {}
    for run in evidence.runs.values():
        for name, version in run.get("provenance", {}).get("versions", {}).items():
            seen.setdefault(f"{name} (train)", set()).add(str(version))
    for results in evidence.results.values():
        for name, version in results.get("versions", {}).items():
            seen.setdefault(f"{name} (eval)", set()).add(str(version))
    for name in REPORT_PACKAGES:
        try:
            seen.setdefault(f"{name} (report)", set()).add(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            seen.setdefault(f"{name} (report)", set()).add("not installed")
    body = [[name, ", ".join(sorted(versions))] for name, versions in sorted(seen.items())]
    return table(["package", "version(s)"], body, None)


def _methods_table(evidence: Evidence) -> str:
    """Per label: the method, its parameters, the run seeds and the deviations from the paper it declares."""
    runs, body = evidence.runs, []
    for label in evidence.labels:
        method = runs[(label, evidence.seeds[0])]["method"]
        deviations = method.get("deviations") or []
        body.append([label, method["name"], json.dumps(method.get("params", {}), sort_keys=True),
                     ", ".join(str(runs[(label, s)].get("run_seed", s)) for s in evidence.seeds),
                     "; ".join(deviations) if deviations else "none declared"])
    return table(["label", "method", "parameters", "run seeds", "deviations"], body, None)


def _configs(evidence: Evidence) -> str:
    """Each distinct resolved config once, folded, naming the runs that used it."""
    configs: dict[str, list[str]] = {}
    for (label, seed), run in evidence.runs.items():
        configs.setdefault(run.get("config_yaml", ""), []).append(f"{label}/seed{seed}")
    return "".join(f"<details><summary>config of {esc(', '.join(names))}</summary><pre>{esc(text)}</pre></details>"
                   for text, names in configs.items())


def _code(evidence: Evidence) -> str:
    gits = _distinct([run.get("provenance", {}).get("git", {}) for run in evidence.runs.values()])
    out = table(["git commit", "dirty"], [[g.get("commit") or "unknown", str(g.get("dirty"))] for g in gits], None)
    if any(g.get("dirty") for g in gits):
        out += "<p class='warn'>Some runs were trained from a working tree with uncommitted changes.</p>"
    return out


def _data_checksums(evidence: Evidence) -> str:
    """The training data of every run and each benchmark's file, with their sha256."""
    rows = []
    for run in _distinct([r.get("provenance", {}).get("data_sha256", {}) for r in evidence.runs.values()]):
        rows += [[f"train: {name}", digest] for name, digest in run.items()]
    for bench in evidence.benches:
        pairs = _distinct([(r.get("data_file"), r.get("data_sha256")) for key, r in evidence.results.items()
                           if key[3] == bench])
        rows += [[f"{bench}: {Path(str(f)).name}", str(d)] for f, d in pairs]
    return table(["file", "sha256"], rows, None)


EVAL_PROTOCOL_KEYS = ("backend", "device", "k", "temperature", "top_p", "max_gen_toks", "greedy", "scorer",
                      "prompt_template", "seed", "scoring_timeout_s")


def _eval_protocol(evidence: Evidence) -> str:
    """Per benchmark, each distinct evaluation protocol found in its results.json files."""
    rows = []
    for bench in evidence.benches:
        for results in _distinct([{k: r.get(k) for k in EVAL_PROTOCOL_KEYS} for key, r in evidence.results.items()
                                  if key[3] == bench]):
            rows.append([bench] + [str(results.get(k)) for k in EVAL_PROTOCOL_KEYS])
    return table(["bench", *EVAL_PROTOCOL_KEYS], rows, None)


def _hardware(evidence: Evidence) -> str:
    hardware = _distinct([run.get("provenance", {}).get("hardware", {}) for run in evidence.runs.values()])
    return "".join(f"<pre>{esc(json.dumps(h, indent=1, sort_keys=True))}</pre>" for h in hardware)


def provenance_section(evidence: Evidence) -> str:
    """What produced the numbers: methods, realised budgets, configs, code, packages, data, protocol, hardware."""
    return "".join([
        "<h3>Methods: parameters and deviations from the papers</h3>", _methods_table(evidence),
        "<h3>Realised budget per run</h3>", table(*runs_table(evidence), None),
        "<h3>Resolved configuration</h3>", _configs(evidence),
        "<h3>Code</h3>", _code(evidence),
        "<h3>Package versions</h3>", _versions_table(evidence),
        "<h3>Data checksums (sha256)</h3>", _data_checksums(evidence),
        "<h3>Evaluation protocol</h3>", _eval_protocol(evidence),
        "<h3>Hardware</h3>", _hardware(evidence),
    ])


def reported_section(reported: Reported | None, evidence: Evidence, summary: list[dict]) -> str:
    """The paper's numbers beside ours at the full budget, with its source and protocol differences."""
    if reported is None:
        return ("<p class='note'>No reported numbers for this sweep (an optional "
                "<code>configs/reported/&lt;sweep&gt;.yaml</code>).</p>")
    lines = reported_lines(reported, evidence)
    parts = [f"<p class='note'>{esc(lines[0])}</p>"]
    if reported.differences:
        parts.append("<p class='note'>Protocol differences to ours:</p><ul>")
        parts += [f"<li>{esc(d)}</li>" for d in reported.differences]
        parts.append("</ul>")
    if reported.stand_ins:
        parts.append("<p class='note'>Stand-in benchmarks (a claim's mean is also shown without them):</p><ul>")
        parts += [f"<li>{esc(bench)}: {esc(text)}</li>" for bench, text in reported.stand_ins.items()]
        parts.append("</ul>")
    final = evidence.final_ckpt
    body = []
    for label, per_bench in reported.numbers.items():
        for bench, value in per_bench.items():
            ours = select(summary, ckpt=final, method=label, bench=bench, metric=evidence.avg_metric)
            body.append([label, bench, f"{value:.1f}", with_ci(ours[0]) if ours else "not in this sweep"])
    parts.append(table(["method", "benchmark", f"reported ({reported.metric or 'paper metric'})",
                        f"ours {evidence.avg_metric} [95% CI]"], body, None))
    return "".join(parts)


# --- the page -----------------------------------------------------------------------------------------------------


SECTIONS = [("bottom-line", "Bottom line"), ("leaderboard", "Leaderboard"), ("claims", "Claims"),
            ("benchmarks", "Per benchmark"), ("decontamination", "Data overlap"), ("figures", "Figures"),
            ("tokens", "Token highlights"), ("reported", "Reported numbers"), ("definitions", "How to read"),
            ("provenance", "Provenance")]
TEMPLATES = Environment(loader=PackageLoader("harness.report", "templates"), autoescape=True, trim_blocks=True,
                        lstrip_blocks=True, undefined=StrictUndefined)
FOREST = "difference_to_baseline"  # the page's first figure: every label's Δ against the baseline with its interval


def _warnings(evidence: Evidence, summary: list[dict]) -> list[str]:
    """A/A calibration, unmatched budgets and failed runs: what must be read before the tables."""
    calibration = [line.replace("**", "") for line in calibration_lines(evidence, summary)]
    parts = [f"<p class='{'warn' if 'NOT tied' in line or line.startswith('A/A calibration ') else 'note'}'>"
             f"{esc(line)}</p>" for line in calibration]
    parts += [f"<p class='warn'>{esc(line.replace('**', ''))}</p>" for line in outlier_lines(evidence)]
    parts += [f"<p class='warn'>Budget not matched: {esc(line)}</p>" for line in budget_warnings(evidence)]
    parts += [f"<p class='warn'>Different code: {esc(line)}</p>" for line in code_warnings(evidence)]
    parts += [f"<p class='warn'>Failed run, left out: {esc(f['label'])} seed {f['seed']} ({esc(f['stage'])}): "
              f"<code>{esc(f['error'])}</code> (log: {esc(f['log'])})</p>" for f in evidence.failures]
    return parts


def claims_section(evidence: Evidence, summary: list[dict], reported: Reported | None) -> list[str]:
    """The claims judged at the full budget (per comparison and with Holm) and the detectable effects."""
    judged = claim_verdicts(evidence, reported)
    parts = [f"<h2 id='claims'>Claims ({esc(evidence.final_ckpt)})</h2>",
             f"<p class='note'>{esc(claims_note(judged, reported))}</p>"]
    if judged:
        levels = [baseline_level(v.claim, evidence, summary, reported) for v in judged]
        parts.append(table(*claims_table(judged, training_reached(evidence), reported, levels), "verdict (Holm)"))
        header, body = stand_in_table(judged, [without_stand_ins(v, evidence, reported) for v in judged])
        if body:
            parts += ["<h3>The claims' means without stand-in benchmarks</h3>",
                      f"<p class='note'>{esc(STAND_IN_NOTE.format(file=reported.path.name).replace('`', ''))}</p>",
                      table(header, body, None)]
    rows = detectability(evidence)
    if rows:
        parts += ["<h3>Detectable effects (paired, 80% power)</h3>", table(*detectability_table(rows), None)]
    return parts


def _tables(evidence: Evidence, summary: list[dict], reported: Reported | None) -> list[str]:
    """The overview per checkpoint (latest first), the claims, then one table per benchmark at the full budget."""
    final = evidence.final_ckpt
    parts = ["<h2 id='leaderboard'>Leaderboard</h2>"]
    for ckpt in reversed(list(evidence.ckpts)):
        name = "Full budget" if ckpt == final else f"{evidence.ckpts[ckpt]:.0%} of the budget"
        parts += [f"<h3>{esc(name)} ({esc(ckpt)})</h3>", table(*overview_table(evidence, summary, ckpt))]
    parts += claims_section(evidence, summary, reported)
    parts.append(f"<h2 id='benchmarks'>Per benchmark ({esc(final)})</h2>")
    for bench in evidence.benches:
        parts += [f"<h3>{esc(bench)}</h3>", table(*bench_table(evidence, summary, final, bench, reported))]
    return parts


def fidelity_section(fidelity: Fidelity) -> list[str]:
    """Before any number: whether this sweep reproduces its paper's protocol, element by element."""
    body = [[r.element, r.paper, r.ours, r.status, r.note] for r in fidelity.rows]
    css = "note" if fidelity.is_reproduction else "warn"
    return ["<h2 id='fidelity'>Protocol fidelity</h2>",
            f"<p class='{css}'><b>{esc(fidelity.verdict())}.</b> Source: {esc(fidelity.source)}.</p>",
            table(FIDELITY_HEADER, body, None)]


def overlap_section(report: dict | None) -> list[str]:
    """The training rows' 8-gram overlap with each benchmark (the data job's decontamination report)."""
    parts = ["<h2 id='decontamination'>Training data overlap with the benchmarks</h2>",
             f"<p class='note'>{esc(overlap_note(report).replace('`', ''))}</p>"]
    return parts + ([table(*overlap_table(report, quote=""))] if report is not None else [])


def _figure(path: Path, name: str) -> dict:
    return {"image": Markup(image(path, name)), "caption": FIGURE_CAPTIONS.get(name, name)}


def render(evidence: Evidence, resolved: Resolved, summary: list[dict], reported: Reported | None,
           figures: dict[str, Path], batch_file: Path | None, inspected: dict[str, dict | str],
           n_resamples: int, fidelity: Fidelity | None = None, decontamination: dict | None = None) -> str:
    """The whole page from templates/report.html.j2: the bottom line and the forest plot first, then the protocol
    fidelity (a paper sweep), the tables, figures, token highlights (``inspected`` maps each label to its ``harness
    inspect`` output on ``batch_file``, or an error message), reported numbers, definitions and provenance."""
    judged = claim_verdicts(evidence, reported)
    levels = [baseline_level(v.claim, evidence, summary, reported) for v in judged]
    tables = _tables(evidence, summary, reported)
    ours_beside_paper = reported_section(reported, evidence, summary)
    protocol = protocol_note(evidence, resolved, n_resamples).replace("**", "")
    page = TEMPLATES.get_template("report.html.j2").render(
        title=f"Leaderboard: sweep {resolved.sweep.name} (preset {resolved.preset.name})", css=CSS,
        sections=SECTIONS, bottom_intro=bottom_line_intro(evidence, reported),
        bottom_line=bottom_line(judged, levels, len(evidence.seeds),
                                [without_stand_ins(v, evidence, reported) for v in judged]),
        forest=_figure(figures[FOREST], FOREST) if FOREST in figures else None,
        fidelity=Markup("".join(fidelity_section(fidelity))) if fidelity else "",
        floor_legend=FLOOR_LEGEND if any(FLOOR_MARK in part for part in [*tables, ours_beside_paper]) else "",
        tables=Markup("\n".join(_warnings(evidence, summary) + tables + overlap_section(decontamination))),
        figures=[_figure(path, name) for name, path in figures.items() if name != FOREST],
        highlights=Markup(highlights_section(batch_file, inspected)), reported=Markup(ours_beside_paper),
        notes=Markup(f"<p class='note'>{esc(protocol)}</p>"), provenance=Markup(provenance_section(evidence)),
        warmstart=WARMSTART_LABEL)
    return page + "\n"
