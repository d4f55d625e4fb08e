"""One declaration per setting: a schema field's default, documentation, allowed values and range in one call.

``setting(default, doc, choices=..., low=..., high=...)`` returns the ``dataclasses.field`` of a scalar or list
setting; ``section(factory, doc)`` that of a nested schema. The loader checks every value against its declaration
(``declared_problems``) and ``python -m harness.config.reference`` writes docs/config-reference.md from them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple


class Declaration(NamedTuple):
    """What a field declares besides its type and default. Bounds are inclusive; None = open."""

    doc: str = ""
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None


def setting(default: Any, doc: str, *, choices: tuple | None = None, low: float | None = None,
            high: float | None = None) -> Any:
    """A setting's field; a list or dict default is copied for every instance."""
    metadata = {"declaration": Declaration(doc, choices, low, high)}
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


def declared_problems(obj: Any, prefix: str = "") -> list[str]:
    """Every value of a schema tree outside its declared choices or range, by dotted key (a mapping of schemas,
    such as ``eval.benchmarks``, is walked by its keys)."""
    if isinstance(obj, dict):
        return [p for key, value in obj.items() for p in declared_problems(value, f"{prefix}{key}.")]
    if not dataclasses.is_dataclass(obj):
        return []
    problems = []
    for f in dataclasses.fields(obj):
        value, (_, choices, low, high) = getattr(obj, f.name), declaration(f)
        # a list setting's choices hold for each of its items
        if choices is not None and any(v not in choices for v in (value if isinstance(value, list) else [value])):
            problems.append(f"key '{prefix}{f.name}': {value!r} is not one of {list(choices)}")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            problems.append(f"key '{prefix}{f.name}': {value!r} is outside the allowed range {bounds}")
        problems += declared_problems(value, f"{prefix}{f.name}.")
    return problems
