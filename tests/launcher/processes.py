"""A launcher and its kernel as real processes, for the launcher's tests: `launch` (a fixture)
starts one with free ports and a status pipe and kills whatever is left in its teardown; the
jupyter_client helpers wait on one request's reply. Every wait is bounded."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernel_queue.launcher import contract
from tests.polling import until_sync
from tests.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-0123456789abcdef"
WAIT = 30.0
"""Seconds any single wait may take before the test fails."""


def launcher_env(tmpdir: Path, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("KERNEL_QUEUE")}
    env.pop("PYTEST_CURRENT_TEST", None)  # ipykernel captures fd 2 only where this is unset
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmpdir)
    env.update(extra)
    return env


def is_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_until_gone(pid: int, who: str) -> None:
    until_sync(lambda: is_gone(pid), f"{who} (pid {pid}) gone", within=WAIT)


class StatusReader:
    """Reads the launcher's JSON status lines from the read end of a pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.events: list[dict[str, Any]] = []

    def next(self, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no status event within {timeout} s; seen {self.events}")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    raise AssertionError(f"status fd closed; seen {self.events}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event


@dataclass
class Launcher:
    """A launcher process under test: its status stream, connection info and clients."""

    proc: subprocess.Popen[str]
    status: StatusReader
    info: dict[str, Any]
    clients: list[BlockingKernelClient] = field(default_factory=list)


@dataclass
class Launched(Launcher):
    """One launcher process under test, in its own `tmpdir`, and the kernel pids it told."""

    tmpdir: Path = field(kw_only=True)
    pids: list[int] = field(default_factory=list)

    def started(self, generation: int) -> int:
        """Wait for the ``started`` event of ``generation``; return the kernel's pid."""
        event = self.status.next()
        assert event["event"] == "started", self.status.events
        assert event["generation"] == generation, self.status.events
        self.pids.append(event["pid"])
        return int(event["pid"])

    def client(self) -> BlockingKernelClient:
        client = BlockingKernelClient()
        client.load_connection_info(self.info)
        # No heartbeat channel: on a loaded machine a late beat reads as "Kernel died before
        # replying to kernel_info"; the tests judge the kernel by its replies and its process.
        client.start_channels(hb=False)
        self.clients.append(client)
        client.wait_for_ready(timeout=60)
        return client

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout=timeout)


LaunchFactory = Callable[..., Launched]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[LaunchFactory]:
    """Start launchers; kill them, their kernels and their clients afterwards."""
    started: list[Launched] = []

    def start(
        *,
        args: Sequence[str] = (),
        kernel_argv: Sequence[str] = (),
        env: dict[str, str] | None = None,
        key_in_env: bool = True,
        stdout: int | None = None,
        wrapper: Sequence[str] = (),
    ) -> Launched:
        tmpdir = tmp_path / f"tmp{len(started)}"
        tmpdir.mkdir()
        ports = free_ports()
        extra = {
            contract.ENV_PORTS: ",".join(map(str, ports)),
            **({contract.ENV_KEY: KEY} if key_in_env else {}),
            **(env or {}),
        }
        argv = [*wrapper, sys.executable, "-m", "kernel_queue.launcher", *args]
        if kernel_argv:
            argv += ["--", *kernel_argv]
        proc, status = spawn(argv, tmpdir, extra, stdout=stdout)
        launched = Launched(proc, status, connection_info(ports), tmpdir=tmpdir)
        started.append(launched)
        return launched

    yield start

    for launched in started:
        stop(launched.proc, launched.clients, launched.status, launched.pids)


def connection_info(ports: Sequence[int]) -> dict[str, Any]:
    """The connection file a client of a launcher on `ports` (signed with KEY) loads."""
    names = ["shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"]
    info: dict[str, Any] = dict(zip(names, ports, strict=True))
    info.update(ip="127.0.0.1", key=KEY, transport="tcp", signature_scheme="hmac-sha256")
    return info


def spawn(
    argv: Sequence[str], tmpdir: Path, env: dict[str, str], *, stdout: int | None = None
) -> tuple[subprocess.Popen[str], StatusReader]:
    """Start `argv` (a launcher) with `env` over launcher_env(tmpdir) and a status pipe; the
    process and the pipe's reader."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            argv,
            env=launcher_env(tmpdir, **{contract.ENV_STATUS_FD: str(write_fd), **env}),
            pass_fds=[write_fd],
            stdout=stdout,
            text=True,
        )
    finally:
        os.close(write_fd)
    return proc, StatusReader(read_fd)


def stop(
    proc: subprocess.Popen[str],
    clients: Sequence[BlockingKernelClient],
    status: StatusReader,
    pids: Iterable[int],
) -> None:
    """Stop the clients, kill the launcher and the kernels `pids` still there, close the pipe."""
    for client in clients:
        client.stop_channels()
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=WAIT)
    for pid in pids:
        if not is_gone(pid):
            os.kill(pid, signal.SIGKILL)
    os.close(status.fd)


def execute(client: BlockingKernelClient, code: str, **options: Any) -> dict[str, Any]:
    """Run ``code`` and return the shell reply's content (no IOPub needed)."""
    content: dict[str, Any] = reply_to(client, client.execute(code, **options))["content"]
    return content


def reply_to(client: BlockingKernelClient, msg_id: str) -> dict[str, Any]:
    """The shell reply to `msg_id`, past any other (a second kernel_info_reply of a loaded
    machine's wait_for_ready)."""
    deadline = time.monotonic() + WAIT
    while True:
        reply: dict[str, Any] = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def evaluate(client: BlockingKernelClient, expression: str) -> dict[str, Any]:
    """The kernel's user_expressions entry for ``expression`` (status, data or ename)."""
    content = execute(client, "", user_expressions={"value": expression})
    assert content["status"] == "ok", content
    value: dict[str, Any] = content["user_expressions"]["value"]
    return value


def value_of(client: BlockingKernelClient, expression: str) -> str:
    value = evaluate(client, expression)
    assert value["status"] == "ok", value
    text: str = value["data"]["text/plain"]
    return text


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)
