"""`GET /api/kernel-queue/kernels`: what a reloaded JupyterLab page rebuilds its queue view from,
and the standard `DELETE /api/kernels/{id}` that its Cancel button sends."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server


async def listing(server: Server, **kwargs: Any) -> dict[str, dict[str, Any]]:
    response = await server.fetch("api", "kernel-queue", "kernels", method="GET", **kwargs)
    return {k["id"]: k for k in json.loads(response.body)}


pytestmark = pytest.mark.local_gpus("0")


async def test_listing_says_since_when_a_kernel_waits_and_cancel_takes_it_out_at_once(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    before = datetime.datetime.now(datetime.UTC)
    first, second = await server.start(name), await server.start(name)
    await server.wait_reason(second, "position 1 of 1")
    assert (await server.execute(first, "1+1"))["data"] == "2"

    kernels = await listing(server)
    assert kernels[first]["queue"]["state"] == "running"
    assert kernels[first]["waiting_since"] is None
    waiting = kernels[second]
    assert waiting["queue"]["state"] == "queued"
    assert waiting["queue"]["position"] == 1
    assert waiting["queue"]["gpus"] == 1
    since = datetime.datetime.fromisoformat(waiting["waiting_since"])
    assert before <= since <= datetime.datetime.now(datetime.UTC)

    # What the panel's Cancel button sends. The first kernel keeps the only GPU, so this
    # returns only if the queued launch is cancelled rather than awaited.
    await server.shutdown(second)
    kernels = await listing(server)
    assert second not in kernels
    assert kernels[first]["queue"]["state"] == "running"
    await server.shutdown_and_wait(first)


async def test_listing_needs_the_token(server: Server) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await listing(server, headers={"Authorization": "token wrong"})
    assert refused.value.code == 403
