"""The papers' numbers: an optional ``configs/reported/<sweep name>.yaml`` (JSON is YAML too) holds what a paper
reports, in percent, beside a protocol note, the paper's claims that the report judges (``claims``, see
``harness.report.verdicts``) and the benchmarks of ours that stand in for another of the paper's (``stand_ins``: the
report shows a claim's mean over benchmarks also without them, ``summary.without_stand_ins``); format in
``configs/reported/README.md``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.config.schema import ConfigError
from harness.report.verdicts import Claim, parse_claims

REPORTED_KEYS = {"source", "metric", "protocol", "differences", "numbers", "claims", "training", "stand_ins"}
TRAINING_KEYS = {"steps", "rollouts", "tokens", "where"}


@dataclass(frozen=True)
class PaperTraining:
    """How long the paper's reported run trained (None: not public): optimizer steps (verl's training steps: one
    per generation batch that was trained, each of several mini-batch updates), rollouts generated, response tokens
    generated; ``where``: the source and the arithmetic. The report sets what each run reached beside it."""

    steps: float | None
    rollouts: float | None
    tokens: float | None
    where: str


@dataclass
class Reported:
    """A paper's numbers (in percent) per method label and benchmark, with the protocol they were measured under."""

    path: Path
    source: str
    metric: str
    protocol: str
    differences: list[str]
    numbers: dict[str, dict[str, float]]
    claims: list[Claim] = field(default_factory=list)
    training: PaperTraining | None = None
    # benchmark -> what it stands in for (e.g. amc23 -> "paper: AMC, 83 problems; ours: AMC23, 40 problems")
    stand_ins: dict[str, str] = field(default_factory=dict)

    def get(self, label: str, bench: str) -> float | None:
        return self.numbers.get(label, {}).get(bench)


def _percentages(path: Path, numbers) -> dict[str, dict[str, float]]:
    """``numbers``: method label -> {benchmark: percent in [0, 100]}; anything else raises naming the key."""
    if not isinstance(numbers, dict):
        raise ConfigError(f"{path}: key 'numbers' must map method label -> {{benchmark: percent}}")
    clean: dict[str, dict[str, float]] = {}
    for label, per_bench in numbers.items():
        if not isinstance(per_bench, dict):
            raise ConfigError(f"{path}: key 'numbers.{label}' must map benchmark -> percent")
        for bench, value in per_bench.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
                raise ConfigError(f"{path}: key 'numbers.{label}.{bench}': {value!r} is not a percentage in "
                                  "[0, 100]")
        clean[str(label)] = {str(b): float(v) for b, v in per_bench.items()}
    return clean


def _training(path: Path, raw) -> PaperTraining | None:
    """``training``: {steps, rollouts, tokens: a number >= 0 or null (not public), where: text}."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - TRAINING_KEYS or not isinstance(raw.get("where"), str):
        raise ConfigError(f"{path}: key 'training' must map {sorted(TRAINING_KEYS - {'where'})} (a number or null) "
                          "and 'where' (the source and the arithmetic)")
    for key in ("steps", "rollouts", "tokens"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ConfigError(f"{path}: key 'training.{key}': {value!r} is not a number >= 0 (or null: not public)")
    return PaperTraining(raw.get("steps"), raw.get("rollouts"), raw.get("tokens"), raw["where"])


def _stand_ins(path: Path, raw) -> dict[str, str]:
    """``stand_ins``: a benchmark of the sweep -> what it stands in for, in words (non-empty)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'stand_ins' must map a benchmark to what it stands in for, e.g. "
                          "{amc23: \"paper: AMC, 83 problems; ours: AMC23, 40 problems\"}")
    for bench, text in raw.items():
        if not isinstance(bench, str) or not bench.strip() or not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{path}: key 'stand_ins.{bench}': {text!r} is not a non-empty text saying what the "
                              "benchmark stands in for (the paper's and ours)")
    return {bench: text.strip() for bench, text in raw.items()}


def load_reported(path: Path) -> Reported | None:
    """Read ``configs/reported/<sweep>.yaml`` if it exists; a malformed file raises naming the key."""
    import yaml

    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with keys {sorted(REPORTED_KEYS)}")
    unknown = set(raw) - REPORTED_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(REPORTED_KEYS)}")
    numbers = _percentages(path, raw.get("numbers") or {})
    differences = raw.get("differences") or []
    if isinstance(differences, str) or not all(isinstance(d, str) for d in differences):
        raise ConfigError(f"{path}: key 'differences' must be a list of strings")
    return Reported(path, str(raw.get("source", "")), str(raw.get("metric", "")), str(raw.get("protocol", "")),
                    list(differences), numbers, parse_claims(path, raw.get("claims")),
                    _training(path, raw.get("training")), _stand_ins(path, raw.get("stand_ins")))
