"""Single-node jobs listen on loopback only (harness/config/loopback.py, harness/ops/loopback_launch.py;
docs/cluster-security.md lists the listeners): a GPU preset's train job is launched on 127.0.0.1, every job gets
the loopback environment, and real rendezvous (2 processes through the harness's launcher, and one process as its
colocated vLLM rendezvouses) open no listener on another address."""

import ast
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.config.loading import resolve
from harness.config.loopback import LOOPBACK, LOOPBACK_ENV, shell_exports
from harness.config.paths import REPO_ROOT
from harness.ops.loopback_launch import loopback_arguments
from harness.ops.resources import LOOPBACK_LAUNCH, train_command

ARGS = "train --sweep S --method {wildcards.method} --seed {wildcards.seed}"


def listeners(pid: int) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of ``pid`` and its descendants."""
    root = psutil.Process(pid)
    found = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            found |= {(c.laddr.ip, c.laddr.port, proc.name()) for c in proc.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return found


# --- what the harness builds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sweep", ["paper-nat", "paper-ktae"])  # deepspeed_zero3, ddp
def test_a_gpu_train_job_launches_accelerate_on_loopback(sweep):
    preset = resolve(REPO_ROOT / "configs" / "sweeps" / f"{sweep}.yaml").preset
    assert preset.resources.train.gpus > 1 and preset.train.launcher == "accelerate"
    command = train_command(preset, ARGS, "/w")
    assert command.startswith(f"{LOOPBACK_LAUNCH} --config_file ")
    argv = shlex.split(command.removeprefix(LOOPBACK_LAUNCH).removesuffix(" > {log} 2>&1"))
    args = loopback_arguments(argv, 45678)
    assert (args.main_process_ip, args.main_process_port, args.num_machines) == (LOOPBACK, 45678, 1)
    assert args.num_processes == preset.resources.train.gpus and args.module
    assert args.training_script == "harness.cli"


@pytest.mark.parametrize("argv", [["--main_process_ip", "0.0.0.0"], ["--main_process_port", "0"],
                                  ["--num_machines", "2"]])
def test_the_loopback_launcher_refuses_another_address_or_machine(argv, capsys):
    with pytest.raises(SystemExit):
        loopback_arguments([*argv, "train.py"], 45678)
    assert "loopback launcher" in capsys.readouterr().err


def test_every_job_exports_the_loopback_environment():
    assert LOOPBACK_ENV == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1",
                            "MASTER_ADDR": "127.0.0.1"}
    assert shell_exports() == ("export GLOO_SOCKET_IFNAME=lo; export NCCL_SOCKET_IFNAME=lo; "
                               "export VLLM_HOST_IP=127.0.0.1; export MASTER_ADDR=127.0.0.1; ")
    # the Snakefile's shell.prefix, which every job's command starts with, ends with these exports
    snakefile = (REPO_ROOT / "Snakefile").read_text()
    assert "\nfrom harness.config.loopback import shell_exports as loopback_exports\n" in snakefile
    assert snakefile.count("shell.prefix(") == 1
    lines = snakefile[snakefile.index("shell.prefix("):].splitlines()
    statement = next(tree for n in range(1, len(lines) + 1) if (tree := parsed("\n".join(lines[:n]))))
    assert ast.unparse(statement.body[0].value.args[0]).endswith("+ loopback_exports()")


def parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


# --- what a job opens --------------------------------------------------------------------------------------------

WORKER = """
import os, sys, time, torch, torch.distributed as dist
from pathlib import Path
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
folder, env = Path(sys.argv[1]), os.environ
(folder / f"ready{dist.get_rank()}").write_text(f"{total.item()} {env['MASTER_ADDR']} {env['MASTER_PORT']}")
for _ in range(600):
    if (folder / "done").exists():
        break
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
"""


def test_two_training_processes_listen_on_loopback_only(tmp_path):
    """A 2-process Gloo group launched as a GPU preset's train job is (the loopback launcher, accelerate's ddp
    config), from an environment that names another interface: the launcher's rendezvous store and each process's
    Gloo listener are on 127.0.0.1, nothing else listens. Plain ``accelerate launch`` puts its store on every
    interface (``*``), and Gloo on the address the host name resolves to."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    other = next((nic for nic in psutil.net_if_addrs() if nic != "lo"), "lo")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GLOO_SOCKET_IFNAME": other, "NCCL_SOCKET_IFNAME": other, "OMP_NUM_THREADS": "1"}
    env.pop("MASTER_ADDR", None)
    command = (f"{LOOPBACK_LAUNCH} --config_file {shlex.quote(str(REPO_ROOT / 'configs' / 'accelerate' / 'ddp.yaml'))}"
               f" --num_processes 2 --num_machines 1 --mixed_precision no {shlex.quote(str(script))} "
               f"{shlex.quote(str(tmp_path))}")
    launcher = subprocess.Popen(["bash", "-c", f"exec {command}"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)):
            assert launcher.poll() is None, launcher.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "the two processes did not start"
            time.sleep(0.2)
        time.sleep(0.2)  # both files written in full
        found = listeners(launcher.pid)
    finally:
        (tmp_path / "done").touch()
        output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 0, output[-4000:]
    reports = {tuple((tmp_path / f"ready{rank}").read_text().split()) for rank in (0, 1)}
    assert len(reports) == 1
    total, master_addr, master_port = reports.pop()
    assert (float(total), master_addr) == (2.0, LOOPBACK)
    assert {address for address, _, _ in found} == {LOOPBACK}, found
    # the rendezvous store, in the launcher's process, and one Gloo listener per training process
    assert (LOOPBACK, int(master_port)) in {(address, port) for address, port, _ in found}
    assert len(found) == 3, found


ONE_PROCESS = """
import os, psutil, torch.distributed as dist
from harness.train.trl.vllm import colocated_rendezvous
store = colocated_rendezvous()
# what TRL's colocated vLLM engine does with one process (external_launcher: env:// at MASTER_ADDR:MASTER_PORT)
dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
listening = sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN)
print(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], *(f"{ip}:{port}" for ip, port in listening))
dist.destroy_process_group()
"""


def test_a_one_process_colocated_rendezvous_listens_on_loopback_only():
    env = {**os.environ, **LOOPBACK_ENV}
    env.pop("MASTER_PORT", None)
    done = subprocess.run([sys.executable, "-c", ONE_PROCESS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    master_addr, master_port, *found = done.stdout.split()
    assert master_addr == LOOPBACK and f"{LOOPBACK}:{master_port}" in found
    assert {f.rpartition(":")[0] for f in found} == {LOOPBACK}, found


def test_torchs_own_store_listens_on_every_interface():
    """Why the harness hands torch a listening socket: a TCPStore server given 127.0.0.1 listens on every address
    (IPv4 and IPv6), with either backend. Where torch opens its own (vLLM's engine in an eval job or behind
    ``trl vllm-serve``), the store is reachable from other machines: docs/cluster-security.md says so and what to
    firewall. Should this fail, torch binds the host it is given, and that section is out of date."""
    from torch.distributed import TCPStore

    for libuv in (True, False):
        store = TCPStore(LOOPBACK, 0, None, True, wait_for_workers=False, use_libuv=libuv)
        found = {(address, port) for address, port, _ in listeners(os.getpid()) if port == store.port}
        del store
        assert found and {address for address, _ in found} <= {"::", "0.0.0.0"}, (libuv, found)
