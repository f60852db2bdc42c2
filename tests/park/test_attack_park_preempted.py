"""A park asked while the kernel is being preempted, on the local backend with real kernels: it
is refused with the reason (or the kernel is parked once back), never answered as done while
nothing parks; the kernel comes back with its variables either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server

pytestmark = pytest.mark.local_gpus("0")


async def test_a_park_asked_during_a_preemption_is_refused_or_parks_it_and_loses_nothing(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 60}
    low = await server.start(kernelspec("low", gpus=1, priority_class="low", checkpoint=checkpoint))
    assert (await server.execute(low, "x = 41; big = bytes(50_000_000)"))["status"] == "ok"
    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    try:
        response = await server.fetch(
            "api", "kernel-queue", "kernels", low, "park", method="POST", body=""
        )
        code, body = response.code, json.loads(response.body)
    except HTTPClientError as error:
        code = error.code
        body = json.loads(error.response.body) if error.response is not None else {}
    state = (body.get("queue") or {}).get("state")
    assert code == 409 or state == "parked", (code, body)
    assert (await server.execute(high, "1"))["data"] == "1"
    await server.shutdown_and_wait(high)
    back = await server.execute(low, "x + 1", within=90)
    assert back["data"] == "42", back
    await server.shutdown_and_wait(low)
