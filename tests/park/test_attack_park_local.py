"""Parking on the local backend as outsiders break it: several kernels parked and woken at once
on two GPUs (never one GPU given twice), a park and a resume asked together, two notebooks
waking the same parked kernel at once, a cell that wakes it running exactly once with its output
once, and hostile kernel ids in the REST actions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Listener, Server, launcher_pids
from tests.local_parking import in_store, running, saving


async def _act(server: Server, kernel_id: str, action: str) -> int:
    try:
        response = await server.fetch(
            "api", "kernel-queue", "kernels", kernel_id, action, method="POST", body=""
        )
    except HTTPClientError as error:
        return error.code
    return int(response.code)


async def _devices(server: Server, kernel_id: str) -> str:
    result = await server.execute(kernel_id, "import os; os.environ['CUDA_VISIBLE_DEVICES']")
    assert result["status"] == "ok", result
    return str(result["data"])


async def test_four_kernels_on_two_gpus_parked_and_woken_at_once_never_share_a_gpu(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    name = saving(kernelspec, store)
    first = [await server.start(name), await server.start(name)]
    for i, kernel in enumerate(first):
        assert (await server.execute(kernel, f"mine = {i}"))["status"] == "ok"
    assert sorted([await _devices(server, k) for k in first]) == ["'0'", "'1'"]
    second = [await server.start(name), await server.start(name)]
    for kernel in second:
        await server.wait_reason(kernel, "queued in 'gpu'")

    # Both running kernels parked together: both waiting ones get a GPU each.
    codes = await asyncio.gather(*(_act(server, k, "park") for k in first))
    assert set(codes) <= {200, 202}, codes
    for kernel in first:
        await server.wait_reason(kernel, "GPU released")
    assert sorted(await asyncio.gather(*(_devices(server, k) for k in second))) == ["'0'", "'1'"]

    # Both parked ones woken together while the GPUs are taken: both wait, then come back
    # with their own variables once the others are parked in turn.
    await asyncio.gather(*(_act(server, k, "resume") for k in first))
    for kernel in first:
        await server.wait_reason(kernel, "waking from parked")
    await asyncio.gather(*(_act(server, k, "park") for k in second))
    back = await asyncio.gather(
        *(server.execute(k, "mine, os.environ['CUDA_VISIBLE_DEVICES']") for k in first)
    )
    assert [b["data"].split(",")[0] for b in back] == ["(0", "(1"], back
    assert sorted(b["data"].split(", ")[1] for b in back) == ["'0')", "'1')"], back
    await server.shutdown_and_wait(*first, *second)
    listed = json.loads((await server.fetch("api", "kernel-queue", "kernels")).body)
    assert listed == []
    assert not server.backend()._groups
    assert in_store(store, "*-*") == []


async def test_a_park_and_a_resume_asked_together_leave_it_running_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "x = 41")
    codes = await asyncio.gather(_act(server, kernel, "park"), _act(server, kernel, "resume"))
    assert set(codes) <= {200, 202}, codes
    # Whatever order they took, the next cell runs with x, and the kernel is not left parked.
    assert (await server.execute(kernel, "x + 1"))["data"] == "42"
    assert "parked" not in (await server.model(kernel)).get("reason", "")
    await server.shutdown_and_wait(kernel)


async def test_two_notebooks_waking_it_at_once_each_run_once_and_print_once(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "runs = []")
    assert await _act(server, kernel, "park") in (200, 202)
    await server.wait_reason(kernel, "GPU released")
    listener = await Listener.open(server, kernel)
    try:
        a, b = await asyncio.gather(
            server.execute(kernel, "runs.append('a'); print('out-A')"),
            server.execute(kernel, "runs.append('b'); print('out-B')"),
        )
        assert (a["status"], b["status"]) == ("ok", "ok"), (a, b)
        assert a["stream"].count("out-A") == 1 and "out-B" not in a["stream"], a
        assert b["stream"].count("out-B") == 1 and "out-A" not in b["stream"], b
        # The notebook is told once what came back (in whichever cell ran first).
        told = a["stream"] + b["stream"]
        assert told.count("restored 1 variable") == 1 and "Restored: runs." in told, told
        assert (await server.execute(kernel, "sorted(runs)"))["data"] == "['a', 'b']"
        # A third notebook, only watching, saw each output once.
        await server.wait_for(lambda: _seen(listener, "out-B"), what="b's output on iopub")
        assert listener.text().count("out-A") == 1, listener.text()
        assert listener.text().count("out-B") == 1, listener.text()
    finally:
        listener.close()
    await server.shutdown_and_wait(kernel)


async def _seen(listener: Listener, text: str) -> bool:
    return text in listener.text()


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param("..%2F..%2Fetc%2Fpasswd", id="traversal"),
        pytest.param("%2E%2E", id="dots"),
        pytest.param("k" * 5000, id="very-long"),
        pytest.param("k%C3%A9rnel-%E2%80%AE", id="unicode"),
        pytest.param("%00", id="nul"),
    ],
)
async def test_a_hostile_kernel_id_is_not_found_and_changes_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path, hostile: str
) -> None:
    kernel = await running(server, saving(kernelspec, store), "x = 1")
    for action in ("park", "resume"):
        code = await _act(server, hostile, action)
        assert code in (400, 404, 414), (action, code)
    assert "parked" not in (await server.model(kernel)).get("reason", "")
    assert (await server.execute(kernel, "x"))["data"] == "1"
    await server.shutdown_and_wait(kernel)
    assert launcher_pids() == set()
