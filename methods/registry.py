"""Methods by name: ``@register_method("gmts")`` on the class.

Built-in methods are the modules of the ``methods`` package, found by ``pkgutil``, so adding ``methods/<name>.py``
is enough. Third-party packages register through the ``harness.methods`` entry point group (the entry point names a
module or a Method subclass; importing it registers it).

Modules are imported when a name is looked up: ``methods/<name>.py`` first (a built-in module registers the method
of its name), the others only when that does not register it. A module that fails to import breaks only the lookups
that need it, with its file and line in the error: a sweep that does not use it still runs."""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from importlib.metadata import entry_points

from methods.base import Method, check_needs

ENTRY_POINT_GROUP = "harness.methods"
INFRASTRUCTURE_MODULES = ("base", "declaration", "registry")  # modules of the package that define no method
_REGISTRY: dict[str, type[Method]] = {}
_import_failures: dict[str, str] = {}  # module or entry point -> why it did not import (file and line)
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


def _import_failure(exc: BaseException) -> str:
    """``<file>, line <n>: <error>``: where a module failed to import (a SyntaxError's own location, else the
    innermost frame of the traceback)."""
    if isinstance(exc, SyntaxError):
        return f"{exc.filename}, line {exc.lineno}: SyntaxError: {exc.msg}"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename}, line {frame.lineno}: {type(exc).__name__}: {exc}"


def _try_import(what: str, load) -> None:
    if what in _import_failures:
        return
    try:
        load()
    except Exception as exc:  # any error in a method module: recorded, reported by the lookups that need it
        _import_failures[what] = _import_failure(exc)


def _load_methods() -> None:
    """Import the built-in method modules, then the entry points of other packages (once per process)."""
    global _methods_loaded
    if _methods_loaded:
        return
    for module in builtin_method_modules():
        _try_import(module, lambda module=module: importlib.import_module(module))
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        _try_import(f"entry point {entry_point.name} ({entry_point.value})", entry_point.load)
    _methods_loaded = True


def registered_methods() -> list[str]:
    """Every method that registered; a module that failed to import registered nothing (``import_failures``)."""
    _load_methods()
    return sorted(_REGISTRY)


def import_failures() -> dict[str, str]:
    """{module or entry point: ``<file>, line <n>: <error>``} for those that failed to import so far."""
    return dict(_import_failures)


def get_method_class(name: str) -> type[Method]:
    """The class registered as ``name``; a KeyError names the registered methods and every module that failed to
    import (one of them may have been meant to register it)."""
    own_module = f"methods.{name}"
    if name not in _REGISTRY and own_module in builtin_method_modules():
        _try_import(own_module, lambda: importlib.import_module(own_module))
    if name not in _REGISTRY:
        _load_methods()
    if name not in _REGISTRY:
        failures = "".join(f"; {what} failed to import: {why}" for what, why in sorted(_import_failures.items()))
        raise KeyError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_REGISTRY))}{failures}")
    return _REGISTRY[name]
