"""`harness new-method`: the scaffold is a registered method whose own test passes and which inspect can run."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness.config.paths import REPO_ROOT
from harness.ops.scaffold import scaffold_method


def test_scaffolded_method_registers_tests_green_and_inspects(tmp_path):
    shutil.copytree(REPO_ROOT / "methods", tmp_path / "methods")
    init_before = (tmp_path / "methods" / "__init__.py").read_text()
    created = scaffold_method("mymethod", root=tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in created] == [
        "methods/mymethod.py", "configs/method/mymethod.yaml", "tests/methods/test_mymethod.py"]
    assert (tmp_path / "methods" / "__init__.py").read_text() == init_before  # found by the registry, not listed
    # the copy's `methods` package shadows the repo's; `harness` comes from this checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "tests" / "methods" / "test_mymethod.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert test.returncode == 0, test.stdout[-2000:]
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"completion_ids": [[1, 2], [3, 4]], "completion_mask": [[1, 1], [1, 0]],
                                 "rewards": [1.0, 0.0], "group_ids": [0, 0], "logp": [[-1.0, -2.0], [-1.0, 0.0]],
                                 "entropy": [[0.5, 1.0], [0.2, 0.0]]}))
    inspect = subprocess.run([sys.executable, "-m", "harness.cli", "inspect", "mymethod", "--batch", str(batch),
                              "--out", str(tmp_path / "out.json")], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
    assert inspect.returncode == 0, inspect.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["method"] == "mymethod"
    # real tokens' H: 0.5, 1.0, 0.2; their 0.8 quantile is 0.8, so only H = 1.0 is kept: 1 of 3 (the metric's name
    # is the one the real methods log)
    assert out["metrics"] == {"tokens_selected_frac": pytest.approx(1 / 3)}


@pytest.mark.parametrize("name, message", [("uniform", "already exists"), ("My-Method", "lowercase"),
                                           ("class", "lowercase")])
def test_bad_or_taken_names_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        scaffold_method(name)
