"""``accelerate launch`` with its rendezvous store on 127.0.0.1: the launcher of every train job with
``train.launcher=accelerate`` (``harness.ops.resources.train_command``)::

    python -m harness.ops.loopback_launch ARGS...   # = accelerate launch --main_process_ip 127.0.0.1
                                                    #   --main_process_port PORT ARGS...

``accelerate launch`` runs torchrun's agent in its own process, and the agent's static rendezvous opens a TCPStore
server that every training process connects to. torch's TCPStore server listens on every interface whatever address
it is given, and authenticates no one. Here the store is opened first, on a listening socket bound to 127.0.0.1
(``harness.config.loopback.loopback_store``, multi-tenant), so the agent's store on that port is this one; PORT is
the kernel's and held from the start, so jobs sharing a node never collide. Accelerate checks that its port is free
before launching and would take a port of its own (standalone mode, a store on every interface) for one in use: the
check is told that the held port is free. The launch also gets ``LOOPBACK_ENV`` (Gloo and NCCL on ``lo``), which
the training processes inherit.

One machine only: ``--main_process_ip``, ``--main_process_port`` and ``--num_machines`` other than 1 are refused.
"""

from __future__ import annotations

import sys

from harness.config.loopback import LOOPBACK, loopback_store, use_loopback


def loopback_arguments(argv: list[str], port: int):
    """accelerate launch's arguments for ``argv``, with the rendezvous on 127.0.0.1:``port``."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(argv)
    if args.main_process_ip is not None or args.main_process_port is not None:
        parser.error("the loopback launcher sets --main_process_ip and --main_process_port itself")
    if args.num_machines not in (None, 1):
        parser.error(f"--num_machines {args.num_machines}: the loopback launcher runs on one machine")
    args.main_process_ip, args.main_process_port = LOOPBACK, port
    return args


def hold_port(port: int) -> None:
    """Accelerate's port check (``accelerate.utils.launch.is_port_in_use``) answers False for ``port``."""
    import accelerate.utils.launch as accelerate_launch

    in_use = accelerate_launch.is_port_in_use
    accelerate_launch.is_port_in_use = lambda checked=None: checked != port and in_use(checked)


def main(argv: list[str] | None = None) -> None:
    from accelerate.commands.launch import launch_command

    store = loopback_store()  # held (a local of this frame) until the training processes are done
    args = loopback_arguments(sys.argv[1:] if argv is None else argv, store.port)
    use_loopback()
    hold_port(store.port)
    launch_command(args)


if __name__ == "__main__":
    main()
