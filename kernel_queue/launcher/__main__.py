"""Entry point of ``python -m kernel_queue.launcher``: PID 1 of a kernel pod, or a local subprocess.

It reads the settings, optionally arms the parent-death signal, and hands over to the supervisor;
bad input ends here with one line on stderr and status 2, before any file or process exists.
Stdlib and ``kernel_queue.launcher`` only: this runs in the kernel image.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from kernel_queue import launcher
from kernel_queue.launcher import contract, settings, supervisor

USAGE_ERROR_EXIT_CODE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher until its kernel ends for good; return the launcher's exit status."""
    parent = os.getppid()
    try:
        config = settings.parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except contract.SettingsError as exc:
        supervisor.log(f"error: {exc}")
        return USAGE_ERROR_EXIT_CODE
    if (
        config.parent_death
        and supervisor.set_parent_death_signal(signal.SIGTERM)
        and os.getppid() != parent
    ):
        supervisor.log("the parent process is already gone; not starting the kernel")
        return launcher.PREEMPTED_EXIT_CODE
    return supervisor.Supervisor(config).run()


if __name__ == "__main__":
    sys.exit(main())
