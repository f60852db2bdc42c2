"""The kernel launcher: a small parent process that owns one kernel in a pod or a local subprocess.

This package holds the names its callers share (exit codes, ``KERNEL_QUEUE_LAUNCH_*`` variables,
the stop timeout and the checkpoint deadline that follows from it).
It runs in the kernel image, so it imports nothing server-side; ``kernel.py`` is the only module
that imports ipykernel. Run it as ``python -m kernel_queue.launcher``.
"""

RESTART_EXIT_CODE = 75
"""Exit status of a kernel that was asked to restart; the launcher starts a new one in place."""

PREEMPTED_EXIT_CODE = 143
"""Exit status of a launcher stopped by SIGTERM (128 + 15); never 0, or Kueue would not requeue."""

ENV_IP = "KERNEL_QUEUE_LAUNCH_IP"
ENV_PORTS = "KERNEL_QUEUE_LAUNCH_PORTS"
ENV_KEY = "KERNEL_QUEUE_LAUNCH_KEY"
ENV_KEY_FILE = "KERNEL_QUEUE_LAUNCH_KEY_FILE"
ENV_TRANSPORT = "KERNEL_QUEUE_LAUNCH_TRANSPORT"
ENV_SIGNATURE_SCHEME = "KERNEL_QUEUE_LAUNCH_SIGNATURE_SCHEME"
ENV_STATUS_FD = "KERNEL_QUEUE_LAUNCH_STATUS_FD"
ENV_PARENT_DEATH = "KERNEL_QUEUE_LAUNCH_PARENT_DEATH"
ENV_STOP_TIMEOUT = "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT"
DEFAULT_STOP_TIMEOUT = 25.0
"""Seconds a SIGTERMed kernel gets to exit before the launcher SIGKILLs it, unless set otherwise."""
ENV_GENERATION = "KERNEL_QUEUE_LAUNCH_GENERATION"
"""Set by the launcher for each kernel it starts: 0 for the first, one more per in-place restart."""
ENV_TERMINATION_LOG = "KERNEL_QUEUE_LAUNCH_TERMINATION_LOG"
"""File that receives the checkpoint sentence after a preemption (else /dev/termination-log)."""
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default ``terminationMessagePath``; used only when it exists and is writable."""

ENV_CHECKPOINT_DIR = "KERNEL_QUEUE_CHECKPOINT_DIR"
"""The kernel's checkpoint store directory; unset, the kernel neither saves nor restores."""
ENV_CHECKPOINT_DEADLINE = "KERNEL_QUEUE_CHECKPOINT_DEADLINE"
"""Seconds after SIGTERM the kernel's save may take (the backends pass ``checkpoint_deadline``)."""
ENV_CHECKPOINT_KEEP = "KERNEL_QUEUE_CHECKPOINT_KEEP"
"""``1``: keep the checkpoints after a final shutdown_request; otherwise the kernel deletes them."""
ENV_CHECKPOINT_REPORT = "KERNEL_QUEUE_CHECKPOINT_REPORT"
"""Set by the launcher: where a preempted kernel writes its JSON checkpoint report."""
CHECKPOINT_MARGIN_SECONDS = 3.0
"""Seconds between the end of a save and the launcher's stop timeout: the kernel still has to
report and exit."""


def checkpoint_deadline(stop_timeout: float) -> float:
    """Seconds a kernel's save may take when its launcher SIGKILLs it ``stop_timeout`` seconds
    after SIGTERM: the stop timeout minus ``CHECKPOINT_MARGIN_SECONDS``, at least 1."""
    return max(1.0, stop_timeout - CHECKPOINT_MARGIN_SECONDS)


def shell_status(code: int) -> int:
    """A process's return code as a shell reports it: the exit code, or 128 + the killing signal
    for the negative codes of ``subprocess`` and ``asyncio``."""
    return 128 - code if code < 0 else code
