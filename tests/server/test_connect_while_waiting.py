"""The kernel websocket of a kernel that waits in its queue connects at once (a browser lets
only one websocket per host be CONNECTING, so a held upgrade would block every other notebook
of the tab), says `starting`, and a cell sent meanwhile runs once after admission."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server

# An upgrade answered at once takes milliseconds; this only bounds a held one.
CONNECT_SECONDS = 5.0


pytestmark = pytest.mark.local_gpus("0")


def request(msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "version": "5.3"}
    header |= {"session": uuid.uuid4().hex, "username": "test", "date": ""}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
    return {**message, "channel": "shell", "buffers": []}


def execute(code: str) -> dict[str, Any]:
    return request(
        "execute_request",
        {"code": code, "silent": False, "store_history": True, "user_expressions": {}},
    )


async def read_until_reply(ws: Any, msg_id: str, within: float = 60) -> list[dict[str, Any]]:
    """Every message until both the reply to `msg_id` and its idle status came. They travel on
    two sockets (shell and IOPub), so either may reach the websocket first."""
    seen: list[dict[str, Any]] = []
    replied = idle = False
    try:
        async with asyncio.timeout(within):
            while not (replied and idle):
                raw = await ws.read_message()
                assert raw is not None, f"the websocket closed; seen: {seen}"
                msg = json.loads(raw)
                seen.append(msg)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                replied = replied or msg["msg_type"] == "execute_reply"
                state = msg["content"].get("execution_state")
                idle = idle or (msg["msg_type"] == "status" and state == "idle")
    except TimeoutError:
        kinds = [(m["channel"], m["msg_type"]) for m in seen]
        raise AssertionError(f"no reply and idle within {within} s; seen: {kinds}") from None
    return seen


async def connect_behind_a_holder(
    server: Server, kernelspec: KernelspecFactory
) -> tuple[str, str, Any]:
    """A kernel holding the only GPU, one waiting behind it, and a websocket to the waiting one
    (connected within `CONNECT_SECONDS`)."""
    name = kernelspec(gpus=1)
    holder = await server.start(name)
    assert (await server.execute(holder, "1+1"))["data"] == "2"
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")
    async with asyncio.timeout(CONNECT_SECONDS):
        ws = await server.ws_fetch("api", "kernels", waiting, "channels")
    return holder, waiting, ws


async def test_a_waiting_kernel_connects_at_once_and_its_cell_runs_once_after_admission(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    holder, waiting, ws = await connect_behind_a_holder(server, kernelspec)
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            first = json.loads(await ws.read_message())
        assert (first["msg_type"], first["content"]) == ("status", {"execution_state": "starting"})

        info, cell = request("kernel_info_request", {}), execute("print('ran after admission')")
        await ws.write_message(json.dumps(info))
        await ws.write_message(json.dumps(cell))
        model = await server.model(waiting)
        assert "position 1 of 1" in model["reason"]  # still queued: nothing ran yet

        await server.shutdown(holder)
        seen = await read_until_reply(ws, cell["header"]["msg_id"])
        replies = [m["msg_type"] for m in seen if m["channel"] == "shell"]
        assert replies == ["kernel_info_reply", "execute_reply"]  # in the order sent
        printed = [
            m["content"]["text"]
            for m in seen
            if m["msg_type"] == "stream"
            and m["parent_header"]["msg_id"] == cell["header"]["msg_id"]
        ]
        assert printed == ["ran after admission\n"]
        reply = next(m for m in seen if m["msg_type"] == "execute_reply")
        assert (reply["content"]["status"], reply["content"]["execution_count"]) == ("ok", 1)
    finally:
        ws.close()
    await server.shutdown_and_wait(waiting)


async def test_a_waiting_kernel_that_is_shut_down_tells_its_client_dead_and_closes(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    holder, waiting, ws = await connect_behind_a_holder(server, kernelspec)
    try:
        await ws.write_message(json.dumps(execute("print('never')")))
        await server.shutdown(waiting)
        states = []
        async with asyncio.timeout(30):
            while (raw := await ws.read_message()) is not None:
                msg = json.loads(raw)
                states.append((msg["msg_type"], msg["content"].get("execution_state")))
    finally:
        ws.close()
    assert states == [("status", "starting"), ("status", "dead")]
    await server.shutdown_and_wait(holder)
