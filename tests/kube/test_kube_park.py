"""Parking on the kubernetes backend, through the `ClusterBackend` API with real kernels on both
planes: `park` sets the Workload's `spec.active: false`, Kueue stops the pod (it saves to
the checkpoint claim) and gives the GPU to the kernel waiting for it; the parked group keeps its
Workload and reports what it saved; `resume` queues it again, and once the GPU is free its new
pod restores the variables. On each Kueue release the suite serves (tests/kube/conftest.py's
SUBSET)."""

from __future__ import annotations

from kernel_queue.kube import kueue
from kernel_queue.kube.queueing.status import PARKING_MESSAGE
from kernel_queue.model import GroupPhase, StopCause
from tests.contract import Contract
from tests.kube.parking import execute, workload
from tests.kube.planes import Plane
from tests.kube.support import labelled
from tests.polling import until

P = GroupPhase


async def test_a_parked_kernel_gives_its_gpu_to_the_waiting_one_and_comes_back_restored(
    kube: Contract,
    plane: Plane,
) -> None:
    backend = kube.backend
    a = await backend.submit(kube.spec("low"))
    a_followed = kube.follow(a)
    await a_followed.running(a)
    await execute(a, a_followed, "x = 41\nwords = ['kept', 'across', 'parking']")
    b = await backend.submit(kube.spec("low"))
    b_followed = kube.follow(b)
    await b_followed.until(lambda f: f.phase is P.QUEUED)

    await backend.park(a, grace=30)
    await a_followed.until(lambda f: f.phase is P.PARKED)
    await b_followed.running(b)  # the GPU went to the waiting kernel
    parking = [s for s in a_followed.statuses if s.phase is P.PARKING]
    assert parking and parking[0].message == PARKING_MESSAGE
    assert P.EVICTED not in a_followed.phases()  # parked, not preempted
    assert a_followed.statuses[-1].message.startswith("saved 2 variables")
    parked = workload(plane, a.name)
    assert parked["spec"]["active"] is False
    assert parked["metadata"]["annotations"][kueue.PARKED_ANNOTATION] == "true"  # by us
    assert (kueue.condition(parked, kueue.EVICTED) or {}).get("reason") == "Deactivated"
    await backend.park(a, grace=30)  # parked already: nothing to do
    await backend.resume(b)  # running, not parked: nothing to do
    assert workload(plane, b.name)["spec"].get("active", True) is True

    await backend.resume(a)
    await a_followed.until(
        lambda f: (
            f.phase is P.QUEUED
            and f.statuses[-1].place is not None
            and f.statuses[-1].place.position == 1
        )
    )
    assert a_followed.statuses[-1].message.startswith("saved 2 variables")
    woken = workload(plane, a.name)
    assert kueue.PARKED_ANNOTATION not in (woken["metadata"].get("annotations") or {})
    await backend.stop(b, grace=0, cause=StopCause.SHUTDOWN)
    await backend.release(b)
    await a_followed.running(a)  # admitted once the GPU is free, its checkpoint restored
    printed = await execute(a, a_followed, "print(x + 1, *words)")
    assert printed.startswith("restored 2 variables"), printed  # the notebook is told
    assert printed.endswith("\n42 kept across parking\n"), printed

    await backend.release(a)
    await a_followed.until(lambda f: f.ended)
    await until(
        lambda: not labelled(plane, a.kernel_id) and not labelled(plane, b.kernel_id),
        "nothing of either kernel left in the cluster",
        within=30,
        detail=lambda: [labelled(plane, a.kernel_id), labelled(plane, b.kernel_id)],
    )
