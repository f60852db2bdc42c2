"""The kernel the launcher starts: ``python -m kernel_queue.launcher.kernel -f CONNECTION_FILE``.

An IPython kernel that tells its launcher, through its exit status, whether the frontend asked
for a restart (75) or a final shutdown (0). The only launcher module that imports ipykernel; it
knows nothing of queues or servers.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp

from kernel_queue import launcher

EXIT_GRACE = 10.0
"""Seconds the interpreter gets to finish exiting before ``os._exit`` ends it anyway."""


class RestartAwareKernel(IPythonKernel):
    """An IPythonKernel that remembers the ``restart`` flag of the last ``shutdown_request``."""

    restart_requested = False

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Called by ipykernel's ``shutdown_request`` handler on the control thread."""
        self.restart_requested = bool(restart)
        reply = super().do_shutdown(restart)  # type: ignore[no-untyped-call]
        if inspect.isawaitable(reply):
            reply = await reply
        return dict(reply)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the kernel until a ``shutdown_request`` stops its loops; return the exit status."""
    app = IPKernelApp.instance(kernel_class=RestartAwareKernel)
    app.initialize(None if argv is None else list(argv))  # type: ignore[no-untyped-call]
    app.start()  # type: ignore[no-untyped-call]
    restart = bool(getattr(app.kernel, "restart_requested", False))
    status = launcher.RESTART_EXIT_CODE if restart else 0
    _exit_after(EXIT_GRACE, status)
    return status


def _exit_after(seconds: float, status: int) -> None:
    """End the process with ``status`` if the normal exit hangs.

    After ``shutdown_request`` the interpreter joins every non-daemon thread before it runs
    ipykernel's atexit ``close()``; a thread a user started in a cell would block that forever
    and the launcher would never see the restart. A daemon timer still runs during that join.
    """

    def force_exit() -> None:
        sys.stderr.flush()
        os._exit(status)

    timer = threading.Timer(seconds, force_exit)
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    sys.exit(main())
