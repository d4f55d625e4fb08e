"""Methods by name: ``@register_method("gmts")`` on the class; third-party packages register through the
``harness.methods`` entry point group (the entry point names a module or a Method subclass; importing it
registers it)."""

from __future__ import annotations

from importlib.metadata import entry_points

from methods.base import Method

ENTRY_POINT_GROUP = "harness.methods"
_REGISTRY: dict[str, type[Method]] = {}
_entry_points_loaded = False


def register_method(name: str):
    """Class decorator: register ``cls`` under ``name``; a taken name raises."""

    def decorate(cls: type[Method]) -> type[Method]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method name {name!r} is already registered by {_REGISTRY[name].__module__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        entry_point.load()


def registered_methods() -> list[str]:
    import methods  # noqa: F401  (registers the built-in methods)

    _load_entry_points()
    return sorted(_REGISTRY)


def get_method_class(name: str) -> type[Method]:
    known = registered_methods()
    if name not in _REGISTRY:
        raise KeyError(f"unknown method {name!r}; registered methods: {', '.join(known)}")
    return _REGISTRY[name]
