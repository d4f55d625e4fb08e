"""methods/registry.py and the ``needs`` check of methods/base.py: built-in methods are found without a list, and a
method naming an unknown token statistic is refused with its name, the bad name and the allowed ones."""

from pathlib import Path

import pytest

import methods
from methods.base import STATISTICS, Method, TokenStats
from methods.registry import builtin_method_modules, get_method_class, register_method, registered_methods


def test_every_module_of_the_package_is_a_discovered_method():
    files = sorted(p.stem for p in Path(methods.__file__).parent.glob("*.py")
                   if p.stem not in ("__init__", "base", "declaration", "registry"))
    assert builtin_method_modules() == [f"methods.{stem}" for stem in files]
    assert set(files) <= set(registered_methods())  # each built-in module registers the method of its name


def test_statistics_are_the_token_stats_fields():
    assert set(STATISTICS) == set(TokenStats.__dataclass_fields__) - {"logp", "old_logp"}


def test_a_typo_in_needs_is_refused_at_registration():
    class Typo(Method):
        needs = frozenset({"entropy", "entorpy"})

    with pytest.raises(ValueError) as info:
        register_method("needs_typo")(Typo)
    message = str(info.value)
    assert "'needs_typo'" in message and "['entorpy']" in message
    assert all(name in message for name in STATISTICS)
    with pytest.raises(KeyError):
        get_method_class("needs_typo")  # nothing was registered


def test_needs_as_a_bare_string_is_refused():
    class Bare(Method):
        needs = "entropy"

    with pytest.raises(ValueError, match="set of statistic names"):
        register_method("needs_bare")(Bare)


def test_needs_set_by_an_instance_is_checked_too():
    gmts = get_method_class("gmts")()
    gmts.needs = frozenset({"sum_p2"})  # what GMTS does for score=exact_gradient
    assert gmts.needs == frozenset({"sum_p2"})
    with pytest.raises(ValueError, match=r"method 'gmts' \(GMTS\).*\['sum_p3'\].*allowed: \['entropy', 'sum_p2'"):
        gmts.needs = {"sum_p3"}
