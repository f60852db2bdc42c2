"""Clients that hold on to a kernel as front ends do, for the output-delivery tests: `Direct`, a
jupyter_client on the kernel's own ports (as `jupyter console --existing` is), and `HeldSocket`,
a websocket through the server held open across restarts and resumes (as JupyterLab holds one);
`cell` is code that prints and returns, with the outputs it must produce; `both_see` sends one
through each held client, and `lost_across_resumes` does so while a kernel waits in the queue
again after a preemption."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from queue import Empty
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient

from tests import polling
from tests.conftest import Listener, Server

OUTPUT_WAIT = 20.0
"""Seconds a cell's IOPub messages may take; past that its output counts as lost."""
SEND_WAIT = 10.0
"""Seconds a direct client's send may wait for a peer to take it."""


class Direct:
    """A jupyter_client connected straight to a kernel's ports (as `jupyter console` is).

    On a ZeroMQ context of its own, ended on exit (a context the client made would be ended
    whenever the client is collected, in some later test), whose sends give up after
    SEND_WAIT: a DEALER whose peer refused the handshake (another process's socket now on the
    port) has no pipe left, and jupyter_client's send would block the event loop for good."""

    def __init__(self, server: Server, kernel_id: str) -> None:
        self.info = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
        self.context = zmq.asyncio.Context()
        self.context.setsockopt(zmq.SNDTIMEO, int(SEND_WAIT * 1000))
        self.client = AsyncKernelClient(context=self.context)
        self.client.load_connection_info(self.info)

    async def __aenter__(self) -> Direct:
        self.client.start_channels(stdin=False, hb=False)
        try:
            await self.client.wait_for_ready(timeout=60)
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.stop_channels()
        self.context.destroy(linger=0)

    def send(self, code: str) -> str:
        return str(self.client.execute(code))

    async def outputs(self, msg_id: str) -> tuple[str, str | None]:
        """The stream text and the execute_result of `msg_id`, up to its idle status."""
        text, data = "", None
        while True:
            try:
                message = await self.client.get_iopub_msg(timeout=OUTPUT_WAIT)
            except Empty:
                return text + "(IOPub went quiet before the cell's idle status)", data
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                text += content["text"]
            elif kind == "execute_result":
                data = content["data"]["text/plain"]
            elif kind == "status" and content["execution_state"] == "idle":
                return text, data


class HeldSocket:
    """A websocket held open across a restart or a resume, as JupyterLab holds one."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    async def send(self, code: str) -> str:
        return await self.listener.send(code)

    async def outputs(self, server: Server, msg_id: str) -> tuple[str, str | None]:
        def mine() -> list[dict[str, Any]]:
            messages = self.listener.messages
            return [m for m in messages if m.get("parent_header", {}).get("msg_id") == msg_id]

        async def idle() -> bool:
            return any(
                m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                for m in mine()
            )

        try:
            await server.wait_for(idle, within=OUTPUT_WAIT)
        except polling.NeverSaw:  # counted as a lost output, not a failure here
            return "(no idle status)", None
        text = "".join(m["content"]["text"] for m in mine() if m["msg_type"] == "stream")
        results = [m for m in mine() if m["msg_type"] == "execute_result"]
        return text, results[0]["content"]["data"]["text/plain"] if results else None


async def held(server: Server, kernel_id: str) -> AsyncIterator[tuple[HeldSocket, Direct]]:
    listener = await Listener.open(server, kernel_id)
    try:
        async with Direct(server, kernel_id) as direct:
            yield HeldSocket(listener), direct
    finally:
        listener.close()


def cell(tag: str, number: int) -> tuple[str, tuple[str, str]]:
    """Code that prints and returns; the outputs it must produce."""
    return f"print('{tag}', flush=True); {number} * 2", (f"{tag}\n", str(number * 2))


async def both_see(
    server: Server,
    socket: HeldSocket,
    direct: Direct,
    number: int,
    after: str,
    meanwhile: Callable[[], Awaitable[object]] | None = None,
) -> list[str]:
    """Send cell `number` through the held websocket and another through the direct client, run
    `meanwhile` (the kernel coming back) while both wait, and say what each lost after `after`
    ("restart 3"): one line a client whose outputs were not the cell's, none when both saw
    them."""
    ws_code, ws_want = cell(f"ws{number}", number)
    d_code, d_want = cell(f"d{number}", number)
    ws_id, d_id = await socket.send(ws_code), direct.send(d_code)
    if meanwhile is not None:
        await meanwhile()
    lost: list[str] = []
    if (got := await socket.outputs(server, ws_id)) != ws_want:
        lost.append(f"websocket after {after}: {got!r}")
    if (got := await direct.outputs(d_id)) != d_want:
        lost.append(f"direct client after {after}: {got!r}")
    return lost


async def lost_across_resumes(
    server: Server,
    low: str,
    high_name: str,
    resumes: int,
    end: Callable[[str], Awaitable[object]],
    within: float = 60,
) -> list[str]:
    """`resumes` times over, with both of `low`'s clients held: a kernel of `high_name` preempts
    `low`, a cell goes through each client while `low` waits in the queue again, `end(high)`
    ends the high kernel, and `low`, back, must answer both. What was lost (`both_see`)."""
    lost: list[str] = []
    async for socket, direct in held(server, low):
        for number in range(resumes):
            high = await server.start(high_name)
            assert (await server.execute(high, "1", within=within))["data"] == "1"
            await server.wait_reason(low, "requeued", within=within)
            ending = functools.partial(end, high)
            lost += await both_see(server, socket, direct, number, f"resume {number}", ending)
    return lost
