"""Writing checkpoint files so that a crash never leaves a half-written one in sight.

`SyncedFile` is a payload file hashed as it is written, whose fsync starts when it is closed and
runs on one background thread (`syncers`) while the next file is written; `write_atomic` writes
a small file through a temporary name, fsync and rename; `remove` renames a directory out of
sight (durably) before deleting it; `make_private` creates directories 0700 whatever the umask.
Every directory entry that matters is fsynced (`fsync_dir`). Knows nothing of manifests.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernel_queue.checkpoint import digests

DIR_MODE, FILE_MODE = 0o700, 0o600
DELETING = ".deleting"
"""The suffix of a directory being deleted (out of the readers' sight)."""
_SYNCERS_LOCK = threading.Lock()


class SyncedFile(io.BufferedWriter):
    """A payload file: every write is hashed; `close()` flushes, records the size and digest,
    and starts the fsync that the commit waits for.

    A big write is hashed from the file itself once written (the page cache, mapped), by the
    digest threads while the caller goes on: the digest is of the bytes the file holds even if
    another thread changes the caller's buffer (a cell still running), and costs no copy.
    """

    size = 0
    hexdigest = ""
    digest: digests.Digest

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes < digests.PARALLEL:
            self.digest.update(view)
            return super().write(view)
        self.flush()
        start = self.tell()  # exact: nothing is buffered after the flush
        written = super().write(view)
        self.flush()
        self.digest.update_from_file(self.fileno(), start, written)
        return written

    sync_fd = -1
    """A second descriptor of the file for the `syncers` thread, which closes it."""
    synced: Future[None] | None = None
    """The file's fsync, run by the `syncers` thread while the next file is written; the
    commit waits for it (`durable`)."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            self.size = self.tell()
            self.hexdigest = self.digest.hexdigest()
        finally:
            super().close()
        self.synced = syncers().submit(_fsync_and_close, self.sync_fd)

    def durable(self) -> None:
        """Wait for the fsync `close` started; raise what it raised."""
        if self.synced is not None:
            self.synced.result()


def make_private(root: Path) -> None:
    """Create `root` and every missing parent 0700 (whatever the umask); make `root` 0700."""
    missing = []
    for path in root.parents:
        if path.exists():
            break
        missing.append(path)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=DIR_MODE)
            os.chmod(path, DIR_MODE)
    root.mkdir(mode=DIR_MODE, exist_ok=True)
    os.chmod(root, DIR_MODE)


_syncers_pool: tuple[int, ThreadPoolExecutor] | None = None


def syncers() -> ThreadPoolExecutor:
    """The thread that fsyncs closed payload files, in order (new after a fork)."""
    global _syncers_pool
    with _SYNCERS_LOCK:
        if _syncers_pool is None or _syncers_pool[0] != os.getpid():
            _syncers_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="kq-fsync"))
        return _syncers_pool[1]


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `path` via `<path>.tmp`: write, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove(path: Path) -> None:
    """Delete a checkpoint: first rename it out of the readers' sight (durably), then delete."""
    doomed = path.with_name(path.name + DELETING)
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
