"""How close a paper sweep's protocol is to the paper's, element by element (configs/fidelity/<sweep>.yaml).

A fidelity file lists, for each protocol element (model, data, template, batch, mini-batches, lr, clip, dual-clip,
KL, dynamic sampling, overlong shaping, max length, eval protocol, budget), what the paper did and which config
keys hold ours (`ours`, plus every key of `expect`). Where the paper's value is expressible in our config
(`expect: {dotted.key: value}`), the status is computed from the resolved sweep, so a preset edited later cannot
keep an outdated "match"; otherwise the file states `status` (match, departure, or unknown: the paper does not
say) with a `note`. The report shows the table at the top of the sweep's page: a sweep is a reproduction only when
every element matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.config.schema import ConfigError, Resolved

REQUIRED_ELEMENTS = ("model", "data", "template", "batch", "mini_batches", "lr", "clip", "dual_clip", "kl",
                     "dynamic_sampling", "overlong", "max_length", "eval", "budget")
DECLARED_STATUSES = ("match", "departure", "unknown")
ELEMENT_KEYS = {"paper", "ours", "expect", "status", "note"}


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


def config_value(resolved: Resolved, dotted: str, where: str) -> Any:
    """The resolved preset's value at `dotted` (e.g. 'train.learning_rate'); a clear error for an unknown key."""
    node: Any = resolved.to_dict()["preset"]
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"{where}: {dotted!r} is not a key of the resolved preset")
        node = node[part]
    return node


def _equal(ours: Any, paper: Any) -> bool:
    if isinstance(ours, int | float) and isinstance(paper, int | float) and not isinstance(ours, bool):
        return math.isclose(float(ours), float(paper), rel_tol=1e-9, abs_tol=1e-12)
    return ours == paper


def _row(element: str, spec: dict, resolved: Resolved, where: str) -> FidelityRow:
    unknown = set(spec) - ELEMENT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(ELEMENT_KEYS)}")
    if "paper" not in spec:
        raise ConfigError(f"{where}.paper: missing (what the paper did)")
    expect = dict(spec.get("expect") or {})
    keys = list(expect) + [k for k in spec.get("ours") or [] if k not in expect]
    if expect and "status" in spec:
        raise ConfigError(f"{where}: give either `expect` (status computed from the config) or `status`, not both")
    if expect:
        same = all(_equal(config_value(resolved, k, f"{where}.expect"), v) for k, v in expect.items())
        status = "match" if same else "departure"
    else:
        status = spec.get("status")
        if status not in DECLARED_STATUSES:
            raise ConfigError(f"{where}.status: {status!r}; allowed: {', '.join(DECLARED_STATUSES)} "
                              "(or give `expect` to compute it)")
    if status != "match" and not spec.get("note") and not expect:
        raise ConfigError(f"{where}.note: a {status} needs a note saying what differs or is not known")
    ours = "; ".join(f"{k}={config_value(resolved, k, f'{where}.ours')}" for k in keys) or "-"
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
    rows = []
    for name, spec in elements.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: elements.{name} must be a mapping")
        rows.append(_row(name, spec, resolved, f"{path}: elements.{name}"))
    return Fidelity(str(raw["source"]), rows)
