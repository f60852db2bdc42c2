"""Records of the local kernels this user's Jupyter servers run, and reaping what a dead one left.

The local backend writes `<state dir>/<kernel id>.json` for each kernel it queues: the owning
server and, once started, the launcher (each by boot id, pid and start time, so a reused pid is
not taken for it), the kernel's log file and the checkpoint directory its release deletes. A
server killed before it released a kernel leaves the record; `reap` deletes what it names once
that server and its launcher are both gone (a local kernel dies with its server, so no restarted
server could reattach to it), only inside the roots it names, never through a symlink.
The functions block; `Ledger` runs them off the event loop, one at a time, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from kernel_queue import ids

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
Log = logging.Logger | logging.LoggerAdapter[Any]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Process:
    """A process as it is known across a pid's reuse: boot, pid and start time (clock ticks)."""

    boot: str
    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Process | None:
        """The running process `pid`, or None (gone, or no /proc on this system)."""
        try:
            boot = _BOOT_ID.read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # Fields after the command's closing parenthesis start at field 3 (the state);
        # starttime is field 22. A zombie has exited: no one reaped it yet (an orphan's new
        # parent may never do so in a container).
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return cls(boot, pid, int(fields[19]))

    def alive(self) -> bool:
        """True while this very process runs."""
        return Process.of(self.pid) == self


@dataclass(frozen=True)
class Record:
    """What the local backend created for one kernel, and who owns it."""

    kernel_id: str
    server: Process
    log: str
    launcher: Process | None = None
    checkpoints: str | None = None  # deleted at release (not recorded when `keep`)
    checkpoint_root: str | None = None  # `checkpoints` must lie directly inside it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        launcher = data.get("launcher")
        return cls(
            kernel_id=str(data["kernel_id"]),
            server=Process(**data["server"]),
            log=str(data["log"]),
            launcher=Process(**launcher) if launcher else None,
            checkpoints=data.get("checkpoints"),
            checkpoint_root=data.get("checkpoint_root"),
        )


def write(state_dir: Path, record: Record) -> None:
    """Write (or replace) the kernel's record atomically, private to the user."""
    # the parent too: mkdir(parents=True) makes missing parents 0755 (<runtime>/kernel-queue was)
    state_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    state_dir.mkdir(mode=0o700, exist_ok=True)
    path = state_dir / f"{ids.check(record.kernel_id)}.json"
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(record.to_dict(), file)
    os.replace(temporary, path)


def read(state_dir: Path, kernel_id: str) -> Record | None:
    """The kernel's record, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((state_dir / f"{ids.check(kernel_id)}.json").read_text())
        return Record.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(state_dir: Path, kernel_id: str) -> None:
    """Forget the kernel's record (nothing if there is none)."""
    with contextlib.suppress(FileNotFoundError):
        (state_dir / f"{ids.check(kernel_id)}.json").unlink()


def remove_tree(path: Path, root: Path) -> bool:
    """Delete the directory `path` if it lies directly inside `root` and is named as a kernel
    id; a symlink there is removed, never followed. False when refused or absent."""
    if not ids.is_valid(path.name):
        return False
    if os.path.realpath(path.parent) != os.path.realpath(root):
        return False
    try:
        if path.is_symlink():
            path.unlink()
        else:
            # shutil.rmtree opens each level relative to its parent without following
            # symlinks (it avoids symlink attacks on Linux).
            shutil.rmtree(path)
    except FileNotFoundError:
        return False
    return True


def settle(state_dir: Path, kernel_id: str, log: Log) -> Record | None:
    """The kernel id's record while its server or launcher lives; else delete what the record
    names (checkpoints, log), then the record, and return None."""
    record = read(state_dir, kernel_id)
    if record is None:
        return None
    if record.server.alive():
        return record
    if record.launcher is not None and record.launcher.alive():
        return record  # still stopping (it got SIGTERM when its server died): next time
    who = f"kernel {record.kernel_id}"
    if record.checkpoints and record.checkpoint_root:
        directory = Path(record.checkpoints)
        if remove_tree(directory, Path(record.checkpoint_root)):
            log.info("%s: removed checkpoints %s left by a server that is gone", who, directory)
    logfile = Path(record.log)
    if logfile.name.startswith("kq-") and logfile.suffix == ".log" and logfile.is_file():
        logfile.unlink()
        log.info("%s: removed log %s left by a server that is gone", who, logfile)
    remove(state_dir, record.kernel_id)
    return None


def reap(state_dir: Path, log: Log) -> None:
    """`settle` every record: what dead servers left is deleted, with an INFO line each."""
    try:
        paths = sorted(state_dir.glob("*.json"))
    except OSError:
        return
    for path in paths:
        if ids.is_valid(path.stem):
            settle(state_dir, path.stem, log)


class Ledger:
    """The local backend's records, written and reaped off the event loop, one call at a time
    (so a reap never reads a record half-way through its kernel's claim or release)."""

    def __init__(self, state_dir: Path, log: Log) -> None:
        self.state_dir = state_dir
        self.log = log
        self._server: Process | None = None
        self._last: asyncio.Task[Any] | None = None
        self._reaped_at: float | None = None

    async def claim(
        self, kernel_id: str, *, log_path: Path, checkpoints: Path | None, root: Path | None
    ) -> Record | None:
        """Record the kernel as this server's, after settling an earlier record of its id;
        return the record of a server (or launcher) that still lives instead, writing nothing."""

        def work() -> Record | None:
            if self._server is None:
                self._server = Process.of(os.getpid())
            if self._server is None:
                return None  # no /proc: nothing is recorded, nothing reaped
            other = settle(self.state_dir, kernel_id, self.log)
            if other is not None and other.server != self._server:
                return other
            record = Record(
                kernel_id,
                self._server,
                str(log_path),
                checkpoints=str(checkpoints) if checkpoints else None,
                checkpoint_root=str(root) if root else None,
            )
            write(self.state_dir, record)
            return None

        return await self._run(work)

    def launcher_started(self, kernel_id: str, pid: int) -> None:
        """Add the launcher to the kernel's record (in the background)."""

        def work() -> None:
            record = read(self.state_dir, kernel_id)
            if record is not None and record.server == self._server:
                write(self.state_dir, replace(record, launcher=Process.of(pid)))

        self._queue(work)

    async def forget(
        self, kernel_id: str, *, log_path: Path, checkpoints: Path | None, root: Path | None
    ) -> None:
        """At release: delete the kernel's log, its checkpoints (given only when not `keep`)
        and its record."""

        def work() -> None:
            # the log, and a stop note its kernel never read (`groups.Group.note_stop`)
            for path in (log_path, log_path.with_name(log_path.name + ".stop")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if checkpoints is None or root is None:
                pass
            elif not remove_tree(checkpoints, root) and checkpoints.exists():
                self.log.warning(
                    "kernel %s: not deleting %s: it is not a directory inside %s",
                    kernel_id,
                    checkpoints,
                    root,
                )
            remove(self.state_dir, kernel_id)

        await self._run(work)

    def reap_soon(self, interval: float) -> None:
        """Reap (in the background) unless a reap ran within `interval` seconds."""
        now = time.monotonic()
        if self._reaped_at is None or now - self._reaped_at >= interval:
            self._reaped_at = now
            self._queue(lambda: reap(self.state_dir, self.log))

    async def aclose(self) -> None:
        """Wait for the calls still queued."""
        if self._last is not None:
            await asyncio.wait({self._last})

    async def _run(self, work: Callable[[], _T]) -> _T:
        task = self._queue(work)
        await asyncio.wait({task})
        return task.result()  # type: ignore[no-any-return]

    def _queue(self, work: Callable[[], Any]) -> asyncio.Task[Any]:
        previous = self._last

        async def run() -> Any:
            if previous is not None:
                await asyncio.wait({previous})
            try:
                return await asyncio.to_thread(work)
            except OSError as exc:
                self.log.warning("kernel-queue: cannot update %s (%s)", self.state_dir, exc)
                return None

        self._last = asyncio.get_running_loop().create_task(run(), name="kernel-queue records")
        return self._last
