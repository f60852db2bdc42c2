"""Parking's edges on the kubernetes backend, with real kernels on both planes: the
Workload patch meeting 500, 429, 409 and a lost reply (retried, or a sentence with the kernel
still running), a resume asked while the kernel parks, a shutdown while it parks, and a server
restarted while it is parked; each leaves nothing behind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue.model import GroupPhase, GroupRef, StopCause
from tests.contract import Contract, Followed
from tests.kube import parking
from tests.kube.parking import (
    RETRYING_FOR_A_SECOND,
    being_parked,
    execute,
    nothing_left,
    released,
    restored,
    running,
    woken,
    workload,
)
from tests.kube.planes import Plane
from tests.kube.support import RBAC, labelled
from tests.polling import until

P = GroupPhase


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({"status": 500, "count": 2}, id="500-twice"),
        pytest.param({"status": 429}, id="429-retry-after"),
        pytest.param({"status": 409}, id="409"),
        pytest.param({"status": 504, "after": True}, id="lost-reply"),
    ],
)
async def test_the_park_and_resume_patches_are_retried_through_passing_faults(
    kube: Contract,
    plane: Plane,
    fault: dict[str, Any],
) -> None:
    ref, followed = await running(kube)
    plane.fail_next("patch", "workloads", **fault)
    await kube.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is P.PARKED)
    assert workload(plane, ref.name)["spec"]["active"] is False
    plane.fail_next("patch", "workloads", **fault)
    await woken(kube, ref, followed)
    assert plane.faults_pending == 0
    await released(kube, plane, ref)


@RETRYING_FOR_A_SECOND
async def test_a_park_the_api_server_keeps_refusing_is_said_and_the_kernel_runs_on(
    kube: Contract,
    plane: Plane,
) -> None:
    ref, followed = await running(kube)
    plane.fail_next("patch", "workloads", status=503, count=100)
    with pytest.raises(errors.ClusterUnavailable) as refused:
        await kube.backend.park(ref, grace=30)
    assert str(refused.value) == (
        f"kernel {ref.kernel_id[:8]}: could not park it (patch spec.active of its Workload "
        f"{ref.name}): the Kubernetes API server kept answering 503 ServiceUnavailable, also "
        "on retries; try again in a minute, and if it keeps failing ask the cluster's admin to "
        "check the API server; it runs on"
    )
    plane.clear_faults()
    assert workload(plane, ref.name)["spec"].get("active", True) is True
    assert followed.phase is P.RUNNING
    assert await execute(ref, followed, "print(x)") == "41\n"  # nothing was lost
    await released(kube, plane, ref)


async def test_a_resume_while_parking_wakes_it_once_parked(
    kube: Contract,
    plane: Plane,
) -> None:
    ref, followed = await being_parked(kube)
    await kube.backend.resume(ref)
    await followed.until(lambda f: P.PARKED in f.phases() and f.phase is P.RUNNING)
    phases = followed.phases()
    assert phases[phases.index(P.PARKING) :][:3] == [P.PARKING, P.PARKED, P.QUEUED], phases
    assert restored(await execute(ref, followed, "print(x + 1)"), "42\n")
    await released(kube, plane, ref)


@pytest.mark.parametrize("when", [P.PARKING, P.PARKED])
async def test_a_kernel_shut_down_while_parking_or_parked_leaves_nothing(
    kube: Contract,
    plane: Plane,
    when: GroupPhase,
) -> None:
    ref, followed = await running(kube)
    await kube.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is when)
    await kube.backend.stop(ref, grace=30, cause=StopCause.SHUTDOWN)
    await kube.backend.release(ref)
    await followed.until(lambda f: f.ended)
    await nothing_left(plane, ref)
    assert not (plane.claim_dir("default", parking.CLAIM) / ref.kernel_id).exists()  # nor these


async def test_a_restarted_server_reattaches_to_a_parked_kernel_and_wakes_it(
    kube: Contract,
    plane: Plane,
    tmp_path: Path,
) -> None:
    ref, followed = await running(kube)
    (ran,) = labelled(plane, ref.kernel_id)["pods"]
    await kube.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is P.PARKED)
    saved = followed.statuses[-1].message
    assert saved.startswith("saved 1 variable"), saved

    # The pod that ran is replaced by a gated one: only the replacement says what was saved.
    def replaced() -> bool:
        pods = labelled(plane, ref.kernel_id).get("pods", [])
        return len(pods) == 1 and ran not in pods

    await until(
        replaced, "the pod that ran replaced", detail=lambda: labelled(plane, ref.kernel_id)
    )
    await kube.aclose()  # the server stops; the cluster keeps the parked kernel

    again = parking.contract(parking.backend(plane, tmp_path))
    try:
        reattached = again.follow(GroupRef.from_dict(ref.to_dict()))
        await reattached.until(lambda f: f.phase is not None)
        assert (reattached.phase, reattached.statuses[-1].message) == (P.PARKED, saved)
        await woken(again, ref, reattached)
        await again.backend.release(ref)
        await reattached.until(lambda f: f.ended)
    finally:
        await again.aclose()
    await nothing_left(plane, ref)


async def test_a_parked_kernel_ended_has_its_checkpoints_deleted_or_says_what_stays(
    kube: Contract,
    plane: Plane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No kernel process is left to delete a parked kernel's checkpoints: a short cleanup pod
    does, outside Kueue; when it cannot run, the log names the directory that stays."""
    claim = plane.claim_dir("default", parking.CLAIM)
    cleaned = await running(kube)
    refused = await kube.backend.submit(kube.spec("low")), None
    refused = refused[0], kube.follow(refused[0])  # it runs once the first is parked
    for ref, followed in (cleaned, refused):
        await followed.running(ref)
        await kube.backend.park(ref, grace=30)
        await followed.until(lambda f: f.phase is P.PARKED)
        assert (claim / ref.kernel_id).is_dir()

    await kube.backend.stop(cleaned[0], grace=30, cause=StopCause.SHUTDOWN)
    await kube.backend.release(cleaned[0])
    assert not (claim / cleaned[0].kernel_id).exists()

    plane.fail_next("create", "pods", status=403)
    await kube.backend.stop(refused[0], grace=30, cause=StopCause.SHUTDOWN)
    await kube.backend.release(refused[0])
    assert (claim / refused[0].kernel_id).is_dir()
    stays = [r.getMessage() for r in caplog.records if "stay" in r.getMessage()]
    kernel = refused[0].kernel_id
    assert stays == [
        f"kernel {kernel[:8]}: its checkpoints (directory {kernel!r} of claim "
        f"{parking.CLAIM!r}) stay: the cleanup pod {refused[0].name}-cleanup could not run "
        "(injected fault: create pods answered 403); delete that directory by hand"
    ], stays
    await nothing_left(plane, cleaned[0], refused[0])


def _without_patch() -> list[dict[str, Any]]:
    """etc/kubernetes/rbac.yaml as it was before parking: no `patch` on workloads."""
    policy = copy.deepcopy([doc for doc in RBAC if doc["apiVersion"].startswith("rbac.")])
    for doc in policy:
        for rule in doc.get("rules") or []:
            if "workloads" in rule.get("resources", []):
                rule["verbs"] = [v for v in rule["verbs"] if v != "patch"]
    return policy


async def test_a_role_without_patch_on_workloads_refuses_parking_in_a_sentence(
    kube: Contract,
    plane: Plane,
) -> None:
    plane.apply(_without_patch())
    ref, followed = await running(kube)
    with pytest.raises(errors.ClusterForbidden) as refused:
        await kube.backend.park(ref, grace=30)
    assert str(refused.value) == (
        f"kernel {ref.kernel_id[:8]}: the server's service account 'default/kernel-queue' may "
        "not patch workloads.kueue.x-k8s.io in namespace 'default'; grant it a Role in "
        "'default' with verb 'patch' on 'workloads.kueue.x-k8s.io' bound to it (see "
        "etc/kubernetes/rbac.yaml), or use a namespace where it may; it runs on"
    )
    assert followed.phase is P.RUNNING
    await released(kube, plane, ref)


@RETRYING_FOR_A_SECOND
async def test_a_wake_asked_while_parking_that_the_api_server_refuses_is_said_while_parked(
    kube: Contract,
    plane: Plane,
) -> None:
    ref, followed = await being_parked(kube)
    plane.fail_next("patch", "workloads", status=503, count=100)
    await kube.backend.resume(ref)  # taken: it wakes once parked

    def refused(f: Followed) -> bool:
        return f.phase is P.PARKED and "could not wake it" in f.statuses[-1].message

    await followed.until(refused)
    assert followed.statuses[-1].message.endswith("; it stays parked")
    plane.clear_faults()
    await kube.backend.resume(ref)  # asked again, it wakes
    await followed.running(ref)
    assert restored(await execute(ref, followed, "print(x + 1)"), "42\n")
    await released(kube, plane, ref)
