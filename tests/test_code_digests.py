"""Which code a result came from (harness/config/code_digests.py): a method module's source in its labels' training
digest, so editing a method reruns exactly its train jobs; shared code and packages recorded in every run and
evaluation, and finished results from other code listed by `harness plan` and the Snakefile's parse."""

import importlib.util
import json
import sys

import pytest

from harness.cli import main
from harness.config.code_digests import code_record, method_source_files, stale_results
from harness.config.loading import resolve
from harness.config.paths import REPO_ROOT, WARMSTART_LABEL, SweepPaths
from harness.config.schema import MethodSpec
from harness.config.snapshot import digest, evaluation_config, train_job_config, warmstart_config
from methods import registry
from methods.base import Method

DEFAULT = REPO_ROOT / "configs" / "sweeps" / "default.yaml"

METHOD = '''
from methods.base import Method
from methods.registry import register_method
from {package}.helper import SCALE


@register_method("edited-for-test")
class Edited(Method):
    """A method module that imports a helper module of its own package."""
'''


@pytest.fixture
def own_method(tmp_path, monkeypatch):
    """A method package outside methods/: its module and the helper it imports, registered for the test only."""
    package = tmp_path / "ownmethods"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("SCALE = 1.0\n")
    (package / "edited.py").write_text(METHOD.format(package="ownmethods"))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.registered_methods()  # the built-in methods first: they stay registered after the test
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # this registration leaves with the test
    spec = importlib.util.spec_from_file_location("ownmethods.edited", package / "edited.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ownmethods.edited", module)
    spec.loader.exec_module(module)
    return package


def test_a_method_module_and_the_modules_it_imports_but_the_shared_ones(own_method):
    assert [p.name for p in method_source_files("nat")] == ["nat.py"]  # base and registry are shared code
    assert [p.name for p in method_source_files("edited-for-test")] == ["edited.py", "helper.py"]


def test_editing_a_method_reruns_its_labels_and_no_other(own_method):
    resolved = resolve(DEFAULT)
    edited, other = MethodSpec("mine", "edited-for-test", Method.Config()), resolved.methods["entropy"]
    before = [digest(train_job_config(resolved, spec)) for spec in (edited, other)]
    (own_method / "helper.py").write_text("SCALE = 2.0\n")  # a module the method imports
    after_helper = [digest(train_job_config(resolved, spec)) for spec in (edited, other)]
    (own_method / "edited.py").write_text(METHOD.format(package="ownmethods") + "\n# a comment\n")
    after_module = [digest(train_job_config(resolved, spec)) for spec in (edited, other)]
    assert before[0] != after_helper[0] != after_module[0]
    assert before[1] == after_helper[1] == after_module[1]


def test_the_prompt_template_is_in_the_warm_start_and_evaluation_digests():
    resolved = resolve(DEFAULT)
    other = resolve(DEFAULT, ["prompt_template=qwen_boxed"])
    assert digest(warmstart_config(resolved)) != digest(warmstart_config(other))
    assert digest(evaluation_config(resolved)) != digest(evaluation_config(other))


def write_json(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def test_finished_results_from_other_code_are_listed(tmp_path):
    paths = SweepPaths(tmp_path)
    current = code_record("uniform")
    write_json(paths.run_file("uniform", 0), {"provenance": {"code": current}})
    write_json(paths.run_file("uniform", 1), {"provenance": {"code": {**current, "training_code": "0" * 64}}})
    write_json(paths.run_file("entropy", 0), {"provenance": {}})  # written before code digests
    write_json(paths.results_file("uniform", 0, "ckpt-100", "gsm8k"), {"code": current})
    write_json(paths.results_file(WARMSTART_LABEL, 0, "ckpt-000", "gsm8k"),
               {"code": {**current, "evaluation_code": "1" * 64, "packages": "2" * 64}})
    lines = stale_results(paths, ["uniform", "entropy", WARMSTART_LABEL])
    assert lines == [
        "run uniform/seed1: shared training code differ from this checkout's",
        "run entropy/seed0: shared training code, evaluation code, installed packages differ from this checkout's",
        "evaluation warmstart/seed0/ckpt-000/gsm8k: evaluation code, installed packages differ from this checkout's"]


def test_harness_plan_lists_them(tmp_path, capsys):
    resolved = resolve(DEFAULT, [f"results_dir={tmp_path}"])
    paths = SweepPaths(resolved.results_dir)
    write_json(paths.run_file("uniform", 0), {"provenance": {"code": {**code_record("uniform"), "packages": "x"}}})
    assert main(["plan", "--sweep", str(DEFAULT), "--set", f"results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "finished results from other code (kept, not rerun" in out
    assert "run uniform/seed0: installed packages differ from this checkout's" in out
