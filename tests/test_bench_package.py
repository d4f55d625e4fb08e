"""bench/ and studies/ are packages run as ``python -m <package>.<name>``: every script imports (its helpers from
the packages, not through sys.path) and parses its options, and the shared statistics and summary sections behave."""

import ast
import importlib

import pytest

from bench.publish import update_summary
from bench.stats import describe, paired_ratio, quantile
from harness.config.paths import REPO_ROOT

PACKAGES = ("bench", "studies")
SCRIPTS = sorted(f"{package}.{path.stem}" for package in PACKAGES for path in (REPO_ROOT / package).glob("*.py")
                 if 'if __name__ == "__main__":' in path.read_text())


def test_the_scripts_are_found():
    assert {"bench.step_overhead", "bench.minibatch_cost", "studies.interval_coverage"} <= set(SCRIPTS)


@pytest.mark.parametrize("module", SCRIPTS)
def test_each_script_imports_and_parses_its_options(module, capsys):
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(module).main(["--help"])
    assert exited.value.code == 0
    assert "--results" in capsys.readouterr().out


@pytest.mark.parametrize("path", [p for package in PACKAGES for p in sorted((REPO_ROOT / package).glob("*.py"))],
                         ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_module_edits_sys_path(path):
    edits = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert edits == []


def test_paired_ratio_is_the_median_of_per_pair_ratios():
    ratio = paired_ratio([2.0, 3.0, 8.0, 1.0], [1.0, 1.0, 2.0, 0.0])  # the pair with a zero denominator is dropped
    assert ratio["n"] == 3 and ratio["median"] == 3.0 and ratio["ratio_of_sums"] == 13.0 / 4.0
    lo, hi = ratio["ci90_median"]
    assert 2.0 <= lo <= 3.0 <= hi <= 4.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == 1.75 and describe([])["n"] == 0


def test_update_summary_replaces_only_its_own_section(tmp_path):
    update_summary(tmp_path, "a", "first a")
    update_summary(tmp_path, "b", "only b")
    update_summary(tmp_path, "a", "second a")
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# Benchmarks") and "first a" not in text
    assert text.index("second a") < text.index("only b")  # replaced in place, not appended
