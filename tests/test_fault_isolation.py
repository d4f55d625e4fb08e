"""Crash isolation: a method from another package (entry point) that raises fails only its own jobs;
`snakemake -k` finishes the rest and `harness report` lists the failed run with the head of its error."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from test_sweep_integration import CI_SWEEP, REPO, snakemake

FAULTY_MODULE = '''
from dataclasses import dataclass

from methods.base import Method
from methods.registry import register_method


@register_method("faulty")
class Faulty(Method):
    @dataclass
    class Config:
        pass

    def token_weights(self, stats, batch, ctx):
        raise RuntimeError("injected failure in faulty.token_weights")
'''


def install_faulty_package(site: Path) -> None:
    """A module plus the dist-info that importlib.metadata reads: the `harness.methods` entry point group."""
    (site / "faulty_method.py").write_text(FAULTY_MODULE)
    info = site / "faulty_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[harness.methods]\nfaulty = faulty_method\n")


def test_a_failing_method_fails_only_its_jobs(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    install_faulty_package(site)
    configs = tmp_path / "method_configs"
    configs.mkdir()
    (configs / "faulty.yaml").write_text("method: faulty\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    sweep_file = tmp_path / "faults.yaml"
    sweep_file.write_text(yaml.safe_dump({**CI_SWEEP, "name": "faults", "methods": ["uniform", "faulty"],
                                          "method_config_dirs": [str(configs)],
                                          "results_dir": str(tmp_path / "results")}))
    run = snakemake(tmp_path, sweep_file, "--keep-going")
    assert run.returncode != 0
    root = tmp_path / "results" / "faults"
    assert (root / "runs" / "uniform" / "seed0" / "run.json").is_file()
    assert (root / "eval" / "uniform" / "seed0" / "ckpt-100" / "arith" / "results.json").is_file()
    assert not (root / "runs" / "faulty" / "seed0" / "run.json").exists()
    assert not list((root / "runs" / "faulty" / "seed0").glob("ckpt-*"))  # nothing that looks complete

    report = subprocess.run([sys.executable, "-m", "harness.cli", "report", "--sweep", str(sweep_file)],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    leaderboard = (root / "leaderboard.md").read_text()
    assert "Failed run, left out:** `faulty` seed 0 (train)" in leaderboard
    assert "RuntimeError: injected failure in faulty.token_weights" in leaderboard
    assert "injected failure" in (root / "report.html").read_text()
    assert "| uniform |" in leaderboard
