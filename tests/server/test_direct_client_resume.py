"""A client on the kernel's own ports keeps every output across resumes and wakes (issue 27).

A `BlockingKernelClient` on the kernel's connection info (what `jupyter console --existing`,
scripts and other front ends use), connected since before the first preemption or park, and a
notebook's websocket, both held open: after each resume (a higher-priority kernel took the GPU
and left) and each wake (parked, then resumed), the first cell each sends once the kernel runs
again gets its whole output: its busy status, the restore notice, what it prints and its
result.

The blocking client is the one that lost output: ZeroMQ sends its IOPub subscription again only
when it polls that socket, which it does only after sending the cell.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_core.utils import ensure_event_loop

from kernel_queue.launcher import subscriptions
from kernel_queue.server import kernels
from kernel_queue.session import KernelSession
from tests.conftest import KernelspecFactory, Listener, Server
from tests.server.clients import OUTPUT_WAIT, HeldSocket, cell

pytestmark = pytest.mark.timeout(900)

CYCLES = 10
"""Returns of each kind; half of them met by a console-style client, which lost every first
output before the fix (the script-style one lost the busy status and the restore notice)."""


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


class Blocking:
    """A BlockingKernelClient used from one thread of its own, as a script uses it."""

    def __init__(self, connection: dict[str, Any]) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blocking")
        self.client = BlockingKernelClient()
        self.client.load_connection_info(connection)

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    def _start(self) -> None:
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def _run(self, code: str, console: bool) -> tuple[str, str | None, str]:
        """Run a cell as scripts do (`execute_interactive`: send, then read IOPub) or as
        `jupyter console` does (send, look for an input request for 50 ms, then read IOPub);
        its stream text (after "[busy]" where its busy status came first), its result and
        the reply's status."""
        text: list[str] = []
        result: list[str] = []

        def hook(message: dict[str, Any]) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "execute_result":
                result.append(content["data"]["text/plain"])
            elif kind == "status" and content["execution_state"] == "busy" and not text:
                text.append("[busy]")

        try:
            if console:
                status = self._console(code, hook)
            else:
                reply = self.client.execute_interactive(code, timeout=OUTPUT_WAIT, output_hook=hook)
                status = reply["content"]["status"]
        except (TimeoutError, Empty):
            status = "no reply"
        return "".join(text), (result[0] if result else None), status

    def _console(self, code: str, hook: Any) -> str:
        msg_id = self.client.execute(code)
        deadline = time.monotonic() + OUTPUT_WAIT
        idle = False
        while not idle and time.monotonic() < deadline:
            try:
                self.client.get_stdin_msg(timeout=0.05)
            except Empty:
                while True:
                    try:
                        message = self.client.get_iopub_msg(timeout=0.01)
                    except Empty:
                        break
                    if message["parent_header"].get("msg_id") != msg_id:
                        continue
                    hook(message)
                    content = message["content"]
                    idle = message["msg_type"] == "status" and content["execution_state"] == "idle"
        while True:
            reply = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return str(reply["content"]["status"]) if idle else "no idle status"

    async def run(self, code: str, *, console: bool = False) -> tuple[str, str | None, str]:
        return tuple(await self.call(self._run, code, console))  # type: ignore[return-value]

    def _stop(self) -> None:
        self.client.stop_channels()
        ensure_event_loop().close()  # the loop jupyter_client made for this thread

    async def close(self) -> None:
        await self.call(self._stop)
        self.thread.shutdown()


async def held_clients(
    server: Server, kernel_id: str
) -> AsyncIterator[tuple[HeldSocket, Blocking]]:
    connection = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
    blocking = Blocking(connection)
    await blocking.call(blocking._start)
    listener = await Listener.open(server, kernel_id)
    try:
        yield HeldSocket(listener), blocking
    finally:
        listener.close()
        await blocking.close()


def _session(server: Server, kernel_id: str) -> KernelSession:
    session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel_id))
    assert session is not None, f"kernel {kernel_id} has no session"
    return session


async def _live(server: Server, kernel_id: str) -> None:
    km = server.app.kernel_manager.get_kernel(kernel_id)
    session = _session(server, kernel_id)

    async def runs() -> bool:
        return (
            not session.waiting
            and not session.parked
            and (await km.provisioner.poll() is None and session.live)
        )

    await server.wait_for(runs, what="the kernel running again")


def _lost(where: str, got: tuple[str, str | None, str], want: tuple[str, str]) -> list[str]:
    text, data, status = got
    restored = text.startswith("[busy]restored ") and text.endswith(want[0])
    return [] if (restored, data, status) == (True, want[1], "ok") else [f"{where}: {got!r}"]


@pytest.mark.parametrize("how", ["resume", "wake"])
async def test_a_direct_client_and_a_websocket_keep_the_first_output_after_each_return(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, how: str
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 30}
    low = await server.start(kernelspec("low", gpus=1, priority_class="low", checkpoint=checkpoint))
    assert (await server.execute(low, "x = 1"))["status"] == "ok"
    high_name = kernelspec("high", gpus=1, priority_class="high")
    lost: list[str] = []
    async for socket, blocking in held_clients(server, low):
        for number in range(CYCLES):
            if how == "resume":
                high = await server.start(high_name)
                assert (await server.execute(high, "1"))["data"] == "1"
                await server.wait_reason(low, "requeued")
                await server.shutdown_and_wait(high)
            else:
                await _session(server, low).park()
                await server.wait_reason(low, "GPU released")
                await _session(server, low).resume()
            await _live(server, low)
            # The user sends the next cell a moment later, not at once: by then the clients
            # that reconnect by themselves have, and the kernel holds nothing for them.
            await asyncio.sleep(3 * subscriptions.SETTLE)
            # Alternately a script's client and one that reads IOPub as late as the console.
            console = number % 2 == 1
            code, want = cell(f"direct{number}", number)
            got = await blocking.run(code, console=console)
            where = f"{'console' if console else 'script'} client after {how} {number}"
            lost += _lost(where, got, want)
            ws_code, ws_want = cell(f"ws{number}", number)
            if (got := await socket.outputs(server, await socket.send(ws_code))) != ws_want:
                lost.append(f"websocket after {how} {number}: {got!r}")
    assert lost == [], f"{len(lost)} of {2 * CYCLES} first cells lost output: {lost}"
    await server.shutdown_and_wait(low)
