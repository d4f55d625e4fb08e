"""scripts/local-slurm.sh is safe on a node of a real cluster (issue #36 items 1-3), checked without Slurm: stub
executables stand in for sinfo, squeue, scancel, the daemons and munge, and log how they were called (with the
SLURM_CONF they saw).

- With a slurm.conf in /etc that the script did not write, start refuses before creating anything and stop cancels
  no jobs; stop cancels jobs only through its own slurm.conf while its own slurmctld runs.
- A pid file naming a process that is not the daemon (or one that started after the file was written) kills nothing.
- The state folder's whole path must be root's alone: a folder above it owned by another user, writable by group or
  others without the sticky bit, or a symbolic link, is refused by start and stop; checked again before a failed
  start or stop kills anything.

The script runs as root; it is pointed at temporary folders (LOCAL_SLURM_DIR, LOCAL_SLURM_ETC_CONF,
LOCAL_SLURM_SBIN), never at /etc/slurm or /var/lib/local-slurm, where CI's live cluster may run meanwhile; the only
processes it may kill are the ones these tests start."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local-slurm.sh"
MARKER = "# written by scripts/local-slurm.sh"
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="scripts/local-slurm.sh runs as root")

# every stub logs its name, its arguments and the SLURM_CONF it saw, one tab-separated line per call
LOG_LINE = 'printf \'%s\\t%s\\t%s\\n\' "$(basename "$0")" "$*" "${SLURM_CONF-unset}" >> "$STUB_LOG"\n'
STUBS = {
    "sinfo": 'if [ "$*" = "-h -o %t" ]; then echo idle; else echo "local* up infinite 1 idle stub"; fi',
    "squeue": 'if [ -n "${STUB_SQUEUE_CHMOD:-}" ]; then chmod 0777 "$STUB_SQUEUE_CHMOD"; fi; printf "101\\n102\\n"',
    "scancel": "",
    "sbatch": "",
    "scontrol": "",
    "slurmd": 'if [ "$1" = -C ]; then echo "NodeName=stub CPUs=1 RealMemory=1000"; fi',
    # a start that fails after writing its config: with STUB_CTLD_CHMOD, the folder named there is opened to all first
    "slurmctld": 'if [ -n "${STUB_CTLD_CHMOD:-}" ]; then chmod 0777 "$STUB_CTLD_CHMOD"; exit 1; fi',
    "munged": "exit 1",
    "munge": "echo credential",
    "unmunge": "cat >/dev/null",
    "mungekey": "exit 1",
}


class Node:
    """Temporary stand-ins for /usr/sbin, /etc/slurm/slurm.conf and /var/lib/local-slurm, and the processes started."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.bin = tmp_path / "bin"  # stub clients and daemons, first on PATH
        self.sbin = tmp_path / "sbin"  # LOCAL_SLURM_SBIN: stubs, or copies of sleep posing as daemons
        self.etc_conf = tmp_path / "etc" / "slurm" / "slurm.conf"
        self.log = tmp_path / "stubs.log"
        self.dir = tmp_path / "srv" / "local-slurm"
        self.processes: list[subprocess.Popen] = []
        self.bin.mkdir()
        self.sbin.mkdir()
        for name, body in STUBS.items():
            for folder in (self.bin, self.sbin):
                stub = folder / name
                stub.write_text(f"#!/bin/bash\n{LOG_LINE}{body}\n")
                stub.chmod(0o755)
        self.log.touch()
        self.env = {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"},
                    "PATH": f"{self.bin}:{os.environ['PATH']}", "STUB_LOG": str(self.log),
                    "LOCAL_SLURM_ETC_CONF": str(self.etc_conf), "LOCAL_SLURM_SBIN": str(self.sbin)}

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def run(self, command: str, **env: str) -> subprocess.CompletedProcess:
        env = {**self.env, "LOCAL_SLURM_DIR": str(self.dir), **env}
        # never the real paths of a live cluster on this machine (a relative path is taken from self.root)
        assert all(str(self.root / env[k]).startswith(str(self.root))
                   for k in ("LOCAL_SLURM_DIR", "LOCAL_SLURM_ETC_CONF", "LOCAL_SLURM_SBIN"))
        # in a session of its own: a pid the script got wrong must not be this test's process group
        return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=60, env=env,
                              cwd=self.root, start_new_session=True)

    def calls(self, name: str) -> list[tuple[str, str]]:
        """(arguments, SLURM_CONF) of each call of stub `name`."""
        lines = [line.split("\t") for line in self.log.read_text().splitlines()]
        return [(args, conf) for stub, args, conf in lines if stub == name]

    def make_dir(self, conf: bool = True) -> Path:
        """The state folder as start leaves it, with a slurm.conf written by the script."""
        self.dir.parent.mkdir(mode=0o755, exist_ok=True)
        self.dir.mkdir(mode=0o755)
        for sub in ("state", "spool", "log", "run"):
            (self.dir / sub).mkdir(mode=0o700 if sub == "state" else 0o755)
        if conf:
            self.conf.write_text(f"{MARKER} for stub: state under {self.dir}\nClusterName=local\n")
        return self.dir

    def real_cluster_conf(self) -> None:
        self.etc_conf.parent.mkdir(parents=True, exist_ok=True)
        self.etc_conf.write_text("ClusterName=real\nSlurmctldHost=head\n")

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        process = subprocess.Popen(argv)
        self.processes.append(process)
        time.sleep(0.05)
        return process

    def fake_daemon(self, name: str, pidfile: str | None = None) -> subprocess.Popen:
        """A process whose executable is $LOCAL_SLURM_SBIN/<name> (a copy of sleep), its pid written after it
        started, as the daemon writes it."""
        daemon = self.sbin / name
        daemon.unlink()
        shutil.copy2(shutil.which("sleep"), daemon)
        process = self.spawn([str(daemon), "1000"])
        (self.dir / "run" / (pidfile or f"{name}.pid")).write_text(f"{process.pid}\n")
        return process

    def stop_processes(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    yield node
    node.stop_processes()


def alive(process: subprocess.Popen) -> bool:
    return process.poll() is None


def killed(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


# 1. a real cluster on the node


def test_start_refuses_a_real_cluster_before_creating_anything(node):
    node.real_cluster_conf()
    done = node.run("start")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "real cluster" in done.stderr and "nothing created" in done.stderr
    assert not node.dir.parent.exists()  # neither the folder nor the one above it
    assert node.etc_conf.read_text().startswith("ClusterName=real")
    assert not node.calls("slurmctld") and not node.calls("slurmd")


@pytest.mark.parametrize("own_slurmctld", [False, True], ids=["own slurmctld stopped", "own slurmctld running"])
def test_stop_cancels_no_jobs_of_a_real_cluster(node, own_slurmctld):
    """stop as CI's EXIT trap runs it after start refused: a cluster answers sinfo, but it is not this script's."""
    node.real_cluster_conf()
    node.make_dir()
    daemon = node.fake_daemon("slurmctld") if own_slurmctld else None
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not node.calls("scancel") and not node.calls("squeue")
    assert node.etc_conf.read_text().startswith("ClusterName=real")
    if daemon is not None:
        assert killed(daemon)  # its own daemons still stop


def test_stop_cancels_no_jobs_while_its_own_slurmctld_is_not_running(node):
    node.make_dir()
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not node.calls("scancel") and not node.calls("squeue")


def test_stop_cancels_no_jobs_without_its_own_config(node):
    node.make_dir(conf=False)
    node.conf.write_text("ClusterName=real\n")  # not marked as written by the script
    daemon = node.fake_daemon("slurmctld")
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not node.calls("scancel")
    assert killed(daemon)


def test_stop_cancels_its_own_jobs_through_its_own_config(node):
    node.make_dir()
    ctld, slurmd = node.fake_daemon("slurmctld"), node.fake_daemon("slurmd")
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.calls("squeue") == [("-h -o %i", str(node.conf))]
    assert node.calls("scancel") == [("101 102", str(node.conf))]
    assert killed(ctld) and killed(slurmd)
    assert not list((node.dir / "run").iterdir())


def test_start_and_status_ask_their_own_cluster(node):
    node.dir.parent.mkdir(mode=0o755)
    target = node.root / "target"
    target.write_text("untouched\n")
    node.make_dir(conf=False)
    (node.dir / "slurm.conf.tmp").symlink_to(target)  # the old, predictable temporary name
    done = node.run("start")
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_text() == "untouched\n"
    assert node.conf.read_text().startswith(MARKER) and node.conf.stat().st_mode & 0o777 == 0o644
    assert not [p.name for p in node.dir.iterdir() if p.name.startswith(".slurm.conf.")]  # no temporary file left
    assert node.etc_conf.is_symlink() and os.readlink(node.etc_conf) == str(node.conf)
    assert node.calls("slurmctld") == [(f"-f {node.conf}", "unset")]
    assert node.calls("sinfo") and all(conf == str(node.conf) for _, conf in node.calls("sinfo"))
    node.log.write_text("")
    node.run("status")
    assert node.calls("sinfo") and node.calls("squeue")
    assert all(conf == str(node.conf) for name in ("sinfo", "squeue") for _, conf in node.calls(name))


def test_start_creates_the_missing_folders_with_their_modes(node):
    node.dir = node.root / "a" / "b" / "local-slurm"
    done = node.run("start")
    assert done.returncode == 0, done.stdout + done.stderr
    for folder in (node.root / "a", node.root / "a" / "b", node.dir, node.dir / "run"):
        assert folder.stat().st_mode & 0o7777 == 0o755 and folder.stat().st_uid == 0
    assert (node.dir / "state").stat().st_mode & 0o7777 == 0o700


# 2. pid files that outlived their daemon


@pytest.mark.parametrize("daemon", ["slurmctld", "slurmd", "munged"])
def test_stop_kills_no_process_that_is_not_the_daemon(node, daemon):
    node.make_dir()
    bystander = node.spawn(["sleep", "1000"])  # got the pid of a daemon gone with a reboot or a crash
    (node.dir / "run" / f"{daemon}.pid").write_text(f"{bystander.pid}\n")
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert alive(bystander)
    assert not (node.dir / "run" / f"{daemon}.pid").exists()
    assert "killing nothing" in done.stderr and str(bystander.pid) in done.stderr
    assert not node.calls("scancel")


def test_stop_kills_no_daemon_that_started_after_its_pid_file(node):
    node.make_dir()
    pidfile = node.dir / "run" / "slurmctld.pid"
    daemon = node.fake_daemon("slurmctld")
    written = time.time() - 3600  # the file an hour old: written by an earlier slurmctld that had this pid
    os.utime(pidfile, (written, written))
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert alive(daemon) and not pidfile.exists()
    assert not node.calls("scancel")


def test_start_starts_the_daemon_when_its_pid_file_names_another_process(node):
    node.make_dir()
    bystander = node.spawn(["sleep", "1000"])
    (node.dir / "run" / "slurmctld.pid").write_text(f"{bystander.pid}\n")
    done = node.run("start")
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.calls("slurmctld") == [(f"-f {node.conf}", "unset")]
    assert alive(bystander)


# 3. the path of the state folder


def _make_unsafe(node, kind: str) -> None:
    parent = node.dir.parent
    if kind == "parent another user's":
        os.chown(parent, NOBODY, NOBODY)
    elif kind == "parent writable by group":
        parent.chmod(0o775)
    elif kind == "parent writable by all":
        parent.chmod(0o777)
    elif kind == "grandparent writable by all":
        node.root.chmod(0o777)
    elif kind == "link above":
        real = node.root / "real"
        parent.rename(real)
        parent.symlink_to(real)
    else:
        raise AssertionError(kind)


UNSAFE = ["parent another user's", "parent writable by group", "parent writable by all",
          "grandparent writable by all", "link above"]


@pytest.mark.parametrize("kind", UNSAFE)
def test_start_and_stop_refuse_a_path_another_user_controls(node, kind):
    node.make_dir()
    daemon = node.fake_daemon("slurmd")  # a pid the other user could have written or swapped in
    before = sorted(p.name for p in node.dir.rglob("*"))
    _make_unsafe(node, kind)
    try:
        for command in ("start", "stop"):
            done = node.run(command)
            assert done.returncode == 1, done.stdout + done.stderr
            assert str(node.dir) in done.stderr and "refusing" in done.stderr
        assert alive(daemon)
        assert sorted(p.name for p in node.dir.rglob("*")) == before
        assert not node.calls("scancel") and not node.calls("slurmctld")
    finally:
        node.root.chmod(0o700)  # so that pytest can clean up


@pytest.mark.parametrize("kind", ["parent another user's", "parent writable by all", "link above"])
def test_start_creates_nothing_under_a_path_another_user_controls(node, kind):
    node.dir.parent.mkdir(mode=0o755)
    _make_unsafe(node, kind)
    try:
        done = node.run("start")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "refusing" in done.stderr
        assert not node.dir.exists() and not node.dir.is_symlink()
    finally:
        node.root.chmod(0o700)


def test_a_sticky_folder_of_roots_above_is_accepted(node):
    node.make_dir()
    node.dir.parent.chmod(0o1777)  # like /tmp: no one else can rename or remove root's entries
    daemon = node.fake_daemon("slurmd")
    done = node.run("stop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert killed(daemon)


@pytest.mark.parametrize("folder", ["relative/local-slurm", "{root}/srv/../srv/local-slurm"])
def test_a_path_that_is_not_plain_is_refused(node, folder):
    node.make_dir()
    done = node.run("start", LOCAL_SLURM_DIR=folder.format(root=node.root))
    assert done.returncode == 1 and "refusing" in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("unsafe", [False, True], ids=["folder unchanged", "folder opened meanwhile"])
def test_a_failed_start_checks_the_folder_again_before_killing(node, unsafe):
    """slurmctld fails to start, so start stops what it started; if the folder has been opened to others
    meanwhile, its pid files are no longer trusted."""
    node.make_dir()
    daemon = node.fake_daemon("slurmd")  # e.g. started by this start, before the folder changed
    elsewhere = node.root / "elsewhere"
    elsewhere.mkdir()
    try:
        done = node.run("start", STUB_CTLD_CHMOD=str(node.dir.parent if unsafe else elsewhere))
        assert done.returncode == 1 and "start failed" in done.stderr, done.stdout + done.stderr
        if unsafe:
            assert alive(daemon) and "not killing" in done.stderr
        else:
            assert killed(daemon)
    finally:
        node.root.chmod(0o700)


@pytest.mark.parametrize("unsafe", [False, True], ids=["folder unchanged", "folder opened meanwhile"])
def test_stop_checks_the_folder_again_before_killing(node, unsafe):
    node.make_dir()
    ctld = node.fake_daemon("slurmctld")
    done = node.run("stop", STUB_SQUEUE_CHMOD=str(node.dir.parent) if unsafe else "")
    assert node.calls("scancel")  # jobs are cancelled first, then the folder is checked again
    if unsafe:
        assert done.returncode == 1 and "not killing" in done.stderr, done.stdout + done.stderr
        assert alive(ctld)
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert killed(ctld)
