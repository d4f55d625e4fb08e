"""How close a paper sweep's protocol is to the paper's, element by element (configs/fidelity/<sweep>.yaml).

A fidelity file lists, for each protocol element (model, data, template, batch, mini-batches, lr, precision, reward,
loss aggregation, clip, dual-clip, KL, dynamic sampling, overlong shaping, max length, eval protocol, eval top-p,
stop strings and grader, budget), what the paper did and which config keys hold ours (`ours`, plus every key of
`expect`; ``derived.<name>`` names a value computed from several keys: precision, eval_stop, eval_grader, budget in
the paper's units). An `expect` value may be one the harness cannot take (the paper's grader): the row is then a
computed departure. Where the paper's value is expressible in our config
(`expect: {dotted.key: value}`), the status is computed from the resolved sweep, so a preset edited later cannot
keep an outdated "match"; otherwise the file states `status` (match, departure, or unknown: the paper does not
say) with a `note`. The report shows the table at the top of the sweep's page: a sweep is a reproduction only when
every element matches. The data row also shows ``derived.ngram_overlap``: the training rows' word 8-gram overlap
with each benchmark as the sweep's data job measured it (data/decontamination.json), or "not measured".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.config.launch import precision, training_processes
from harness.config.paths import SweepPaths
from harness.config.schema import COMMIT_SHA, ConfigError, Resolved, is_local_model
from harness.data.decontamination import read_report
from harness.data.decontamination import summary as overlap_summary
from harness.data.prompts import stop_sequences

REQUIRED_ELEMENTS = ("model", "data", "template", "batch", "mini_batches", "lr", "precision", "reward", "aggregation",
                     "clip", "dual_clip", "kl", "dynamic_sampling", "overlong", "max_length", "eval", "eval_top_p",
                     "eval_stop", "eval_grader", "budget")
# elements whose status is always computed from the resolved config: a file may declare them unknown (the paper
# does not say) or a departure it cannot express as a value, never a match
COMPUTED_ELEMENTS = ("precision", "reward", "aggregation", "eval_top_p", "eval_stop", "eval_grader", "budget")
DECLARED_STATUSES = ("match", "departure", "unknown")
ELEMENT_KEYS = {"paper", "ours", "expect", "status", "note"}
DERIVED = "derived."  # `derived.<name>`: a value computed from several config keys (``derived_values``)
# shown in the data row of every fidelity table: the training rows' measured 8-gram overlap with each benchmark
NGRAM_OVERLAP = DERIVED + "ngram_overlap"


@dataclass(frozen=True)
class FidelityRow:
    element: str
    paper: str
    ours: str  # our resolved values of the element's config keys, "key=value; ..."
    status: str  # match | departure | unknown
    note: str


@dataclass(frozen=True)
class Fidelity:
    source: str
    rows: list[FidelityRow]

    @property
    def departures(self) -> list[FidelityRow]:
        return [r for r in self.rows if r.status != "match"]

    @property
    def is_reproduction(self) -> bool:
        return not self.departures

    def verdict(self) -> str:
        if self.is_reproduction:
            return f"reproduction: all {len(self.rows)} protocol elements match the paper"
        return (f"simplified comparison, not a reproduction: {len(self.departures)} of {len(self.rows)} protocol "
                f"elements depart from the paper or are unknown ({', '.join(r.element for r in self.departures)})")


def budget_in_paper_units(preset) -> str:
    """A budget as its amount and as what it is in the paper's terms: rounds or batches of rollouts, or wall time."""
    train, budget = preset.train, preset.train.budget
    group = train.num_generations
    if budget.kind == "samples":
        ds = train.dynamic_sampling
        prompts = (ds.prompts_per_round or train.prompts_per_step) if ds.enabled else train.prompts_per_step
        return (f"{budget.amount:,.0f} rollouts generated = {budget.amount / (prompts * group):g} generation "
                f"{'rounds' if ds.enabled else 'batches'} of {prompts} prompts x {group}")
    if budget.kind == "steps":
        updates = train.mini_batches * train.ppo_epochs
        return (f"{budget.amount:,.0f} optimizer updates = {budget.amount / updates:g} generation batches of "
                f"{train.prompts_per_step} prompts x {group}")
    if budget.kind == "accel_seconds":
        processes = max(training_processes(preset), 1)
        return (f"{budget.amount:,.0f} device-seconds = {budget.amount / processes / 3600:.1f} h on {processes} "
                "training device(s); steps and rollouts: what the run reaches")
    return f"{budget.amount:g} {budget.kind}"


def derived_values(resolved: Resolved) -> dict[str, Any]:
    """Protocol facts that no single config key holds, computed from the resolved preset (``derived.<name>``);
    ``ngram_overlap`` is measured: the sweep's data/decontamination.json, or "not measured" without one."""
    preset = resolved.preset
    return {
        "ngram_overlap": overlap_summary(read_report(SweepPaths(resolved.results_dir).data_dir)),
        "precision": precision(preset),
        "eval_stop": list(stop_sequences(preset.prompt_template, preset.eval.stop)),
        "eval_grader": sorted({bench.scorer for bench in preset.eval.benchmarks.values()}),
        "budget": budget_in_paper_units(preset),
        "model_revision": model_revision(preset.model),
    }


def model_revision(model) -> str:
    """Which commit of the model the sweep loads: the pinned sha, or that it is unpinned (``model.allow_unpinned``:
    the warm start records the commit it got in warmstart.json); "-" for a model not read from the hub."""
    if model.kind != "pretrained" or not model.name_or_path or is_local_model(model.name_or_path):
        return "-"
    if COMMIT_SHA.fullmatch(model.revision):
        return model.revision
    return (f"unpinned: {model.revision or 'the default branch'} (model.allow_unpinned; the commit read is in "
            "warmstart.json)")


class PresetValues:
    """The resolved preset's values by dotted key (e.g. 'train.learning_rate', or 'derived.precision'), the preset
    converted to a dict once: a fidelity table reads ~30 keys and each conversion costs ~0.2 s."""

    def __init__(self, resolved: Resolved):
        self.resolved = resolved

    @functools.cached_property
    def preset(self) -> dict:
        return self.resolved.to_dict()["preset"]

    @functools.cached_property
    def derived(self) -> dict[str, Any]:
        return derived_values(self.resolved)

    def value(self, dotted: str, where: str) -> Any:
        """The value at `dotted`; a clear error for an unknown key."""
        if dotted.startswith(DERIVED):
            name = dotted.removeprefix(DERIVED)
            if name not in self.derived:
                raise ConfigError(f"{where}: {dotted!r} is not a derived value; known: "
                                  f"{', '.join(DERIVED + n for n in self.derived)}")
            return self.derived[name]
        node: Any = self.preset
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"{where}: {dotted!r} is not a key of the resolved preset")
            node = node[part]
        return node


def _equal(ours: Any, paper: Any) -> bool:
    if isinstance(ours, int | float) and isinstance(paper, int | float) and not isinstance(ours, bool):
        return math.isclose(float(ours), float(paper), rel_tol=1e-9, abs_tol=1e-12)
    return ours == paper


def _row(element: str, spec: dict, values: PresetValues, where: str) -> FidelityRow:
    unknown = set(spec) - ELEMENT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(ELEMENT_KEYS)}")
    if "paper" not in spec:
        raise ConfigError(f"{where}.paper: missing (what the paper did)")
    expect = dict(spec.get("expect") or {})
    keys = list(expect) + [k for k in spec.get("ours") or [] if k not in expect]
    if element == "data" and NGRAM_OVERLAP not in keys:
        keys.append(NGRAM_OVERLAP)  # shown, never compared: the paper's data and ours are judged by the keys above
    if expect and "status" in spec:
        raise ConfigError(f"{where}: give either `expect` (status computed from the config) or `status`, not both")
    if expect:
        same = all(_equal(values.value(k, f"{where}.expect"), v) for k, v in expect.items())
        status = "match" if same else "departure"
    else:
        status = spec.get("status")
        if status not in DECLARED_STATUSES:
            raise ConfigError(f"{where}.status: {status!r}; allowed: {', '.join(DECLARED_STATUSES)} "
                              "(or give `expect` to compute it)")
        if element in COMPUTED_ELEMENTS and (status == "match" or not spec.get("ours")):
            raise ConfigError(f"{where}: {element!r} is computed from the config: give `expect` (the paper's "
                              "values), or `ours` (the keys shown) with status unknown or departure and a note")
    if status != "match" and not spec.get("note") and not expect:
        raise ConfigError(f"{where}.note: a {status} needs a note saying what differs or is not known")
    ours = "; ".join(f"{k}={values.value(k, f'{where}.ours')}" for k in keys) or "-"
    return FidelityRow(element, str(spec["paper"]), ours, status, str(spec.get("note", "")))


def load_fidelity(path: Path, resolved: Resolved) -> Fidelity:
    """Read and check `path` against the resolved sweep; every required element must be present."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("elements"), dict) or not raw.get("source"):
        raise ConfigError(f"{path}: expected a mapping with `source` (the paper and where its protocol is stated) "
                          "and `elements`")
    elements = raw["elements"]
    missing = [e for e in REQUIRED_ELEMENTS if e not in elements]
    if missing:
        raise ConfigError(f"{path}: elements missing: {', '.join(missing)} (required: {', '.join(REQUIRED_ELEMENTS)})")
    rows, values = [], PresetValues(resolved)
    for name, spec in elements.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: elements.{name} must be a mapping")
        rows.append(_row(name, spec, values, f"{path}: elements.{name}"))
    return Fidelity(str(raw["source"]), rows)
