"""The kernel process's own log: a copy of file descriptor 2 taken before ipykernel starts.

ipykernel 7 redirects fd 2 into the notebook (its `capture_fd_output`), so anything the kernel
side of kernel-queue writes to stderr would appear under the user's last cell. ``remember`` dups the
descriptor while it still points at the launcher's log (a file locally, the container log on
Kubernetes); ``write`` sends diagnostics there. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

_lock = threading.Lock()
_fd: int | None = None


def remember() -> None:
    """Remember where fd 2 points now; call before ipykernel initializes (idempotent)."""
    global _fd
    with _lock:
        if _fd is None:
            with contextlib.suppress(OSError):
                _fd = os.dup(2)  # not inheritable: a cell's subprocess does not get it


def write(line: str) -> None:
    """Write one line to the kernel's log, whole (a single write), never to the notebook."""
    data = (line.rstrip("\n") + "\n").encode(errors="replace")
    with _lock:
        fd = _fd
        if fd is None:  # `remember` was not called (a test importing the module): plain stderr
            print(line, file=sys.__stderr__, flush=True)
            return
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
