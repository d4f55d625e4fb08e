"""Single-node jobs keep their network listeners on the loopback interface (docs/cluster-security.md lists every
listener a job opens, where it listens, and what a site must still firewall).

Every job of the harness runs on one node (``--num_machines 1``, ``nodes: 1``), and the listeners of a distributed
job authenticate no one: torch.distributed's rendezvous store, Gloo's and NCCL's sockets, vLLM's stores and TRL's
weight sync. So:

- ``LOOPBACK_ENV``: the interface Gloo and NCCL listen on (``lo``: NCCL within a node moves data over P2P/SHM; its
  socket is the bootstrap), the address vLLM announces and binds TRL's server-mode weight sync to (``VLLM_HOST_IP``;
  otherwise vLLM's ``get_ip`` gives the node's network address) and torch's rendezvous address. The Snakefile exports
  it for every job (``shell_exports``); ``use_loopback`` sets it in a process (the loopback launcher, the trainer
  with vLLM, the vLLM eval backend).
- ``loopback_store``: a TCPStore server on 127.0.0.1. torch's TCPStore server listens on every interface (``*``:
  IPv4 and IPv6, both backends) whatever host it is given, unless it is handed a listening socket
  (``master_listen_fd``). This one is multi-tenant, so the store torch creates later in the same process on the same
  port (``init_process_group``'s env:// and tcp:// rendezvous on rank 0, torchrun's static rendezvous) is served by it
  instead of opening its own; and its port is the kernel's and held from the start, so jobs sharing a node never
  collide.

Torch is imported inside ``loopback_store`` only: the Snakefile reads ``shell_exports`` on every parse.
"""

from __future__ import annotations

import os
import shlex

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
LOOPBACK_ENV = {
    "GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE,  # Gloo's listener (default: the address the host name resolves to)
    "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE,  # NCCL's bootstrap and proxy listeners (default: the first non-lo NIC)
    "VLLM_HOST_IP": LOOPBACK,  # vLLM's get_ip(): its engine's rendezvous address, TRL's weight sync store
    "MASTER_ADDR": LOOPBACK,  # torch's env:// rendezvous (TRL's colocated vLLM; accelerate sets its own)
}


def shell_exports() -> str:
    """``export`` statements of ``LOOPBACK_ENV``, for a job's command prefix."""
    return "".join(f"export {name}={shlex.quote(value)}; " for name, value in LOOPBACK_ENV.items())


def use_loopback(environ: dict | None = None) -> None:
    """Set ``LOOPBACK_ENV`` in ``environ`` (default: this process's, inherited by the processes it starts); before
    torch.distributed, Gloo, NCCL or vLLM start reading it."""
    (os.environ if environ is None else environ).update(LOOPBACK_ENV)


def loopback_store(timeout_s: float = 1800.0):
    """A multi-tenant TCPStore server that listens on 127.0.0.1 only, on a port the kernel assigns (``.port``).
    Keep the returned store while the rendezvous it serves is created: the server stops with the last store that
    uses it."""
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen()
        port = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    fd = listener.detach()  # the store owns the socket from here and closes it when its server stops
    try:
        return TCPStore(LOOPBACK, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                        multi_tenant=True, master_listen_fd=fd)
    except Exception:
        os.close(fd)
        raise
