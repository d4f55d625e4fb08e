"""The ``harness`` command line reads like the rest: ``--help`` lists every subcommand on one line, ``--version``
names the installed version and the commit, help texts point to documents that exist, and defaults print as paths
in the checkout."""

import argparse
import importlib.metadata
import re
import subprocess

import pytest

from harness.cli import DISTRIBUTION, build_parser, main
from harness.config.paths import REPO_ROOT

DOCUMENT = re.compile(r"(?:docs/[\w.-]+\.md|README\.md)")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_version_names_the_installed_distribution_and_the_commit(capsys):
    out = help_text(["--version"], capsys).strip()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert out.startswith(f"harness {importlib.metadata.version(DISTRIBUTION)} ({DISTRIBUTION}), git commit ")
    assert commit.strip() and commit.strip() in out


def test_help_lists_every_subcommand_on_one_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps at the terminal's width
    out = help_text(["--help"], capsys)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    block = lines[lines.index("  COMMAND") + 1:]
    block = block[:block.index("")]
    names = list(subcommands())
    assert [line.split()[0] for line in block] == names  # one line each, none wrapped onto a second
    for line, (name, parser) in zip(block, subcommands().items(), strict=True):
        summary = line.removeprefix(f"    {name}").strip()
        assert summary and parser.description.lower().startswith(summary.lower()), (name, line)


def test_every_subcommand_names_the_documents_that_hold_its_formats(capsys):
    for name in subcommands():
        text = help_text([name, "--help"], capsys)
        named = DOCUMENT.findall(text)
        assert named, f"harness {name} --help names no document"
        assert all((REPO_ROOT / doc).is_file() for doc in named), (name, named)
    top = help_text(["--help"], capsys)
    assert all((REPO_ROOT / doc).is_file() for doc in DOCUMENT.findall(top)) and "docs/statistics.md" in top


def test_defaults_print_as_paths_in_the_checkout(capsys):
    for argv in (["--help"], *([name, "--help"] for name in subcommands())):
        text = help_text(argv, capsys)
        assert str(REPO_ROOT) not in text, argv
    assert "(default: configs/sweeps/default.yaml)" in help_text(["report", "--help"], capsys).replace("\n", " ")
