"""A launcher started ahead of its kernel, so that an admitted kernel does not wait for one.

A launcher's own start (Python's, then its imports) is about 40 ms of every local kernel's start
that a plain kernel does not have. The local backend keeps one spare: `python -m
kernel_queue.launcher --spare`, its imports done, waiting on stdin. An admitted kernel takes it
and hands it its launch (arguments, environment, folder and log, as JSON, then EOF); the spare
takes them on and runs as a launcher started with them would. The next spare is started a moment
after (`SPARE_DELAY`), off the path of the kernel that just started.

A spare is started with only the variables that shape a Python process's start (`startup_env`)
of the launch before, and is handed to a launch only when that launch's are the same: a
launcher that took other ones (another PYTHONPATH, LD_PRELOAD) would not be the one a cold start
gives. Besides those it carries only kernel-queue's own variables (`KERNEL_QUEUE_*`, never a
launch's settings), which no launcher reads before its launch; nothing else of the server's
environment reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel_queue.launcher import contract

SPARE_DELAY = 1.0
"""Seconds after a launch before the next spare starts: not beside that kernel's own start."""
CLOSE_TIMEOUT = 2.0
"""Seconds a spare gets to exit after its stdin closes before it is killed."""
STARTUP_NAMES = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
"""Variables that shape a Python process's start besides PYTHON* and LD_*: the user site
(HOME), the locale of its streams, the time zone its `time` module read."""


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that shape how a Python process starts and what it imports."""
    return {
        name: value
        for name, value in env.items()
        if name.startswith(("PYTHON", "LD_")) or name in STARTUP_NAMES
    }


class Spare:
    """One started spare launcher: its process, the read end of its status pipe and the number
    its write end has in the spare (the launch names it as the status fd)."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        status_read: int,
        status_fd: int,
        env: dict[str, str],
    ) -> None:
        self.process = process
        self.status_read = status_read
        self.status_fd = status_fd
        self.env = env
        self._taken = False

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def fits(self, env: Mapping[str, str]) -> bool:
        """True when a launch with `env` may take this spare: it runs, and it started as a
        launcher with that environment would have."""
        return self.alive and not self._taken and startup_env(env) == self.env

    async def hand_over(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: Path
    ) -> None:
        """Give the spare its launch and close its stdin; OSError if it is gone."""
        self._taken = True
        stdin = self.process.stdin
        if stdin is None:
            raise OSError("the spare launcher has no stdin")
        # no folder: the server's own, as a launcher started from it gets
        launch = {"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd(), "log": str(log)}
        stdin.write(json.dumps(launch).encode())
        try:
            await stdin.drain()
        finally:
            stdin.close()
        with contextlib.suppress(OSError):  # its exit is followed by the launch's own wait
            await stdin.wait_closed()

    async def close(self) -> None:
        """End a spare nobody took: close its stdin (it exits), else kill it; always reaped."""
        if not self._taken:
            self._taken = True
            if self.process.stdin is not None:
                self.process.stdin.close()
            with contextlib.suppress(OSError):
                os.close(self.status_read)
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await asyncio.shield(self.process.wait())
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


def _carried(env: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in contract.kernel_env(env).items()
        if name.startswith("KERNEL_QUEUE_")
    }


async def start(env: Mapping[str, str], folder: Path) -> Spare:
    """Start a spare launcher in `folder` (the kernels' logs: private, made by the launch
    before) with `startup_env(env)`; OSError if it cannot start."""
    startup = startup_env(env)
    read_fd, write_fd = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kernel_queue.launcher",
            "--spare",
            env={**_carried(env), **startup},
            cwd=folder,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Spare(process, read_fd, write_fd, startup)


class Keeper:
    """Keeps at most one spare for a backend: `take` it for a launch, `prepare` the next one a
    moment later, `aclose` ends whatever is left (every spare it started is reaped)."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._log = log
        self._spare: Spare | None = None
        self._preparing: asyncio.Task[None] | None = None
        self._opening: asyncio.Future[Spare] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def take(self, env: Mapping[str, str]) -> Spare | None:
        """The spare for a launch with `env`, or None (start a launcher as usual). A spare that
        does not fit is ended: the next one is prepared with the newer environment."""
        spare, self._spare = self._spare, None
        if spare is None or spare.fits(env):
            return spare
        self._close_later(spare)
        return None

    def prepare(self, env: Mapping[str, str], folder: Path) -> None:
        """Start a spare for launches like one with `env`, `SPARE_DELAY` from now, unless one
        waits already or is on its way."""
        if self._closed or self._spare is not None:
            return
        if self._preparing is not None and not self._preparing.done():
            return
        self._preparing = asyncio.create_task(self._start_later(dict(env), folder))

    async def _start_later(self, env: dict[str, str], folder: Path) -> None:
        await asyncio.sleep(SPARE_DELAY)
        if self._closed or self._spare is not None:
            return
        self._opening = asyncio.ensure_future(start(env, folder))
        try:  # shielded: a spare started while the backend closes is still ended by `aclose`
            spare = await asyncio.shield(self._opening)
        except OSError as exc:
            self._log.debug("no spare kernel launcher: %s", exc)
            return
        finally:
            self._opening = None
        if self._closed or self._spare is not None:
            self._close_later(spare)
        else:
            self._spare = spare

    def _close_later(self, spare: Spare) -> None:
        task = asyncio.create_task(spare.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """No more spares; end the one waiting or being started, and wait until each is gone."""
        self._closed = True
        opening = self._opening  # a start under way, which cancelling its waiter does not stop
        if self._preparing is not None:
            self._preparing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._preparing
        if opening is not None:
            with contextlib.suppress(OSError):
                self._close_later(await opening)
        if self._spare is not None:
            self._close_later(self._spare)
            self._spare = None
        if self._closing:
            await asyncio.gather(*self._closing)
