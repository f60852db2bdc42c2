"""A backend's side of the machine queue: connect, starting the service on first use.

`MachineClient.connect` finds the service on the user's socket or starts one (detached, its
log beside the socket) under an `fcntl.flock`, so of two starters racing the loser connects to
the winner's. Every call is async and blocking work (the lock, the spawn) runs in a worker
thread, so a Jupyter server's event loop never waits on it. The service's messages about a
group come out of `messages(group)`, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir

from kernel_queue import errors
from kernel_queue._version import __version__
from kernel_queue.machine import protocol

START_WITHIN = 10.0
"""Seconds a starter waits for the service it started (or the winner's) to answer."""


def socket_path() -> Path:
    """The user's queue socket: <Jupyter runtime dir>/kernel-queue/queue.sock."""
    return Path(jupyter_runtime_dir()) / "kernel-queue" / "queue.sock"


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def start_service(path: Path) -> None:
    """Start the service on `path` unless one answers, under the lock (blocking: a thread's)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name("queue.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _answers(path):
            return  # the winner of the race started it
        with open(path.with_name("queue.log"), "ab") as service_log:
            # --detach: it forks the service and exits once it answers (or died), so the
            # service is no child of this server (no zombie, nothing of this process to reap).
            process = subprocess.Popen(
                [sys.executable, "-m", "kernel_queue.machine", "--detach", "--socket", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=service_log,
                stderr=service_log,
                start_new_session=True,  # not in the server's process group: a ^C is not its
                cwd="/",
            )
            try:
                code = process.wait(timeout=START_WITHIN + 1)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
        if code != 0 or not _answers(path):
            raise errors.LaunchFailed(
                f"the machine's kernel-queue service did not start on {path} (exit {code}); "
                f"see {path.with_name('queue.log')}"
            )


async def _greet(
    path: Path, quota: protocol.Quota, version: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, protocol.Message] | None:
    """Connect and say hello; None when no service answers, or one hung up (exiting idle)."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return None
    try:
        hello = protocol.Hello(protocol.PROTOCOL, version, os.getpid(), quota)
        writer.write(protocol.encode(hello))
        async with asyncio.timeout(START_WITHIN):
            line = await reader.readline()
        if not line:
            writer.close()
            return None
        return reader, writer, protocol.decode(line)
    except ConnectionError:
        writer.close()
        return None
    except BaseException:
        writer.close()
        raise


class MachineClient:
    """One connection to the machine's queue service; the leases of its groups end with it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: protocol.Welcome,
    ) -> None:
        self.service = welcome
        self._reader = reader
        self._writer = writer
        self._groups: dict[str, asyncio.Queue[protocol.Message | None]] = {}
        self._listings: asyncio.Queue[protocol.Listing] = asyncio.Queue()
        self._list_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(
        cls, quota: protocol.Quota, *, path: Path | None = None, version: str = __version__
    ) -> MachineClient:
        """Say hello to the service at `path` (default `socket_path()`), starting it if none
        answers. LaunchFailed if it speaks another protocol, ConfigError if the quota in force
        differs from `quota`; each says what to do."""
        path = path or socket_path()
        greeted = await _greet(path, quota, version)
        if greeted is None:  # none there, or it was exiting: start one (or find the winner's)
            await asyncio.to_thread(start_service, path)
            greeted = await _greet(path, quota, version)
        if greeted is None:
            raise errors.LaunchFailed(
                f"the machine's kernel-queue service on {path} hung up at hello; see "
                f"{path.with_name('queue.log')}"
            )
        reader, writer, welcome = greeted
        if not isinstance(welcome, protocol.Welcome):
            writer.close()
            raise errors.LaunchFailed(f"the service on {path} answered {welcome!r} to hello")
        if welcome.protocol != protocol.PROTOCOL:
            writer.close()
            raise errors.LaunchFailed(protocol.mismatch(welcome, version))
        differences = [] if welcome.quota is None else quota.differences(welcome.quota)
        if differences:
            writer.close()
            raise errors.ConfigError(protocol.quota_differs(differences, welcome.pid))
        return cls(reader, writer, welcome)

    async def _read(self) -> None:
        try:
            while line := await self._reader.readline():
                message = protocol.decode(line)
                if isinstance(message, protocol.Listing):
                    self._listings.put_nowait(message)
                    continue
                queue = self._groups.get(getattr(message, "group", ""))
                if queue is not None:
                    queue.put_nowait(message)
        except (ConnectionError, protocol.ProtocolError):
            pass
        finally:
            gone = protocol.Refused(
                f"the machine's kernel-queue service (pid {self.service.pid}) closed the "
                "connection; the group's lease ended"
            )
            for name, queue in self._groups.items():
                queue.put_nowait(protocol.Refused(gone.message, name))
                queue.put_nowait(None)
            self.closed.set()

    async def _send(self, message: protocol.Message) -> None:
        if self.closed.is_set():
            raise errors.LaunchFailed(
                f"the machine's kernel-queue service (pid {self.service.pid}) is gone"
            )
        self._writer.write(protocol.encode(message))
        await self._writer.drain()

    async def submit(self, submit: protocol.Submit) -> None:
        """Queue the group; what the service says of it comes out of `messages`."""
        self._groups.setdefault(submit.group, asyncio.Queue())
        await self._send(submit)

    async def messages(self, group: str) -> AsyncIterator[protocol.Message]:
        """Position, admit, preempt and refused messages about `group`, until it is released
        or the connection ends."""
        queue = self._groups.setdefault(group, asyncio.Queue())
        while (message := await queue.get()) is not None:
            yield message

    async def release(self, group: str) -> None:
        """Leave the queue or give back the GPUs; `messages(group)` ends."""
        queue = self._groups.pop(group, None)
        if queue is not None:
            queue.put_nowait(None)
        if not self.closed.is_set():
            await self._send(protocol.Release(group))

    async def requeue(self, group: str) -> None:
        """After the preempted kernel stopped: its GPUs back, the group at its queue's end."""
        await self._send(protocol.Requeue(group))

    async def listing(self) -> protocol.Listing:
        """Every group on the machine, as the service sees it now."""
        async with self._list_lock:
            await self._send(protocol.List())
            return await self._listings.get()

    async def aclose(self) -> None:
        """End the connection: the service releases every group of this client at once."""
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        await self._task
