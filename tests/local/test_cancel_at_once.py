"""A shutdown is a cancel whenever it comes (local backend): a DELETE sent 0 ms to well after
`POST /api/kernels`, while the kernel is being submitted, waits in its queue, or was just
admitted and starts, answers at once and leaves no kernel, launcher or GPU held (issue 27)."""

from __future__ import annotations

import pytest

from tests import cancel_race
from tests.conftest import KernelspecFactory, Server, launcher_pids

REPEAT = 20


pytestmark = pytest.mark.local_gpus("0")


def _failures(outcomes: list[cancel_race.Outcome]) -> list[str]:
    return [str(o) for o in outcomes if o.status != 204]


async def test_a_delete_at_any_moment_of_a_queued_start_answers_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, url: str, token: str
) -> None:
    name = kernelspec(gpus=1)
    holder = await server.start_running(name)

    outcomes = await cancel_race.race(url, token, name, cancel_race.OFFSETS, REPEAT)

    assert not _failures(outcomes), _failures(outcomes)
    assert await server.kernel_ids() == {holder}
    # The queue holds nobody else: a kernel started now is first in line.
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")
    await server.shutdown_and_wait(waiting, holder)


async def test_a_delete_while_the_admitted_kernel_starts_answers_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, url: str, token: str
) -> None:
    name = kernelspec(gpus=1)

    outcomes = await cancel_race.race(url, token, name, (*cancel_race.OFFSETS, 0.3), REPEAT // 4)

    assert not _failures(outcomes), _failures(outcomes)
    # A kernel that already ran when its DELETE came is listed until its shutdown ends:
    # jupyter_server answers such a DELETE at once (pending kernels). A cancelled one is not.
    await server.wait_gone(*(o.kernel_id for o in outcomes))
    assert not await server.kernel_ids()
    await server.wait_for(lambda: not launcher_pids(), what="no launcher left")
    # The GPU is free again: the next kernel runs.
    kernel = await server.start(name)
    assert (await server.execute(kernel, "2"))["data"] == "2"
    await server.shutdown_and_wait(kernel)
