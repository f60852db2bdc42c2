"""A backend's side of the machine queue: connect, starting the service on first use.

`MachineClient.connect` finds the service (the machine's system service when one answers on
its socket, else the user's, `socket_path()`) or starts the user's (detached, its log beside the
socket) under an `fcntl.flock`, so of two starters racing the loser connects to the winner's.
`MachineClient.watch` only lists and never starts one. Every call is async and blocking work
(the lock, the spawn) runs in a worker thread, so a Jupyter server's event loop never waits on
it. The service's messages about a group come out of `messages(group)`, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from jupyter_core.paths import jupyter_runtime_dir

from kernel_queue import errors
from kernel_queue._version import __version__
from kernel_queue.machine import protocol, sockets

START_WITHIN = 10.0
"""Seconds a starter waits for the service it started (or the winner's) to answer."""


SOCKET_ENV = "KERNEL_QUEUE_SOCKET"
"""The socket to use instead of looking for one (a user's service is started there)."""
SYSTEM_SOCKET_ENV = "KERNEL_QUEUE_SYSTEM_SOCKET"
"""Where to look for the system service instead of /run/kernel-queue/queue.sock."""
MAX_SOCKET_PATH = 107
"""Bytes a Unix socket's path may have (sun_path holds 108 with the closing NUL)."""
FALLBACK_ROOT = Path("/tmp")
"""Where a runtime dir's socket path too long to bind gets its short stand-in."""


def system_socket() -> Path:
    """The system service's socket: KERNEL_QUEUE_SYSTEM_SOCKET, else /run/kernel-queue/..."""
    return Path(os.environ.get(SYSTEM_SOCKET_ENV) or sockets.SYSTEM_SOCKET)


def socket_path() -> Path:
    """The queue socket to use: KERNEL_QUEUE_SOCKET if set, else the system service's when one
    answers there, else the user's (`user_socket_path`). Cheap enough for a loop: the probe is
    one non-blocking connect."""
    override = os.environ.get(SOCKET_ENV)
    if override:
        return Path(override)
    system = system_socket()
    if _answers(system):
        return system
    return user_socket_path()


def user_socket_path() -> Path:
    """<Jupyter runtime dir>/kernel-queue/queue.sock; when that is too long to bind, a short
    stand-in, /tmp/kernel-queue-<uid>/<hash of the long path>/queue.sock."""
    path = Path(jupyter_runtime_dir()) / "kernel-queue" / "queue.sock"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    uid = os.getuid()
    root = FALLBACK_ROOT / f"kernel-queue-{uid}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    found = os.lstat(root)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode) or found.st_uid != uid:
        what = "a link" if stat.S_ISLNK(found.st_mode) else f"owned by uid {found.st_uid}"
        if not stat.S_ISLNK(found.st_mode) and not stat.S_ISDIR(found.st_mode):
            what = "not a directory"
        raise errors.ConfigError(
            f"the queue socket's path {path} is over {MAX_SOCKET_PATH} bytes, and its stand-in "
            f"directory {root} is {what}, not a directory of uid {uid}: remove {root}, or set "
            f"{SOCKET_ENV} (or JUPYTER_RUNTIME_DIR) to a shorter path"
        )
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(root, 0o700)
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    return root / digest / "queue.sock"


def _answers(path: Path) -> bool:
    """Whether a service listens on `path`; never blocks (a full backlog counts as one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except BlockingIOError:
            return True
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


def _no_answer(path: Path) -> str:
    """Why no service greeted this client at `path`, and what to do."""
    if path == system_socket():  # systemd's to start; it logs to the journal
        return (
            f"no kernel-queue service answers on {path}, the machine's system queue: start it "
            "(`sudo systemctl start kernel-queue`; `journalctl -u kernel-queue` says why it "
            "stopped)"
        )
    there = path.exists() or path.is_symlink()
    what = "hung up at hello" if there else "did not start"
    return f"the machine's kernel-queue service on {path} {what}; see {path.with_name('queue.log')}"


async def _greet(
    path: Path, quota: protocol.Quota | None, version: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, protocol.Message] | None:
    """Connect and say hello (with no quota: to watch); None when no service answers, or one
    hung up (exiting idle)."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return None
    try:
        hello = protocol.Hello(protocol.PROTOCOL, version, os.getpid(), quota, quota is None)
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


@dataclass(frozen=True)
class Gone(protocol.Message):
    """Not on the wire: the connection to the service ended (it exited, or restarts); what a
    group's `messages` say last."""

    TYPE: ClassVar[str] = "gone"
    message: str


class MachineClient:
    """One connection to the machine's queue service; the leases of its groups end with it
    unless its backend takes them back from a service that restarted (`Submit.holds`)."""

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
        self._listings: asyncio.Queue[protocol.Listing | None] = asyncio.Queue()
        self._list_lock = asyncio.Lock()
        self.refusal = ""
        """The service's last refusal of this connection (not of a group), if any."""
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(
        cls, quota: protocol.Quota, *, path: Path | None = None, version: str = __version__
    ) -> MachineClient:
        """Say hello to the service at `path` (default `socket_path()`), starting the user's if
        none answers. LaunchFailed if it speaks another protocol, ConfigError if the quota in
        force differs from `quota` (a system service's quota, its config's, is taken as it is:
        `service.system`, `service.quota`); each says what to do."""
        if path is None:
            path = await asyncio.to_thread(socket_path)
        greeted = await _greet(path, quota, version)
        if greeted is None and path != system_socket():
            # None there, or it was exiting: start one (or find the winner's). The system
            # service is systemd's to start.
            await asyncio.to_thread(start_service, path)
            greeted = await _greet(path, quota, version)
        if greeted is None:
            raise errors.LaunchFailed(_no_answer(path))
        reader, writer, answer = greeted
        welcome = _welcome(path, version, reader, writer, answer)
        differences = (
            [] if welcome.quota is None or welcome.system else quota.differences(welcome.quota)
        )
        if differences:
            writer.close()
            raise errors.ConfigError(protocol.quota_differs(differences, welcome.pid))
        return cls(reader, writer, welcome)

    @classmethod
    async def watch(
        cls, path: Path | None = None, *, version: str = __version__
    ) -> MachineClient | None:
        """A listing-only connection (no quota, no groups) to the service at `path` (default
        `socket_path()`); None when none answers there. It never starts a service."""
        if path is None:
            path = await asyncio.to_thread(socket_path)
        greeted = await _greet(path, None, version)
        if greeted is None:
            return None
        reader, writer, answer = greeted
        return cls(reader, writer, _welcome(path, version, reader, writer, answer))

    async def _read(self) -> None:
        try:
            while line := await self._reader.readline():
                message = protocol.decode(line)
                if isinstance(message, protocol.Listing):
                    self._listings.put_nowait(message)
                    continue
                if isinstance(message, protocol.Places):
                    for place in message.places:
                        if (queue := self._groups.get(place.group)) is not None:
                            queue.put_nowait(place)
                    continue
                if isinstance(message, protocol.Refused) and not message.group:
                    self.refusal = message.message
                queue = self._groups.get(getattr(message, "group", ""))
                if queue is not None:
                    queue.put_nowait(message)
        except (ConnectionError, protocol.ProtocolError):
            pass
        finally:
            gone = Gone(
                f"the machine's kernel-queue service (pid {self.service.pid}) closed the connection"
            )
            for queue in self._groups.values():
                queue.put_nowait(gone)
                queue.put_nowait(None)
            self._listings.put_nowait(None)
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
        """Every group on the machine this user may see, as the service sees it now;
        LaunchFailed if the service hung up instead."""
        async with self._list_lock:
            await self._send(protocol.List())
            listing = await self._listings.get()
        if listing is None:
            self._listings.put_nowait(None)  # for the next caller too
            raise errors.LaunchFailed(
                self.refusal
                or f"the machine's kernel-queue service (pid {self.service.pid}) hung up"
            )
        return listing

    async def aclose(self) -> None:
        """End the connection: the service releases every group of this client at once."""
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        await self._task


def _welcome(
    path: Path,
    version: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    welcome: protocol.Message,
) -> protocol.Welcome:
    """The service's welcome, if it speaks this protocol; else LaunchFailed saying what to do
    (and the connection closed)."""
    if not isinstance(welcome, protocol.Welcome):
        writer.close()
        raise errors.LaunchFailed(f"the service on {path} answered {welcome!r} to hello")
    if welcome.protocol != protocol.PROTOCOL:
        writer.close()
        raise errors.LaunchFailed(protocol.mismatch(welcome, version))
    return welcome
