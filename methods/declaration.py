"""One declaration per setting: a field's default, documentation, allowed values and range in one call.

``setting(default, doc, choices=..., low=..., high=...)`` returns the ``dataclasses.field`` of a scalar or list
setting; ``section(factory, doc)`` that of a nested schema. Two kinds of dataclass declare their fields so: the
harness's configuration schemas (``harness/config/schema.py``), whose loader checks every value against its
declaration (``declared_problems``), and each method's ``Config`` (``methods/<name>.py``), whose ``__post_init__``
does the same for the keys ``method.<field>``. ``python -m harness.config.reference`` writes
docs/config-reference.md from both. It lives in ``methods`` because methods never import the harness.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple


class Declaration(NamedTuple):
    """What a field declares besides its type and default. Bounds are inclusive unless ``low_open`` /
    ``high_open``; None = unbounded. With a bound declared, NaN and infinite values are refused."""

    doc: str = ""
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False


def setting(default: Any, doc: str, *, choices: tuple | None = None, low: float | None = None,
            high: float | None = None, low_open: bool = False, high_open: bool = False) -> Any:
    """A setting's field; a list or dict default is copied for every instance. ``low_open=True``: the value must be
    above ``low`` (``high_open`` likewise)."""
    metadata = {"declaration": Declaration(doc, choices, low, high, low_open, high_open)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(factory: Callable[[], Any], doc: str = "") -> Any:
    """A nested schema's field: ``factory`` builds its default (the class, or a lambda that sets some fields)."""
    return dataclasses.field(default_factory=factory, metadata={"declaration": Declaration(doc)})


def declaration(field: dataclasses.Field) -> Declaration:
    return field.metadata.get("declaration", Declaration())


def declared(cls: type, name: str) -> Declaration:
    """The declaration of field ``name`` of the schema class ``cls``."""
    return declaration(next(f for f in dataclasses.fields(cls) if f.name == name))


def interval(declared: Declaration) -> str:
    """The declared range as an interval: ``[1, 9]``, ``(0.0, 1.0]``, ``[0, inf)``."""
    low = "(-inf" if declared.low is None else f"{'(' if declared.low_open else '['}{declared.low}"
    high = "inf)" if declared.high is None else f"{declared.high}{')' if declared.high_open else ']'}"
    return f"{low}, {high}"


def in_range(value: Any, declared: Declaration) -> bool:
    """Whether ``value`` lies in the declared range (NaN and infinities never do once a bound is declared)."""
    low, high = declared.low, declared.high
    if low is None and high is None:
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return ((low is None or (value > low if declared.low_open else value >= low))
            and (high is None or (value < high if declared.high_open else value <= high)))


def declared_problems(obj: Any, prefix: str = "") -> list[str]:
    """Every value of a schema tree outside its declared choices or range, by dotted key (a mapping of schemas,
    such as ``eval.benchmarks``, is walked by its keys). A None value (an optional setting left unset) has no range
    to check; its choices still hold."""
    if isinstance(obj, dict):
        return [p for key, value in obj.items() for p in declared_problems(value, f"{prefix}{key}.")]
    if not dataclasses.is_dataclass(obj):
        return []
    problems = []
    for f in dataclasses.fields(obj):
        value, declared_here = getattr(obj, f.name), declaration(f)
        choices = declared_here.choices
        # a list setting's choices hold for each of its items
        if choices is not None and any(v not in choices for v in (value if isinstance(value, list) else [value])):
            problems.append(f"key '{prefix}{f.name}': {value!r} is not one of {list(choices)}")
        if value is not None and not in_range(value, declared_here):
            problems.append(f"key '{prefix}{f.name}': {value!r} is outside the allowed range {interval(declared_here)}")
        problems += declared_problems(value, f"{prefix}{f.name}.")
    return problems


def check_declared(obj: Any, prefix: str) -> None:
    """Raise a ValueError naming every value of ``obj`` outside its declaration (``declared_problems``), keys with
    ``prefix``: what a method ``Config``'s ``__post_init__`` calls first (``check_declared(self, "method.")``)."""
    problems = declared_problems(obj, prefix)
    if problems:
        raise ValueError("; ".join(problems))
