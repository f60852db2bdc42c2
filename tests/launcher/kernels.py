"""A preempted kernel's launcher and kernel as real processes, for the tests of preemption,
continuous checkpoints and damaged checkpoints: `start_kernel` (a fixture) starts a launcher
with a checkpoint store and reads its status pipe; `run` executes a cell and gathers its
outputs. Every wait is bounded, and the fixture kills every launcher, kernel and client it
started."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernel_queue.launcher import contract
from tests.launcher.processes import (
    KEY,
    WAIT,
    Launcher,
    connection_info,
    free_ports,
    spawn,
    stop,
)


@dataclass
class Cell:
    """One execute_request: its reply content and its IOPub messages."""

    reply: dict[str, Any]
    outputs: list[dict[str, Any]]

    def streams(self) -> list[str]:
        return streams(self.outputs)


def streams(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]


@dataclass
class Kernel(Launcher):
    """One launcher under test with its checkpoint store and termination log."""

    store: Path = field(kw_only=True)
    termination_log: Path = field(kw_only=True)

    def client(self, *, iopub: bool = True) -> BlockingKernelClient:
        client = BlockingKernelClient()
        client.load_connection_info(self.info)
        client.start_channels(iopub=iopub, stdin=False, hb=False)
        self.clients.append(client)
        if iopub:
            client.wait_for_ready(timeout=60)
        return client

    def sigterm(self) -> tuple[int, float]:
        """SIGTERM the launcher; its exit status and the seconds it took to exit."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(timeout=WAIT)
        return status, time.monotonic() - started

    def events(self, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Every status event up to the launcher's exit (the pipe's end of file)."""
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.status.fd], [], [], deadline - time.monotonic())
            assert ready, f"the status fd is still open after {timeout} s"
            chunk = os.read(self.status.fd, 65536)
            if not chunk:
                break
            self.status.buffer += chunk
        lines, self.status.buffer = self.status.buffer.split(b"\n"), b""
        self.status.events += [json.loads(line) for line in lines if line]
        return self.status.events

    def checkpoint_event(self) -> dict[str, Any]:
        [event] = [e for e in self.events() if e["event"] == "checkpoint"]
        return event


StartKernel = Callable[..., Kernel]


@pytest.fixture
def start_kernel(tmp_path: Path) -> Iterator[StartKernel]:
    """Start launchers with checkpointing into a store; kill them and their kernels afterwards."""
    started: list[Kernel] = []

    def start(store: Path, **env: str) -> Kernel:
        tmpdir = tmp_path / f"launch{len(started)}"
        tmpdir.mkdir()
        ports = free_ports()
        termination_log = tmpdir / "termination-log"
        extra = {
            contract.ENV_PORTS: ",".join(map(str, ports)),
            contract.ENV_KEY: KEY,
            contract.ENV_TERMINATION_LOG: str(termination_log),
            contract.ENV_CHECKPOINT_DIR: str(store),
            **env,
        }
        proc, status = spawn([sys.executable, "-m", "kernel_queue.launcher"], tmpdir, extra)
        kernel = Kernel(
            proc, status, connection_info(ports), store=store, termination_log=termination_log
        )
        started.append(kernel)
        return kernel

    yield start

    for kernel in started:
        kernels = [e["pid"] for e in kernel.status.events if e["event"] == "started"]
        stop(kernel.proc, kernel.clients, kernel.status, kernels)


def run(client: BlockingKernelClient, code: str) -> Cell:
    """Execute ``code``; wait for its reply and for its IOPub messages up to ``idle``."""
    msg_id = client.execute(code)
    outputs = iopub_until(client, msg_id, lambda m: m["msg_type"] == "status" and idle(m))
    return Cell(shell_reply(client, msg_id)["content"], outputs)


def shell_reply(client: BlockingKernelClient, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id``, past any kernel_info replies ``wait_for_ready`` left: it
    sends another request each second it has no answer, and returns on the first reply."""
    while True:
        reply: dict[str, Any] = client.get_shell_msg(timeout=WAIT)
        if reply["msg_type"] != "kernel_info_reply":
            break
    assert reply["parent_header"]["msg_id"] == msg_id
    return reply


def idle(message: dict[str, Any]) -> bool:
    return bool(message["content"].get("execution_state") == "idle")


def iopub_until(
    client: BlockingKernelClient,
    msg_id: str | None,
    done: Callable[[dict[str, Any]], bool],
    timeout: float = WAIT,
) -> list[dict[str, Any]]:
    """IOPub messages parented to ``msg_id`` (None: to no request) up to one ``done`` accepts."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while True:
        try:
            message = client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        except Empty:
            raise AssertionError(f"IOPub went quiet; seen {seen}") from None
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(message)
        if done(message):
            return seen
