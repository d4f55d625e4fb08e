"""The fork server (harness/forkserver.py): a child becomes the command (streams, directory, environment, arguments,
exit status), signals reach it, it dies with its command, and the server refuses what could change a result.

The server's children run tests/forkserver_probe.py instead of the harness CLI; the sweep integration test
(tests/test_sweep_integration.py) checks real train and eval jobs, and that a forked eval writes the same samples
as one in a process of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import forkserver

TESTS = Path(__file__).resolve().parent
CLIENT = [sys.executable, "-c", "import sys; from harness.forkserver import main; sys.exit(main())"]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs on Linux only")


def server_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def server(tmp_path):
    """A running server whose children run forkserver_probe.main; yields (socket folder, its environment)."""
    folder = tmp_path / "sockets"
    folder.mkdir()
    env = {**server_env(), forkserver.ENV_VAR: str(folder)}
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-P", "-m", "harness.forkserver", str(folder / "train.sock"),
                                "--module", "forkserver_probe", "--target", "forkserver_probe:main"],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (folder / "train.sock").exists():
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
        time.sleep(0.05)
    yield folder, env
    process.terminate()
    process.wait(timeout=10)
    log.close()
    assert not (folder / "train.sock").exists(), "the server removes its socket when it stops"


def run_client(env: dict, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLIENT, "train", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_child_takes_the_commands_streams_directory_arguments_and_status(server, tmp_path):
    folder, env = server
    env = {**env, "PATH": f"/only/in/the/command:{env['PATH']}"}  # the shell's own variables may differ
    result = run_client(env, "show", "3", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    shown = json.loads(result.stdout)
    assert shown["cwd"] == str(tmp_path)
    assert shown["argv"] == ["train", "show", "3"]
    assert shown["path"].startswith("/only/in/the/command:")
    assert shown["own_group"]
    assert "probe stderr" in result.stderr
    assert f"forked: pid={shown['pid']} exit=3 cpu_s=" in result.stderr
    assert "running in this process" not in result.stderr


@pytest.mark.parametrize(("value", "status", "stderr"), [("0", 0, ""), ("7", 7, ""), ("text", 1, "text")])
def test_system_exit_maps_to_the_status_the_interpreter_gives(server, tmp_path, value, status, stderr):
    folder, env = server
    result = run_client(env, "exit", value, cwd=tmp_path)
    assert result.returncode == status
    assert f"exit={status} " in result.stderr
    assert not stderr or stderr in result.stderr.splitlines()


def test_a_signal_to_the_command_reaches_the_child(server, tmp_path):
    folder, env = server
    client = subprocess.Popen([*CLIENT, "train", "sleep"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    child = int(client.stdout.readline())
    client.send_signal(signal.SIGTERM)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 128 + signal.SIGTERM  # as a shell reports a process killed by SIGTERM
    assert f"forked: pid={child} exit=-{int(signal.SIGTERM)}" in err
    assert not Path(f"/proc/{child}").exists()


def test_the_child_dies_with_its_command(server, tmp_path):
    folder, env = server
    client = subprocess.Popen([*CLIENT, "train", "sleep"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    child = int(client.stdout.readline())
    client.kill()  # nothing can be forwarded: the server sees the connection close
    client.wait(timeout=10)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()


def test_another_environment_runs_in_its_own_process(server, tmp_path):
    folder, env = server
    env = {**env, "HF_HOME": str(tmp_path / "elsewhere")}  # read at import time: the server's imports would differ
    result = subprocess.run([*CLIENT, "train", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert "refused: environment differs from the server's in HF_HOME: running in this process" in result.stderr
    assert result.returncode == 0 and "usage: harness" in result.stdout  # harness.cli ran here instead


def test_no_server_runs_in_its_own_process(tmp_path):
    env = {**server_env(), forkserver.ENV_VAR: str(tmp_path)}
    result = subprocess.run([*CLIENT, "eval", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert f"fork server {tmp_path / 'eval.sock'} not reachable" in result.stderr
    assert result.returncode == 0 and "usage: harness" in result.stdout


def test_commands_other_than_train_and_eval_never_go_to_the_server(tmp_path):
    env = {**server_env(), forkserver.ENV_VAR: str(tmp_path)}
    result = subprocess.run([*CLIENT, "report", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "fork server" not in result.stderr


def test_refusal_names_what_differs(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    sources = {str(source): source.stat().st_mtime_ns}
    environment = {"A": "1", "PATH": "/bin"}
    request = {"executable": sys.executable, "sys_path": list(sys.path), "env": {"A": "1", "PATH": "/usr/bin"}}
    assert forkserver.refusal(request, environment, sources) is None  # PATH is the shell's
    assert "in A, B" in forkserver.refusal({**request, "env": {"A": "2", "B": ""}}, environment, sources)
    assert "module search path" in forkserver.refusal({**request, "sys_path": ["/x"]}, environment, sources)
    assert "interpreter" in forkserver.refusal({**request, "executable": "/bin/sh"}, environment, sources)
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 1_000_000))
    assert "changed since the server imported it" in forkserver.refusal(request, environment, sources)
    source.unlink()
    assert "changed since the server imported it" in forkserver.refusal(request, environment, sources)


def test_fork_servers_start_and_stop(tmp_path, monkeypatch):
    monkeypatch.delenv(forkserver.ENV_VAR, raising=False)
    servers = forkserver.ForkServers("char_llama", "hf", tmp_path / "logs")
    servers.start({"train": 1, "eval": 1})
    folder = Path(os.environ[forkserver.ENV_VAR])
    deadline = time.monotonic() + 120  # each server imports its command's modules first
    while not all((folder / f"{c}.sock").exists() for c in forkserver.SERVED) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {p.name for p in folder.iterdir()} == {"train.sock", "eval.sock"}
    servers.stop()
    assert all(p.poll() is not None for p in servers.processes)
    assert not folder.exists() and forkserver.ENV_VAR not in os.environ
    assert "fork server" in (tmp_path / "logs" / "forkserver_train.log").read_text()


def test_fork_servers_off(tmp_path, monkeypatch):
    monkeypatch.setenv(forkserver.ENV_VAR, "off")
    servers = forkserver.ForkServers("char_llama", "hf", tmp_path)
    servers.start({"train": 1, "eval": 1})
    assert servers.processes == [] and os.environ[forkserver.ENV_VAR] == "off"
