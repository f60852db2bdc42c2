"""Parking on the kubernetes backend as outsiders break it, with real kernels on both planes:
the release of a parked kernel meeting faults, watches dropped or expired while it parks and
while it is parked, a wake the API server keeps refusing once it is parked, and its Workload
deleted by an admin while it is parked."""

from __future__ import annotations

import asyncio

import pytest

from kernel_queue import errors
from kernel_queue.backends.kubernetes import groups
from kernel_queue.kube import kueue
from kernel_queue.model import GroupPhase, StopCause
from tests.contract import Contract
from tests.kube.parking import (
    RETRYING_FOR_A_SECOND,
    being_parked,
    execute,
    nothing_left,
    parked,
    running,
    shut_down,
    workload,
)
from tests.kube.planes import Plane
from tests.polling import until

P = GroupPhase


@pytest.mark.parametrize(
    ("verb", "plural", "fault"),
    [
        pytest.param("delete", "workloads", {"status": 500, "count": 2}, id="workload-500"),
        pytest.param("delete", "workloads", {"status": 504, "after": True}, id="workload-lost"),
        pytest.param("delete", "pods", {"status": 500, "count": 2}, id="pod-500"),
        pytest.param("create", "pods", {"status": 500}, id="cleanup-pod-500"),
    ],
)
async def test_a_parked_kernel_released_through_faults_leaves_nothing(
    kube: Contract,
    plane: Plane,
    verb: str,
    plural: str,
    fault: dict[str, object],
) -> None:
    ref, followed = await parked(kube)
    plane.fail_next(verb, plural, **fault)  # type: ignore[arg-type]
    await kube.backend.stop(ref, grace=30, cause=StopCause.SHUTDOWN)
    await kube.backend.release(ref)
    await followed.until(lambda f: f.ended)
    await nothing_left(plane, ref, parked=True)


async def test_a_kernel_ended_while_its_parked_replacement_is_being_made_makes_no_pod_after(
    kube: Contract, plane: Plane
) -> None:
    """The park's replacement pod is refused (500) again and again while the kernel is shut
    down: the retries stop with the release. A pod made after the Workload was deleted has
    Kueue (up to 0.19) make a Workload for it again, and both were left behind (CI, under
    load)."""
    ref, followed = await running(kube)
    plane.fail_next("create", "pods", 500, count=4)  # each retry of the round meets one
    await kube.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is P.PARKED)
    await kube.backend.stop(ref, grace=30, cause=StopCause.SHUTDOWN)
    await kube.backend.release(ref)
    creates = plane.requests[("create", "pods")]
    await followed.until(lambda f: f.ended)
    await asyncio.sleep(3)  # longer than the round's retries (0.2 + 0.5 + 0.4 + 1.0 s)
    assert plane.requests[("create", "pods")] == creates
    await nothing_left(plane, ref, parked=True)


@pytest.mark.parametrize("how", ["dropped", "expired"])
async def test_watches_lost_while_it_parks_and_while_parked_change_nothing(
    kube: Contract,
    plane: Plane,
    how: str,
) -> None:
    def lose() -> None:
        if how == "dropped":
            plane.drop_watches()
        else:
            plane.expire_next_watch(5)
            plane.drop_watches()

    ref, followed = await being_parked(kube)
    lose()
    await followed.until(lambda f: f.phase is P.PARKED)
    lose()
    await kube.backend.resume(ref)
    await followed.running(ref)
    assert (await execute(ref, followed, "print(x + 1)")).endswith("42\n")
    phases = followed.phases()
    said = "; ".join(f"{s.phase.value}: {s.message}" for s in followed.statuses)
    # Never read as ended (it was: 'the kernel ended', when woken before its replacement pod
    # was listed). The two informers catch up apart, so a moment of PARKING or EVICTED between
    # PARKED and ADMITTED may show; the lifecycle ignores those while parked.
    assert P.FINISHED not in phases and P.FAILED not in phases, said
    await shut_down(kube, ref)
    await nothing_left(plane, ref)


@RETRYING_FOR_A_SECOND
async def test_a_wake_the_api_server_keeps_refusing_is_said_and_a_later_one_wakes_it(
    kube: Contract,
    plane: Plane,
) -> None:
    ref, followed = await parked(kube)
    # Once its replacement is listed (before, a wake is held back for it and said later).
    group = kube.backend._groups[ref.name]
    await until(lambda: not groups.replacing(group), "its replacement pod listed")
    plane.fail_next("patch", "workloads", status=503, count=100)
    with pytest.raises(errors.ClusterUnavailable) as refused:
        await kube.backend.resume(ref)
    assert "could not wake it" in str(refused.value) or "could not resume" in str(refused.value), (
        str(refused.value)
    )
    assert followed.phase is P.PARKED
    assert workload(plane, ref.name)["spec"]["active"] is False
    plane.clear_faults()
    await kube.backend.resume(ref)
    await followed.running(ref)
    assert (await execute(ref, followed, "print(x + 1)")).endswith("42\n")
    await shut_down(kube, ref)
    await nothing_left(plane, ref)


async def test_a_parked_kernels_workload_deleted_by_an_admin_ends_it_in_a_sentence(
    kube: Contract,
    plane: Plane,
) -> None:
    ref, followed = await parked(kube)
    plane.delete(kueue.KUEUE_GROUP, "workloads", "default", ref.name)
    await followed.until(lambda f: f.phase in (P.FAILED, P.FINISHED), within=30)
    assert followed.statuses[-1].message, followed.statuses[-1]
    await kube.backend.resume(ref)  # a wake of what is gone does nothing, raises nothing
    await shut_down(kube, ref)
    await nothing_left(plane, ref)
