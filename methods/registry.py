"""Methods by name: ``@register_method("gmts")`` on the class.

Built-in methods are the modules of the ``methods`` package: the registry imports each of them (``pkgutil``) the
first time a name is looked up, so adding ``methods/<name>.py`` is enough. Third-party packages register through the
``harness.methods`` entry point group (the entry point names a module or a Method subclass; importing it registers
it)."""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from methods.base import Method, check_needs

ENTRY_POINT_GROUP = "harness.methods"
INFRASTRUCTURE_MODULES = ("base", "registry")  # modules of the package that define no method
_REGISTRY: dict[str, type[Method]] = {}
_methods_loaded = False


def register_method(name: str):
    """Class decorator: register ``cls`` under ``name``; a taken name or an unknown statistic in ``needs`` raises."""

    def decorate(cls: type[Method]) -> type[Method]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method name {name!r} is already registered by {_REGISTRY[name].__module__}")
        cls.needs = check_needs(f"method {name!r} ({cls.__module__}.{cls.__qualname__})", cls.needs)
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def builtin_method_modules() -> list[str]:
    """The method modules of the ``methods`` package, by import name (``methods.gmts``, ...), sorted."""
    import methods

    return sorted(f"methods.{info.name}" for info in pkgutil.iter_modules(methods.__path__)
                  if not info.ispkg and not info.name.startswith("_") and info.name not in INFRASTRUCTURE_MODULES)


def _load_methods() -> None:
    """Import the built-in method modules, then the entry points of other packages (once per process)."""
    global _methods_loaded
    if _methods_loaded:
        return
    for module in builtin_method_modules():
        importlib.import_module(module)
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        entry_point.load()
    _methods_loaded = True  # only after every import succeeded: a broken module fails every lookup, not just one


def registered_methods() -> list[str]:
    _load_methods()
    return sorted(_REGISTRY)


def get_method_class(name: str) -> type[Method]:
    known = registered_methods()
    if name not in _REGISTRY:
        raise KeyError(f"unknown method {name!r}; registered methods: {', '.join(known)}")
    return _REGISTRY[name]
