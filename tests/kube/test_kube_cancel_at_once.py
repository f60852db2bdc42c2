"""A shutdown is a cancel whenever it comes (kubernetes backend, both planes): a DELETE sent
0 ms to 100 ms after `POST /api/kernels`, while the kernel's objects are being created, its
pods wait gated in the queue, or it was just admitted, answers at once and leaves nothing in
the cluster (issue 27; the local backend's is tests/local/test_cancel_at_once.py)."""

from __future__ import annotations

import logging

import pytest

from kernel_queue.server import kernelmanager
from tests import cancel_race
from tests.conftest import KernelspecFactory, Server, errors_in, tracebacks_in
from tests.kube.planes import Plane
from tests.kube.support import kube_spec, wait_clean

REPEAT = 5


async def test_a_delete_at_any_moment_of_a_queued_start_answers_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, url: str, token: str
) -> None:
    name = kube_spec(kernelspec)
    holder = await server.start(name)  # the queue's one GPU is held: the others wait
    assert (await server.execute(holder, "1"))["data"] == "1"

    outcomes = await cancel_race.race(url, token, name, cancel_race.OFFSETS, REPEAT)

    assert [str(o) for o in outcomes if o.status != 204] == []
    assert await server.kernel_ids() == {holder}
    await wait_clean(server, plane, *(o.kernel_id for o in outcomes))
    await server.shutdown(holder)
    await wait_clean(server, plane, holder)


async def test_a_delete_while_the_admitted_kernel_starts_answers_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, url: str, token: str
) -> None:
    name = kube_spec(kernelspec)

    outcomes = await cancel_race.race(url, token, name, (*cancel_race.OFFSETS, 0.3), 2)

    assert [str(o) for o in outcomes if o.status != 204] == []
    assert not await server.kernel_ids()
    await wait_clean(server, plane, *(o.kernel_id for o in outcomes))
    kernel = await server.start(name)  # the GPU is free again
    assert (await server.execute(kernel, "2"))["data"] == "2"
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


async def test_a_shutdown_that_goes_on_before_the_cancelled_start_ends_logs_no_error(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    url: str,
    token: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jupyter's shutdown going on while the start still ends (the server's wait for the cancel
    set to 0, as when the API server is slow to take the deletions) left the start's future to
    the start: no asyncio "invalid state" ERROR, no traceback, nothing left in the cluster (the
    local backend's test is in tests/server/test_logs.py)."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(kernelmanager, "_CANCEL_WAIT_SECONDS", 0.0)
    name = kube_spec(kernelspec)

    outcomes = await cancel_race.race(url, token, name, (*cancel_race.OFFSETS, 0.3), 1)

    assert [str(o) for o in outcomes if o.status != 204] == []
    await server.wait_gone(*(o.kernel_id for o in outcomes))
    await wait_clean(server, plane, *(o.kernel_id for o in outcomes))
    assert errors_in(caplog) == []
    assert tracebacks_in(caplog) == []
