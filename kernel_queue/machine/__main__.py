"""`python -m kernel_queue.machine --socket PATH`: run the machine's queue service.

The client starts it, detached, on first use; it exits on its own once idle.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from kernel_queue._version import __version__
from kernel_queue.machine import service


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_queue.machine")
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to serve")
    parser.add_argument(
        "--idle-exit", type=float, default=service.IDLE_EXIT_SECONDS, help="seconds idle to exit"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(service.Service(args.socket, __version__, args.idle_exit).serve())
    except service.AlreadyRunning as exc:
        logging.getLogger("kernel_queue.machine").info("%s; exiting", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
