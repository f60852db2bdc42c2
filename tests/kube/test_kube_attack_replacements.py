"""One replacement round per park. From the second park on, the Workload still carried the first
wake's `Requeued: True (Reactivated)`; with `Evicted: True` again it read as needing replacements
while its pod still saved (running, being deleted): each replacement was an excess pod Kueue
deleted, and the next was made at once (26 to 38 rounds for one park)."""

from __future__ import annotations

import logging
import re

import pytest

from kernel_queue.kube.queueing.status import needs_replacement
from kernel_queue.model import GroupPhase
from tests.contract import Contract
from tests.kube.parking import (
    execute,
    nothing_left,
    running,
    shut_down,
)
from tests.kube.planes import Plane
from tests.kube_pieces.statuses import cond, pod
from tests.kube_pieces.statuses import workload as status_workload

P = GroupPhase


async def test_three_parks_with_watches_lost_make_one_replacement_round_each(
    kube: Contract,
    plane: Plane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    ref, followed = await running(kube)
    for cycle in range(1, 4):
        await kube.backend.park(ref, grace=30)
        await followed.until(lambda f: f.phase is P.PARKING)
        plane.drop_watches()
        await followed.until(lambda f: f.phase is P.PARKED)
        plane.drop_watches()
        await kube.backend.resume(ref)
        await followed.until(lambda f: f.phase is P.RUNNING and f.statuses[-1].kernel_alive)
        await followed.running(ref)
        assert (await execute(ref, followed, "x += 1; print(x)")).endswith(f"{41 + cycle}\n")
    rounds = [
        int(m.group(1))
        for r in caplog.records
        if (
            m := re.search(
                r"replacement pods created for group \S+ \(round (\d+)\)", r.getMessage()
            )
        )
    ]
    assert rounds == [1, 2, 3], rounds
    await shut_down(kube, ref)
    await nothing_left(plane, ref)


def test_a_group_whose_pod_still_stops_needs_no_replacement_yet() -> None:
    parked_again = status_workload(
        cond("QuotaReserved"),
        cond("Evicted", True, "Deactivated", "The workload is deactivated"),
        cond("Requeued", True, "Reactivated"),  # left from the first wake
    )
    saving = pod("Running", ready=True, deleting=True)
    assert not needs_replacement(parked_again, [saving])
    assert needs_replacement(parked_again, [pod("Failed", exit_code=143, deleting=True)])
    assert needs_replacement(parked_again, [])
