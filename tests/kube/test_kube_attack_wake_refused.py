"""A cell that wakes a parked pod kernel while the API server keeps refusing the wake, through a
real jupyter_server: the notebook must be told (the cell answered with the reason, or the
kernel's reason saying it could not wake it), never left waiting on a kernel that stays parked."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.server import kernels
from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import checkpointed, wait_clean


@pytest.fixture
def backend_config() -> dict[str, Any]:
    return {"api_retry_seconds": 1.0}


async def test_a_cell_whose_wake_the_api_server_refuses_is_answered_with_the_reason(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start(checkpointed(plane, kernelspec))
    assert (await server.execute(kernel, "x = 41"))["status"] == "ok"
    session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel))
    assert session is not None
    await session.park()
    await server.wait_reason(kernel, "GPU released")
    plane.fail_next("patch", "workloads", status=503, count=1000)
    try:
        answered = await server.execute(kernel, "x + 1", within=30)
    except TimeoutError:
        answered = None
    finally:
        plane.clear_faults()
    reason = (await server.model(kernel)).get("reason", "")
    told = answered is not None or "could not wake it" in reason
    assert told, reason
    await server.shutdown_and_wait(kernel)
    await wait_clean(server, plane, kernel)
