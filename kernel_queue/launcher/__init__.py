"""The kernel launcher: a small parent process that owns one kernel in a pod or a local subprocess.

This package holds the exit codes its callers share; ``contract`` names every variable it takes
and the time budget after SIGTERM. It runs in the kernel image, so it imports nothing
server-side; ``kernel.py`` is the only module that imports ipykernel. Run it as
``python -m kernel_queue.launcher``, or from the archive the server delivers (``archive``).
"""

ARCHIVE_FALLBACK = "_fallback"
"""The folder of the launcher archive (``archive``) holding the pure-Python libraries bundled
from the server's environment (dill), used only where the image has none."""

RESTART_EXIT_CODE = 75
"""Exit status of a kernel that was asked to restart; the launcher starts a new one in place."""

IMAGE_EXIT_CODE = 3
"""Exit status of a launcher whose image lacks what a kernel needs (ipykernel, a recent Python);
its one line is in the container's termination message."""

PREEMPTED_EXIT_CODE = 143
"""Exit status of a launcher stopped by SIGTERM (128 + 15); never 0, or Kueue would not requeue."""


def shell_status(code: int) -> int:
    """A process's return code as a shell reports it: the exit code, or 128 + the killing signal
    for the negative codes of ``subprocess`` and ``asyncio``."""
    return 128 - code if code < 0 else code
