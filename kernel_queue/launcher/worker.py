"""Worker mode (``--worker``): the placeholder process of a non-head pod in a kernel's pod group.

It needs no ports and no key: it logs its rank, world size and head address from the group's
``KERNEL_QUEUE_*`` variables (``group``), then blocks in ``signal.sigwait`` (no polling) until
SIGTERM or SIGINT and exits 143 — never 0: a deleted pod whose containers all exit 0 ends
Succeeded, and Kueue counts a group whose pods all succeeded as finished, never to be requeued
(Kueue: ``Finished`` in pkg/controller/jobs/pod/pod_controller.go).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

from kernel_queue import launcher
from kernel_queue.launcher import group

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def describe(environ: Mapping[str, str]) -> str:
    """The line a worker logs when it starts."""
    rank = environ.get(group.ENV_RANK, "?")
    size = environ.get(group.ENV_WORLD_SIZE, "?")
    head = environ.get(group.ENV_HEAD_ADDRESS) or "?"
    return f"worker rank {rank} of {size}, head at {head}; waiting for SIGTERM"


def run(log: Callable[[str], None], environ: Mapping[str, str] | None = None) -> int:
    """Log one line, wait for SIGTERM or SIGINT, return 143. Call from the main thread.

    The signals are blocked before the line is logged, so a signal sent after the line is
    never lost to the default action; the old mask is restored before returning.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        log(describe(os.environ if environ is None else environ))
        signum = signal.sigwait(STOP_SIGNALS)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    log(f"{signal.Signals(signum).name}: the worker stops")
    return launcher.PREEMPTED_EXIT_CODE
