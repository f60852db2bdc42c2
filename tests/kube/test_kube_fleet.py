"""Servers sharing a namespace, as a JupyterHub puts every user's server in one: each holds and
is sent only its own kernels' pods and Workloads, on both planes (their Kueue copies the owner
label onto Workloads, as the README asks). Where Kueue does not copy it, a server says what to
configure and watches every Workload of the namespace, and its kernels still run."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.model import GroupPhase, GroupRef, QueuePlace
from tests.contract import Contract, Followed
from tests.kube import parking
from tests.kube.planes import FakePlane, Plane
from tests.kube.support import PVC, SERVER_TOKEN
from tests.polling import until

UNCOPIED = "Kueue does not copy the label kernel-queue.dev/owner onto the Workloads"


@contextlib.asynccontextmanager
async def _two_servers(plane: Plane, root: Path) -> AsyncIterator[tuple[Contract, Contract]]:
    """Two servers' backends (owner ids server-a and server-b) in namespace default, the
    checkpoint claim made; both closed on leaving."""
    plane.apply(PVC)
    made = []
    for owner in ("server-a", "server-b"):
        (root / owner).mkdir()
        made.append(parking.contract(parking.backend(plane, root / owner, owner_id=owner)))
    try:
        yield made[0], made[1]
    finally:
        for tested in made:
            await tested.aclose()


async def _waiting(tested: Contract, priority: str = "low") -> tuple[GroupRef, Followed]:
    """A kernel submitted and seen by its server with its Workload (queued or running)."""
    ref = await tested.backend.submit(tested.spec(priority))
    followed = tested.follow(ref)
    await followed.until(lambda f: f.phase in (GroupPhase.QUEUED, GroupPhase.RUNNING))
    return ref, followed


async def test_two_servers_in_one_namespace_each_hold_only_their_own_kernels(
    plane: Plane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _two_servers(plane, tmp_path) as (first, second):
        mine, _ = await _waiting(first)
        theirs, _ = await _waiting(second)
        for tested, ref in ((first, mine), (second, theirs)):
            backend = tested.backend
            await until(
                lambda: backend.cached("default")["workloads"] == [ref.name],  # noqa: B023
                f"{ref.name}'s Workload, and no other, in its server's cache",
                within=30,
                detail=lambda: backend.cached("default"),  # noqa: B023
            )
            assert backend.cached("default")["pods"] == [f"{ref.name}-head-0"]
        await first.backend.release(mine)
        await second.backend.release(theirs)
    assert UNCOPIED not in caplog.text


async def test_a_kernel_waiting_behind_another_servers_kernels_gets_an_estimate_from_them(
    plane: Plane, tmp_path: Path
) -> None:
    """Its server does not watch the other's Workloads: their admissions reach the estimate as
    they leave the queue ahead of it (the visibility API its positions come from)."""
    async with _two_servers(plane, tmp_path) as (mine, theirs):
        ahead, _ = await _waiting(theirs, "high")  # holds the one GPU
        waiting, followed = await _waiting(mine)
        # Three admissions seen leaving the queue ahead of it make an estimate; under load its
        # reader may not see one that came and went between two of its reads, so admissions go
        # on until the estimate comes (eight at most).
        for _ in range(8):
            after, admitted = await _waiting(theirs, "high")  # queued ahead of ours
            await followed.until(lambda f: f.statuses[-1].place == QueuePlace("user-queue", 2, 2))
            await theirs.backend.release(ahead)
            await admitted.until(lambda f: f.phase in (GroupPhase.ADMITTED, GroupPhase.RUNNING))
            ahead = after
            if await followed.reaches(lambda f: _estimate(f) is not None, within=5):
                break
        assert _estimate(followed) is not None, followed.statuses[-1]
        assert followed.phase is GroupPhase.QUEUED
        await theirs.backend.release(ahead)
        await mine.backend.release(waiting)


def _estimate(followed: Followed) -> float | None:
    waiting = followed.statuses[-1].waiting
    return waiting.estimate if waiting is not None else None


@pytest.mark.parametrize("cluster_options", [{"label_keys_to_copy": ()}])
async def test_where_kueue_copies_no_owner_label_the_server_says_so_and_watches_every_workload(
    cluster: FakeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plane = FakePlane(cluster, SERVER_TOKEN)
    async with _two_servers(plane, tmp_path) as (first, second):
        theirs, _ = await _waiting(second)
        mine, followed = await _waiting(first)
        await until(lambda: UNCOPIED in caplog.text, "the warning", within=30)
        said = next(r.getMessage() for r in caplog.records if UNCOPIED in r.getMessage())
        assert said == (
            f"{UNCOPIED} of namespace 'default': this server now watches every Workload "
            "there, and with many servers in one namespace each is sent every kernel's "
            "changes. Add kernel-queue.dev/owner to integrations.labelKeysToCopy in Kueue's "
            "Configuration (the kueue-manager-config ConfigMap) and restart Kueue's controller"
        )
        assert first.backend.cached("default")["workloads"] == sorted([mine.name, theirs.name])
        await second.backend.release(theirs)
        await followed.running(mine)  # its Workload's admission still reaches its status
        await first.backend.release(mine)


@pytest.mark.parametrize("backend_settings", [{"reap_interval": 0.3}])
async def test_an_idle_servers_reaper_reads_its_pods_from_the_informers_cache(
    kube: Contract, plane: Plane
) -> None:
    """Its sweeps list Services, Secrets and launcher ConfigMaps, never the pods it watches:
    an idle server's cost to the API server is two lists a minute fewer per namespace."""
    ref, _ = await parking.running(kube)
    reaper = kube.backend.reaper
    before, sweeps = plane.requests, reaper.sweeps
    await until(lambda: reaper.sweeps >= sweeps + 4, "three sweeps done", within=30)
    after = plane.requests
    assert after[("list", "services")] - before[("list", "services")] >= 3
    assert after[("list", "pods")] == before[("list", "pods")]
    await parking.shut_down(kube, ref)
    await parking.nothing_left(plane, ref)
