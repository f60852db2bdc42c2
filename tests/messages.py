"""Jupyter messages the tests send as a front end would."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any


def execute_request(code: str, *, username: str = "test") -> dict[str, Any]:
    """A notebook's execute_request of ``code`` for a kernel's websocket (``store_history``:
    the cell gets its number); its ``header["msg_id"]`` names the replies."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": username}
    header.update(session=uuid.uuid4().hex, version="5.3", date="")
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
    content.update(allow_stdin=False, stop_on_error=True)
    request = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
    request.update(content=content, buffers=[])
    return request


async def run_cell(
    ws: Any, code: str, *, username: str = "test", within: float = 120
) -> dict[str, Any]:
    """Send ``code`` on an open kernel websocket and read until the kernel is idle again: the
    cell's execute_result text (``data``), its ``stream`` text, and its error's ``ename`` and
    ``evalue`` (None where it raised none)."""
    message = execute_request(code, username=username)
    msg_id = message["header"]["msg_id"]
    result: dict[str, Any] = {"data": None, "stream": "", "ename": None, "evalue": None}
    async with asyncio.timeout(within):
        await ws.write_message(json.dumps(message))
        while True:
            raw = await ws.read_message()
            assert raw is not None, f"the websocket closed; saw {result}"
            reply = json.loads(raw)
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = reply["msg_type"], reply["content"]
            if kind == "execute_result":
                result["data"] = body["data"].get("text/plain")
            elif kind == "stream":
                result["stream"] += body["text"]
            elif kind == "error":
                result.update(ename=body["ename"], evalue=body["evalue"])
            elif kind == "status" and body["execution_state"] == "idle":
                return result
