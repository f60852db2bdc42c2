"""One launcher subprocess of the local backend: start it, relay its status, report its exit.

The launcher (`python -m kernel_queue.launcher`) takes its inputs as env rendered by
`launcher.contract` and writes JSON status lines to a pipe; this module reads them on the event
loop (no threads, no polling) and hands each to a callback. It knows nothing about queues:
`local.py` decides when to start and stop launchers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_queue import launcher
from kernel_queue.backends.local import spare_launcher
from kernel_queue.launcher import contract

LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 << 10  # read at most this much of a log for its last lines


@dataclass(frozen=True)
class LaunchRequest:
    """How to start one kernel's launcher."""

    kernel_id: str
    argv: tuple[str, ...]
    """The kernel command, after ``--``."""
    env: Mapping[str, str]
    """The kernel's own environment; any ``KERNEL_QUEUE_LAUNCH_*`` in it is dropped."""
    cwd: str | None
    launch: contract.Launch
    """The launcher's inputs but its status fd, which `LauncherProcess.run` opens."""
    devices: tuple[str, ...]
    log_path: Path


class LauncherProcess:
    """A running launcher. `run()` returns its exit status (128 + signal when killed)."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self._on_event = on_event
        self._process: asyncio.subprocess.Process | None = None
        self._early: list[int] = []  # signals sent while the launcher was still being spawned
        self.exited = asyncio.Event()

    @property
    def pid(self) -> int | None:
        """The launcher's pid once it was spawned."""
        return self._process.pid if self._process is not None else None

    async def run(self, request: LaunchRequest, spare: spare_launcher.Spare | None = None) -> int:
        """Start the launcher (or hand the launch to `spare`, started ahead) and follow it until
        it exits; OSError if it cannot start.

        `exited` is set however this ends, so a caller waiting for the exit never hangs."""
        try:
            if spare is not None and not await _hand_over(request, spare):
                spare = None  # it died before it could take the launch: start one now
            if spare is not None:
                read_fd = spare.status_read
                self._process = spare.process
            else:
                read_fd, write_fd = os.pipe()
                try:
                    self._process = await _spawn(request, write_fd)
                except BaseException:
                    os.close(read_fd)
                    raise
                finally:
                    os.close(write_fd)
            for signum in self._early:
                self.signal(signum)
            try:
                await self._follow(read_fd)
            except BaseException:  # cancelled, or a callback failed: leave no launcher behind
                self.signal(signal.SIGKILL)
                await self._process.wait()
                raise
            code = await self._process.wait()
        finally:
            self.exited.set()
        return launcher.shell_status(code)

    def signal(self, signum: int) -> None:
        """Send `signum` to the launcher if it still runs (it forwards most to the kernel)."""
        if self._process is None and not self.exited.is_set():
            self._early.append(signum)
        elif self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signum)

    async def _follow(self, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        try:
            async for line in reader:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self._on_event(event)
        finally:
            transport.close()


def _launcher_env(request: LaunchRequest, status_fd: int) -> dict[str, str]:
    """The launcher's environment: the kernel's, its launch settings, its GPUs and its id."""
    launch = request.launch._replace(status_fd=status_fd)
    return {
        # The devices are numbered as NVML and nvidia-smi number them (by PCI bus); CUDA's own
        # default is fastest first, which on a box of mixed GPUs is another card for an index.
        # A kernelspec's env may choose otherwise.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **contract.kernel_env(request.env),
        **contract.render(launch),  # the key too: the launcher strips it before the kernel
        "CUDA_VISIBLE_DEVICES": ",".join(request.devices),
        "KERNEL_ID": request.kernel_id,
    }


async def _hand_over(request: LaunchRequest, spare: spare_launcher.Spare) -> bool:
    """Hand the launch to `spare`; False (the spare closed and reaped) if it is gone."""
    request.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = _launcher_env(request, spare.status_fd)
    try:
        await spare.hand_over(["--", *request.argv], env, request.cwd, request.log_path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.close(spare.status_read)
        await spare.close()
        if isinstance(exc, OSError):
            return False
        raise
    return True


async def _spawn(request: LaunchRequest, status_fd: int) -> asyncio.subprocess.Process:
    env = _launcher_env(request, status_fd)
    argv = [sys.executable, "-m", "kernel_queue.launcher", "--", *request.argv]
    request.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_fd = os.open(request.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # On the event loop's thread: the launcher's parent-death signal follows this thread.
        return await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=request.cwd or None,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(status_fd,),
            start_new_session=True,
        )
    finally:
        os.close(log_fd)


def log_tail(path: Path) -> str:
    """ "; last lines of <path>:" and the file's last lines, for error messages ("" if none)."""
    try:
        with path.open("rb") as file:  # only the end: a chatty kernel's log may be large
            file.seek(max(0, file.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    lines = text.splitlines()[-LOG_TAIL_LINES:]
    return f"; last lines of {path}:\n" + "\n".join(lines) if lines else ""


def free_ports(ip: str, count: int) -> list[int]:
    """`count` distinct ports that are free on `ip` now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((ip, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
