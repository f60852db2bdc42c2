"""`python -m kernel_queue.machine --socket PATH`: run the machine's queue service.

The client starts it, detached, on first use; it exits on its own once idle. With `--system`
it is the machine's service for every user (run by systemd, `etc/systemd/kernel-queue.service`):
its quota and per-user rules come from `--config`, its socket is `--socket` (default
/run/kernel-queue/queue.sock) and it runs until stopped. A bad config exits 2 with the sentence.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path

from kernel_queue._version import __version__
from kernel_queue.errors import ConfigError
from kernel_queue.machine import config, service, sockets

DETACH_WITHIN = 10.0
"""Seconds `--detach` waits for the forked service to answer before it says it failed."""


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def detach(path: Path) -> None:
    """Fork; the child returns (in a new session) to serve, the parent exits 0 once `path`
    answers (the child's socket, or a winner's) or 1 if the child died or never answered."""
    child = os.fork()
    if child == 0:
        os.setsid()
        return
    deadline = time.monotonic() + DETACH_WITHIN
    while time.monotonic() < deadline:
        if _answers(path):
            os._exit(0)
        if os.waitpid(child, os.WNOHANG)[0]:
            os._exit(0 if _answers(path) else 1)
        time.sleep(0.02)  # before asyncio: this process only waits for its child
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_queue.machine")
    parser.add_argument("--socket", type=Path, help="the Unix socket to serve")
    parser.add_argument(
        "--system", action="store_true", help="serve every user of the machine, as --config says"
    )
    parser.add_argument(
        "--config", type=Path, default=config.DEFAULT_PATH, help="the system service's config"
    )
    parser.add_argument(
        "--idle-exit", type=float, default=service.IDLE_EXIT_SECONDS, help="seconds idle to exit"
    )
    parser.add_argument(
        "--detach", action="store_true", help="fork; return once the service answers"
    )
    args = parser.parse_args(argv)
    if args.socket is None and not args.system:
        parser.error(
            f"--socket is required (or --system, whose socket defaults to {sockets.SYSTEM_SOCKET})"
        )
    socket_path = args.socket or sockets.SYSTEM_SOCKET
    system = None
    if args.system:
        try:
            system = config.load(args.config)
        except ConfigError as exc:
            print(f"kernel-queue system service: {exc}", file=sys.stderr)
            return 2
    if args.detach:
        detach(socket_path)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(message)s", stream=sys.stderr
    )
    queue = service.Service(socket_path, __version__, args.idle_exit, system)
    try:
        asyncio.run(queue.serve())
    except service.AlreadyRunning as exc:
        logging.getLogger("kernel_queue.machine").info("%s; exiting", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
