"""The ``harness`` command, and the fork servers that run a local sweep's train and eval jobs in forked children.

Why: every job of a sweep is a fresh ``harness`` process, and ~3.5-4 s of each (18% of the default sweep's job
seconds: bench/sweep_breakdown.py) is the interpreter start and the imports of torch, transformers, TRL, lm-eval.

How: the Snakefile's ``onstart`` starts one server per command (train, eval) when jobs run on this machine. A server
imports what its command imports, once, then waits on a Unix socket in the folder named by HARNESS_FORK_SERVER.
The ``harness`` command (``main``, the console script) sends its arguments, working directory, environment and
standard streams there; the server forks; the child takes over the streams, directory and environment and runs
``harness.cli.main`` as the process would have; its exit status, CPU seconds and peak RSS go back to the command,
which writes them to the job log (a ``forked:`` line) and exits with that status. Signals the command receives are
passed on to the child's process group; a child whose command dies is killed.

Same results as a process of its own: the child runs the same code on the same inputs and seeds itself; what it
inherits is modules already imported. The server refuses, and the command runs in its own process saying why in
its log, where that could differ: another interpreter or module search path, an environment that differs beyond
PATH and the shell's own variables (Snakemake sets the thread variables per rule: a job with other threads than the
server's runs on its own), or a source file of harness/ or methods/ changed since the server imported it.
Linux only (fork after importing torch is not safe on macOS). ``HARNESS_FORK_SERVER=off snakemake ...`` turns it off.
What a job records differs in one place: its peak RSS counts the pages it shares with the server (the modules it
would have imported itself, plus any the server imported for the other jobs of its command).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ENV_VAR = "HARNESS_FORK_SERVER"  # the folder of the sockets (<command>.sock); "off" disables the servers
SERVED = ("train", "eval")
# Snakemake gives each job's shell these, set to the rule's threads (snakemake/shell.py)
THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
TMPDIR_VARS = ("TMPDIR", "TMP", "TEMPDIR", "TEMP")
# the job's shell sets these itself; nothing imported reads them
SHELL_VARS = frozenset({"PATH", "PWD", "OLDPWD", "SHLVL", "_"})
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
MAX_MESSAGE = 1 << 20
REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = (REPO_ROOT / "harness", REPO_ROOT / "methods")


# ---------------------------------------------------------------------------------------------- the command

def main(argv: list[str] | None = None) -> int:
    """``harness ARGS``: through the fork server of its command when HARNESS_FORK_SERVER names one that accepts
    it, else in this process."""
    argv = sys.argv[1:] if argv is None else list(argv)
    folder = os.environ.get(ENV_VAR, "")
    if folder and folder != "off" and argv and argv[0] in SERVED and sys.platform == "linux":
        status = run_forked(Path(folder) / f"{argv[0]}.sock", argv)
        if status is not None:
            return status
    from harness.cli import main as cli_main

    return cli_main(argv)


def run_forked(socket_path: Path, argv: list[str]) -> int | None:
    """Run ``harness argv`` in a child of the server at ``socket_path``; its exit status, or None (with a line in
    the log saying why) when the server is not there or refuses."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(socket_path))
    except OSError as exc:  # not started, still importing, or gone: the job runs here
        print(f"fork server {socket_path} not reachable ({exc.strerror}): running in this process",
              file=sys.stderr, flush=True)
        conn.close()
        return None
    with conn:
        request = {"argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ),
                   "executable": sys.executable, "sys_path": sys.path[1:]}
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            reply = json.loads(conn.recv(MAX_MESSAGE) or b'{"refused": "the server closed the connection"}')
        except OSError as exc:  # a standard stream not open, or the server gone
            reply = {"refused": f"could not hand the job over ({exc})"}
        if "refused" in reply:
            print(f"fork server {socket_path} refused: {reply['refused']}: running in this process",
                  file=sys.stderr, flush=True)
            return None
        child = reply["pid"]
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, lambda signum, frame: _signal_group(child, signum))
        try:
            message = conn.recv(MAX_MESSAGE)  # blocks until the child exits; a forwarded signal resumes the wait
        except OSError:
            message = b""
    if not message:
        print(f"fork server {socket_path} closed before child {child} exited", file=sys.stderr, flush=True)
        return 1
    result = json.loads(message)
    print(f"forked: pid={child} exit={result['exit']} cpu_s={result['cpu_s']:.3f} "
          f"max_rss_mb={result['max_rss_mb']:.1f}", file=sys.stderr, flush=True)
    return result["exit"] if result["exit"] >= 0 else 128 - result["exit"]  # killed by signal N: 128 + N, as sh


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------------- the server

def preload(command: str | None, model_kind: str, eval_backend: str) -> None:
    """Import what a job of ``command`` imports: what ``harness.cli`` imports for it (for eval, its
    ``import_eval_stack``), and the model code that loading the preset's model imports later (char_llama builds a
    Llama; other kinds import theirs in the job)."""
    if command is None:
        return
    import harness.cli  # noqa: F401

    if command == "train":
        import harness.train.adapter  # noqa: F401
        import harness.train.run  # noqa: F401
    else:
        from harness.evaluation.driver import import_eval_stack

        import_eval_stack(eval_backend)
    if model_kind == "char_llama":
        import transformers.models.llama.modeling_llama  # noqa: F401


def source_mtimes() -> dict[str, int]:
    """Modification times of the imported modules' files under harness/ and methods/."""
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return {f: os.stat(f).st_mtime_ns for f in files
            if f and any(Path(f).is_relative_to(folder) for folder in SOURCE_DIRS)}


def refusal(request: dict, environment: dict[str, str], sources: dict[str, int]) -> str | None:
    """Why a request cannot run in a child of this server with the result it would have on its own, or None.
    ``environment``: the server's before its imports (some imports set variables, as they would in the job)."""
    if os.path.realpath(request["executable"]) != os.path.realpath(sys.executable):
        return f"interpreter {request['executable']} is not the server's {sys.executable}"
    if request["sys_path"] != sys.path:
        return "module search path differs from the server's"
    names = set(request["env"]) | set(environment)
    differing = sorted(n for n in names - SHELL_VARS if request["env"].get(n) != environment.get(n))
    if differing:
        return f"environment differs from the server's in {', '.join(differing)}"
    for path, mtime in sources.items():
        try:
            changed = os.stat(path).st_mtime_ns != mtime
        except FileNotFoundError:
            changed = True
        if changed:
            return f"{os.path.relpath(path, REPO_ROOT)} changed since the server imported it"
    return None


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


def serve(socket_path: Path, preloading: Callable[[], None], target: str = "harness.cli:main") -> None:
    """Run ``preloading`` (the imports), then fork a child per request, which runs ``target`` (module:function,
    called with the command's arguments), until SIGTERM or until the parent (Snakemake) is gone."""
    parent, environment = os.getppid(), dict(os.environ)
    preloading()
    sources = source_mtimes()
    set_by_imports = {k: v for k, v in os.environ.items() if environment.get(k) != v}
    signal.signal(signal.SIGTERM, _stop)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(socket_path))  # clients that come earlier find no socket and run on their own
    listener.listen(16)
    print(f"fork server {socket_path}: pid {os.getpid()}, {len(sys.modules)} modules imported", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (connection, pidfd)
    try:
        while os.getppid() == parent:
            for key, _ in selector.select(timeout=1.0):
                if key.data is None:
                    _accept(listener, selector, children, (environment, sources), (target, set_by_imports))
                elif key.data[0] == "exit":
                    _report_exit(key.data[1], selector, children)
                else:  # the command's connection: readable only when the command is gone
                    _command_gone(key.data[1], selector, children)
    except _Stop:
        pass
    finally:
        for pid in children:
            _signal_group(pid, signal.SIGTERM)
        listener.close()
        socket_path.unlink(missing_ok=True)
        try:  # the last server of a sweep removes the folder (Snakemake's onsuccess / onerror do too)
            socket_path.parent.rmdir()
        except OSError:
            pass


def _accept(listener: socket.socket, selector, children: dict, checks: tuple, job: tuple) -> None:
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
        request = json.loads(message)
        reason = refusal(request, *checks) if len(fds) == 3 else "the standard streams did not arrive"
    except (OSError, ValueError, KeyError) as exc:
        conn.close()
        print(f"bad request: {exc!r}", flush=True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork() if not reason else None
    except OSError as exc:  # out of memory or processes: the command runs on its own
        pid, reason = None, f"fork failed ({exc})"
    if pid is None:
        print(f"refused {request['argv']}: {reason}", flush=True)
        _send(conn, {"refused": reason})
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    if pid == 0:
        inherited = [listener.fileno(), conn.fileno(), selector.fileno()]
        inherited += [fd for c, pidfd in children.values() for fd in (c.fileno(), pidfd)]
        _run_child(request, *job, fds, inherited)  # never returns
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    children[pid] = (conn, pidfd)
    _send(conn, {"pid": pid})
    selector.register(pidfd, selectors.EVENT_READ, ("exit", pid))
    selector.register(conn, selectors.EVENT_READ, ("command", pid))
    print(f"pid {pid}: {request['argv']}", flush=True)


def _report_exit(pid: int, selector, children: dict) -> None:
    conn, pidfd = children.pop(pid)
    _, status, usage = os.wait4(pid, 0)
    selector.unregister(pidfd)
    os.close(pidfd)
    if conn.fileno() >= 0:
        selector.unregister(conn)
        _send(conn, {"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime,
                     "max_rss_mb": usage.ru_maxrss / 1024})
        conn.close()
    print(f"pid {pid}: exit {os.waitstatus_to_exitcode(status)}", flush=True)


def _command_gone(pid: int, selector, children: dict) -> None:
    conn, _ = children[pid]
    selector.unregister(conn)
    conn.close()
    print(f"pid {pid}: its command is gone; killing it", flush=True)
    _signal_group(pid, signal.SIGKILL)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass


def _run_child(request: dict, target: str, set_by_imports: dict, fds: list[int], inherited: list[int]) -> None:
    """In the forked child: become the job (streams, directory, environment, arguments), run it, exit. The
    environment is the command's, plus what the server's imports set (the job's own imports would have)."""
    status = 1
    try:
        for fd in inherited:
            os.close(fd)
        os.setpgid(0, 0)  # its own group: a forwarded signal reaches whatever it starts
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for stream_fd, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, stream_fd)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**request["env"], **set_by_imports})
        sys.argv = [request["argv0"], *request["argv"]]
        module, function = target.split(":")
        raise SystemExit(getattr(importlib.import_module(module), function)(request["argv"]))  # as the script does
    except SystemExit as exc:  # as the interpreter maps it
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001  (an uncaught exception: traceback and status 1, as the interpreter)
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


# ---------------------------------------------------------------------------------------------- the Snakefile's side

def job_environment(threads: int) -> dict[str, str]:
    """The environment Snakemake's shell gives a local job of ``threads`` threads (snakemake/shell.py): this
    process's, with the thread variables and the default ``tmpdir`` resource (the system's temporary folder)."""
    return {**os.environ, **dict.fromkeys(THREAD_VARS, str(threads)),
            **dict.fromkeys(TMPDIR_VARS, tempfile.gettempdir())}


class ForkServers:
    """The servers of one Snakemake invocation: ``start`` in ``onstart`` (local execution only), ``stop`` in
    ``onsuccess`` / ``onerror``. Each server gets the environment Snakemake gives its rule's jobs."""

    def __init__(self, model_kind: str, eval_backend: str, log_dir: Path) -> None:
        self.model_kind, self.eval_backend, self.log_dir = model_kind, eval_backend, log_dir
        self.folder: Path | None = None
        self.processes: list[subprocess.Popen] = []

    def start(self, threads: dict[str, int]) -> None:
        """``threads``: per served command to start a server for, the threads Snakemake gives its rule's jobs."""
        if sys.platform != "linux" or os.environ.get(ENV_VAR) == "off":
            return
        self.folder = Path(tempfile.mkdtemp(prefix="harness-fork-"))  # short: a socket path has ~100 bytes
        self.log_dir.mkdir(parents=True, exist_ok=True)
        os.environ[ENV_VAR] = str(self.folder)
        for command in (c for c in SERVED if c in threads):
            with open(self.log_dir / f"forkserver_{command}.log", "w") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-P", "-m", "harness.forkserver", str(self.folder / f"{command}.sock"),
                     "--command", command, "--model-kind", self.model_kind, "--eval-backend", self.eval_backend],
                    env=job_environment(threads[command]), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True))  # its own session: a Ctrl-C at the terminal reaches the jobs' commands

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            os.environ.pop(ENV_VAR, None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a fork server (started by the Snakefile's onstart)")
    parser.add_argument("socket", type=Path)
    parser.add_argument("--command", choices=SERVED, help="import what a job of this command imports")
    parser.add_argument("--model-kind", default="char_llama")
    parser.add_argument("--eval-backend", default="hf")
    parser.add_argument("--module", action="append", default=[], help="another module to import (tests)")
    parser.add_argument("--target", default="harness.cli:main", help="module:function a child runs (tests)")
    arguments = parser.parse_args()
    serve(arguments.socket, lambda: (preload(arguments.command, arguments.model_kind, arguments.eval_backend),
                                     [importlib.import_module(name) for name in arguments.module]),
          arguments.target)
