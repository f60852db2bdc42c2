"""`POST /api/kernel-queue/kernels/<id>/park` and `…/resume`: authenticated and authorized as
jupyter_server's kernel API (resource "kernels", write); the kernel's listing entry back; 404 for
an unknown kernel, 409 with the sentence when it cannot be parked."""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server
from tests.local_parking import running, saving


class ReadOnly(Authorizer):  # type: ignore[misc]
    """Lets a user read everything and change nothing."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return action == "read"


pytestmark = pytest.mark.local_gpus("0")


@pytest.fixture
def authorizer_class() -> str | None:
    return None


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any], authorizer_class: str | None) -> Any:
    if authorizer_class is not None:
        jp_server_config["ServerApp"]["authorizer_class"] = authorizer_class
    return jp_server_config


async def act(server: Server, kernel_id: str, action: str, **kwargs: Any) -> tuple[int, Any]:
    response = await server.fetch(
        "api", "kernel-queue", "kernels", kernel_id, action, method="POST", body="", **kwargs
    )
    return response.code, json.loads(response.body)


async def refused(server: Server, kernel_id: str, action: str, **kwargs: Any) -> tuple[int, Any]:
    with pytest.raises(HTTPClientError) as error:
        await act(server, kernel_id, action, **kwargs)
    response = error.value.response
    body = json.loads(response.body) if response is not None and response.body else None
    return error.value.code, body


async def test_park_then_resume_over_rest_keeps_the_variables(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "x = 41")

    before = datetime.datetime.now(datetime.UTC)
    code, entry = await act(server, kernel, "park")
    assert code in (200, 202)
    assert entry["id"] == kernel
    assert entry["queue"]["state"] == "parked"
    model = await server.wait_reason(kernel, "GPU released")
    assert model["reason"].startswith("parked on request; GPU released; your next cell brings")
    listing = json.loads((await server.fetch("api", "kernel-queue", "kernels")).body)
    [listed] = [k for k in listing if k["id"] == kernel]
    assert listed["queue"]["state"] == "parked"
    since = datetime.datetime.fromisoformat(listed["queue"]["parked_since"])
    assert before <= since <= datetime.datetime.now(datetime.UTC)

    code, entry = await act(server, kernel, "resume")
    assert code in (200, 202)
    assert entry["queue"]["state"] in {"requeued", "admitted", "resumed"}
    assert (await server.execute(kernel, "x + 1"))["data"] == "42"

    # Resuming a kernel that runs changes nothing and says where it stands.
    code, entry = await act(server, kernel, "resume")
    assert (code, entry["queue"]["state"]) == (200, "resumed")
    await server.shutdown_and_wait(kernel)


async def test_an_interrupt_of_a_parked_kernel_does_nothing_and_is_not_kept_for_later(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "x = 41")
    await act(server, kernel, "park")
    await server.wait_reason(kernel, "GPU released")
    interrupted = await server.fetch("api", "kernels", kernel, "interrupt", method="POST", body="")
    assert interrupted.code == 204
    assert (await server.model(kernel))["reason"].startswith("parked on request")
    # The cell that wakes it runs to its end: no interrupt was queued for the woken kernel.
    woken = await server.execute(kernel, "import time; time.sleep(1); x + 1")
    assert (woken["status"], woken["error"], woken["data"]) == ("ok", None, "42")
    await server.shutdown_and_wait(kernel)


async def test_what_cannot_be_parked_is_refused_with_the_reason(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    fresh = await server.start(kernelspec("fresh", gpus=1))
    assert (await server.execute(fresh, "1"))["data"] == "1"
    code, body = await refused(server, fresh, "park")
    assert code == 409
    assert "saves no checkpoints, so parking would lose its variables" in body["message"]
    queued = await server.start(saving(kernelspec, store))
    await server.wait_reason(queued, "position 1 of 1")
    code, body = await refused(server, queued, "park")
    assert code == 409
    assert "is queued, not running: only a running kernel can be parked" in body["message"]

    unknown = str(uuid.uuid4())
    for action in ("park", "resume"):
        code, body = await refused(server, unknown, action)
        assert (code, body["message"]) == (404, f"no kernel {unknown} on this server")
    assert (await server.execute(fresh, "2"))["data"] == "2"  # nothing changed
    await server.shutdown_and_wait(queued, fresh)


async def test_park_and_resume_need_the_token(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await server.start(saving(kernelspec, store))
    assert (await server.execute(kernel, "1"))["data"] == "1"
    for action in ("park", "resume"):
        code, _ = await refused(server, kernel, action, headers={"Authorization": "token wrong"})
        assert code == 403
        code, _ = await refused(server, kernel, action, headers={"Authorization": ""})
        assert code == 403
    listing = json.loads((await server.fetch("api", "kernel-queue", "kernels")).body)
    assert [k["queue"]["state"] for k in listing] == ["running"]  # never parked
    await server.shutdown_and_wait(kernel)


@pytest.mark.parametrize("authorizer_class", [f"{__name__}.ReadOnly"])
async def test_park_and_resume_need_write_access_to_kernels(server: Server) -> None:
    kernel = str(uuid.uuid4())  # refused before the kernel is even looked up
    for action in ("park", "resume"):
        code, _ = await refused(server, kernel, action)
        assert code == 403
    listing = await server.fetch("api", "kernel-queue", "kernels")  # reading is allowed
    assert json.loads(listing.body) == []


async def test_a_kernel_running_a_cell_is_not_parked_and_its_cell_finishes(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    import asyncio

    from tests.conftest import Listener

    kernel = await server.start(saving(kernelspec, store))
    listener = await Listener.open(server, kernel)
    try:
        cell = asyncio.ensure_future(
            server.execute(kernel, "import time\nprint('started', flush=True)\ntime.sleep(3)\n7")
        )

        async def busy() -> bool:
            return (await server.model(kernel))["execution_state"] == "busy"

        await server.wait_for(busy)
        code, body = await refused(server, kernel, "park")
        assert code == 409
        assert "is running a cell: park it once the cell has finished" in body["message"]
        done = await cell
    finally:
        listener.close()
    assert (done["data"], done["error"]) == ("7", None)
    assert (await server.model(kernel))["execution_state"] != "dead"
    await server.shutdown_and_wait(kernel)
