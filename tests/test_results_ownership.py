"""A results folder someone else can write (issue #36 item 6): a sweep folder, or a folder on the way to it, that
another user owns or can write is refused before anything is read or written there; every file the harness writes
there replaces a link planted at its name instead of writing through it (docs/cluster-security.md)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.config.results_folder import UnsafeFolderError, secure_sweep_folder
from harness.config.schema import ConfigError

DEFAULT_SWEEP = CONFIG_DIR / "sweeps" / "default.yaml"
SNAKEMAKE = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO_ROOT / "Snakefile")]
NOBODY = 65534  # nobody / nogroup
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user (chown) needs root")


def _resolved(results: Path, *overrides: str):
    return resolve(DEFAULT_SWEEP, [f"results_dir={results}", *overrides])


def _refused_data_job(capsys, results: Path, *overrides: str) -> str:
    """`harness data` (the first job of a sweep) on ``results``: refused, nothing written; the error message."""
    before = sorted(results.rglob("*")) if results.exists() else []
    status = main(["data", "--sweep", str(DEFAULT_SWEEP), "--set", f"results_dir={results}",
                   *(a for o in overrides for a in ("--set", o))])
    message = capsys.readouterr().err
    assert status == 2, message
    assert "refusing results folder" in message
    assert (sorted(results.rglob("*")) if results.exists() else []) == before  # no data/ written
    return message


@pytest.mark.parametrize(("where", "mode"), [
    pytest.param(where, mode, id=f"{where}-{mode:04o}") for where, mode in [
        ("sweep", 0o777), ("sweep", 0o1777), ("sweep", 0o757),  # the sweep folder: yours alone, sticky or not
        ("results", 0o777), ("above", 0o757)]  # on the way: not without the sticky bit
])
def test_a_folder_others_can_write_is_refused_before_anything_is_written(capsys, tmp_path, where, mode):
    results = tmp_path / "above" / "results"
    (results / "default").mkdir(parents=True)
    folder = {"sweep": results / "default", "results": results, "above": results.parent}[where]
    folder.chmod(mode)
    message = _refused_data_job(capsys, results)
    assert f"{folder}: it is writable by others" in message and f"mode {mode:04o}" in message
    assert f"o-w {folder}" in message  # the fix: chmod o-w (go-w when a group may write too)


def test_a_sticky_world_writable_folder_above_the_results_passes_and_missing_folders_are_created_closed(tmp_path):
    shared_tmp = tmp_path / "tmp"  # like /tmp
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    results = shared_tmp / "x" / "results"
    old = os.umask(0o002)  # a lab's umask: the folders the harness creates are still writable by you alone
    try:
        real = secure_sweep_folder(_resolved(results))
        assert os.umask(0o002) & 0o022 == 0o022  # this process (and its jobs) create closed files from now on
    finally:
        os.umask(old)
    assert real == results / "default"
    for folder in (shared_tmp / "x", results, results / "default"):
        assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o755, oct(folder.stat().st_mode)
    assert secure_sweep_folder(_resolved(results), create=False) == real


def test_a_reading_command_checks_without_creating(tmp_path):
    results = tmp_path / "results"
    assert secure_sweep_folder(_resolved(results), create=False) is None
    assert not results.exists()
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(UnsafeFolderError, match="writable by others"):
        secure_sweep_folder(_resolved(tmp_path / "open" / "results"), create=False)


@as_root
@pytest.mark.parametrize("where", ["sweep", "results"])
def test_a_folder_of_another_user_is_refused(capsys, tmp_path, where):
    """The sweep folder, the results folder, or (results_dir = /tmp/x) a folder of /tmp that another user made."""
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    results = shared_tmp / "x"
    (results / "default").mkdir(parents=True)
    folder = results / "default" if where == "sweep" else results
    os.chown(folder, NOBODY, NOBODY)
    message = _refused_data_job(capsys, results)
    assert f"{folder} (the {'sweep folder' if where == 'sweep' else 'results folder (results_dir)'}): it belongs " \
           f"to nobody (uid {NOBODY})" in message
    assert "have it handed to you (chown)" in message


@as_root
def test_a_folder_above_the_results_folder_may_belong_to_another_user(tmp_path):
    """Home, project and scratch roots are the site's: their owners are not asked for, only that they are not
    writable by others without the sticky bit."""
    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    os.chown(project, NOBODY, NOBODY)
    assert secure_sweep_folder(_resolved(project / "alice" / "results")) == project / "alice" / "results" / "default"


@as_root
def test_a_linked_sweep_folder_is_checked_where_it_leads(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    mine, theirs = tmp_path / "scratch" / "mine", tmp_path / "scratch" / "theirs"
    (mine / "default").mkdir(parents=True)
    (theirs / "default").mkdir(parents=True)
    (results / "default").symlink_to(mine / "default")
    assert secure_sweep_folder(_resolved(results)) == mine / "default"
    (results / "default").unlink()
    (results / "default").symlink_to(theirs / "default")
    os.chown(theirs, NOBODY, NOBODY)  # a folder another user controls holds the sweep folder the link leads to
    with pytest.raises(UnsafeFolderError, match=re.escape(f"{theirs} (the folder holding the sweep folder): it "
                                                          "belongs to nobody")):
        secure_sweep_folder(_resolved(results))


@as_root
def test_a_group_writable_folder_needs_the_trusted_group(tmp_path, monkeypatch):
    lab = tmp_path / "lab"  # a lab's shared project folder: setgid, writable by the group, made by a colleague
    lab.mkdir()
    os.chown(lab, NOBODY, NOBODY)
    lab.chmod(0o2775)
    results = lab / "results"
    with pytest.raises(UnsafeFolderError, match=re.escape(f"{lab}: it is writable by group nogroup (gid {NOBODY})")
                       + ".*chmod go-w.*set results_trusted_group: nogroup"):
        secure_sweep_folder(_resolved(results))
    assert not results.exists()
    with pytest.raises(ConfigError, match="are not a member of group 'nogroup'"):
        secure_sweep_folder(_resolved(results, "results_trusted_group=nogroup"))
    monkeypatch.setattr(os, "getgroups", lambda: [NOBODY])  # a member of the group
    resolved = _resolved(results, "results_trusted_group=nogroup")
    assert secure_sweep_folder(resolved) == results / "default"
    results.chmod(0o2775)  # the results folder a colleague of the group shares
    os.chown(results, NOBODY, NOBODY)
    assert secure_sweep_folder(resolved) == results / "default"
    assert resolved.to_dict()["sweep"]["results_trusted_group"] == "nogroup"  # in every run.json's config
    results.chmod(0o2777)  # writable by others: the group's trust does not cover them
    with pytest.raises(UnsafeFolderError, match="writable by others"):
        secure_sweep_folder(resolved)


def test_an_unknown_trusted_group_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="key 'results_trusted_group': no group 'no-such-group-here'"):
        secure_sweep_folder(_resolved(tmp_path / "results", "results_trusted_group=no-such-group-here"))


def test_your_own_private_group_counts_as_yours(tmp_path):
    import grp
    import pwd

    user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(os.getegid())
    if group.gr_name != user.pw_name or set(group.gr_mem) - {user.pw_name} or user.pw_gid != os.getegid():
        pytest.skip("this user has no private group")
    results = tmp_path / "results"
    (results / "default").mkdir(parents=True)
    for folder in (results, results / "default"):
        folder.chmod(0o775)  # umask 002 with a user private group
    assert secure_sweep_folder(_resolved(results)) == results / "default"


def test_the_snakefile_refuses_a_results_folder_others_can_write(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)
    done = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--config", f"results_dir={results}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert f"refusing results folder {results}: it is writable by others" in done.stdout + done.stderr
    assert list(results.iterdir()) == []  # no sweep folder, no sweep.yaml, no snapshot


def test_a_dry_run_replaces_a_link_planted_at_sweep_yaml(tmp_path):
    """The reported case: a link at results/<sweep>/sweep.yaml made a root dry run overwrite the file it named."""
    results = tmp_path / "results"
    sweep = results / "default"
    sweep.mkdir(parents=True)
    victim = tmp_path / "root-only.conf"
    victim.write_text("untouched\n")
    (sweep / "sweep.yaml").symlink_to(victim)
    done = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--config", f"results_dir={results}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert victim.read_text() == "untouched\n"
    assert not (sweep / "sweep.yaml").is_symlink()
    assert json.loads((sweep / "sweep.yaml").read_text())["results_dir"] == str(results)


def test_the_harness_writers_replace_a_planted_link_or_refuse_it(tmp_path):
    from harness.config.snapshot import write_snapshot
    from harness.data.files import append_text, write_json_atomic, write_jsonl_atomic, write_text_atomic
    from harness.train.run import _drop_metrics_after

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    folder = tmp_path / "run"
    folder.mkdir()
    for name, write in [("a.txt", lambda p: write_text_atomic(p, "new")),
                        ("b.json", lambda p: write_json_atomic(p, {"new": 1})),
                        ("c.jsonl", lambda p: write_jsonl_atomic(p, [{"new": 1}]))]:
        (folder / name).symlink_to(victim)
        write(folder / name)
        assert not (folder / name).is_symlink() and "new" in (folder / name).read_text()
    metrics = folder / "metrics.jsonl"
    metrics.symlink_to(victim)
    _drop_metrics_after(metrics, 5)  # a resumed run trims its metrics
    assert not metrics.is_symlink()
    metrics.unlink()
    metrics.symlink_to(victim)
    with pytest.raises(ValueError, match="is a symbolic link: refusing to append through it"):
        append_text(metrics, '{"step": 1}\n')  # a training step's metrics line
    (folder / "dangling").symlink_to(tmp_path / "created-through-a-link")
    with pytest.raises(ValueError, match="symbolic link"):
        append_text(folder / "dangling", "x\n")
    assert not (tmp_path / "created-through-a-link").exists()
    assert victim.read_text() == "untouched"
    append_text(folder / "log.jsonl", "1\n")
    append_text(folder / "log.jsonl", "2\n")
    assert (folder / "log.jsonl").read_text() == "1\n2\n"
    snapshot = write_snapshot(resolve(DEFAULT_SWEEP), REPO_ROOT, folder / "sweeps")
    text = snapshot.read_text()
    snapshot.unlink()
    snapshot.symlink_to(victim)
    victim.write_text(text)  # the same text behind a link: the link is still replaced
    assert write_snapshot(resolve(DEFAULT_SWEEP), REPO_ROOT, folder / "sweeps") == snapshot
    assert not snapshot.is_symlink() and snapshot.read_text() == text
