"""Continuous checkpoints as a notebook sees them, on either backend: the cells the kill tests
run before the kernel dies, and a cell run as a notebook runs it (numbered)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.conftest import Server
from tests.messages import execute_request

CELLS = [
    "import numpy as np\nx = 1",
    "a = np.zeros(2**18)\nb = np.ones(2**18)",
    "x = 3",
    "a[0] = 7.0",
    "x = 5",
]


async def run(server: Server, kernel_id: str, code: str) -> dict[str, Any]:
    """Run ``code`` as a notebook does (``store_history``: the cell gets its number); the
    execute_result's text, the stream text and the reply's status and execution_count."""
    ws = await server.ws_fetch("api", "kernels", kernel_id, "channels")
    request = execute_request(code)
    msg_id = request["header"]["msg_id"]
    result: dict[str, Any] = {"stream": "", "data": None, "status": None, "idle": False}
    try:
        async with asyncio.timeout(60):
            await ws.write_message(json.dumps(request))
            while not (result["status"] and result["idle"]):
                msg = json.loads(await ws.read_message())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, body = msg["msg_type"], msg["content"]
                if kind == "stream":
                    result["stream"] += body["text"]
                elif kind == "execute_result":
                    result["data"] = body["data"].get("text/plain")
                elif kind == "execute_reply":
                    result["status"], result["count"] = body["status"], body["execution_count"]
                elif kind == "status":
                    result["idle"] = body["execution_state"] == "idle"
    finally:
        ws.close()
    return result
