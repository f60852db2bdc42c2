"""The kubernetes backend's Kueue versions against the fake cluster over HTTP: what discovery
makes it speak on Kueue 0.14's CRDs and 0.19's, with the visibility API at either version or
none, the positions of a queue longer than a page, and the reaper's clean-up at the version
served."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.kueue import visibility

from kernel_queue import errors
from kernel_queue.backends import tasks
from kernel_queue.kube import kueue
from kernel_queue.kube.client.api import KubernetesApi
from kernel_queue.kube.deletion.reaper import Reaper
from kernel_queue.kube.objects import preflight
from kernel_queue.kube.queueing import kueue_versions, positions
from kernel_queue.kube.queueing.kueue_versions import KueueVersions
from kernel_queue.model import QueuePlace
from tests import polling
from tests.conftest import KUEUE_DATA, skip_unless_ci

V014, V019 = KUEUE_DATA / "v0.14" / "crds", KUEUE_DATA / "crds"
NS, QUEUE = "default", "user-queue"
LOG = logging.getLogger("test")
VISIBILITY = "localqueues/pendingworkloads"


@contextlib.asynccontextmanager
async def connected(
    tmp_path: Path, crds: Path | bool = V019, **options: Any
) -> AsyncIterator[tuple[FakeCluster, KubernetesApi]]:
    """A fake cluster of `crds` without a kubelet (its GPU quota 0, so GPU pods wait), and an
    api connected to it."""
    if isinstance(crds, Path) and not crds.is_dir():  # noqa: ASYNC240 (a stat, once)
        skip_unless_ci(f"Kueue's CRDs are not at {crds} (../shared is absent)")
    options.setdefault("kueue", crds is not False)
    async with (
        asyncio.timeout(120),
        FakeCluster(root_dir=tmp_path / "cluster", crds=crds, kubelet=False, **options) as fake,
    ):
        if fake.kueue is not None:
            fake.setup_queues(quota={"cpu": 100, "memory": "1Ti", "nvidia.com/gpu": 0})
        api = await KubernetesApi.connect(fake.kubeconfig)
        try:
            yield fake, api
        finally:
            await api.aclose()


def serving(monkeypatch: pytest.MonkeyPatch, *versions: str) -> None:
    """The fake clusters started from now on serve the visibility API at `versions` only."""
    monkeypatch.setattr(visibility, "VERSIONS", versions)


def gpu_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A one-pod group asking for a GPU: with a quota of 0 its Workload stays pending."""
    return {
        "metadata": {
            "name": name,
            "labels": {kueue.QUEUE_NAME_LABEL: QUEUE, kueue.POD_GROUP_NAME_LABEL: name}
            | (labels or {}),
            "annotations": {kueue.POD_GROUP_TOTAL_COUNT_ANNOTATION: "1"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "kernel",
                    "image": "none",
                    "resources": {"requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def pending(fake: FakeCluster, count: int) -> dict[str, QueuePlace]:
    """Create `count` waiting groups; return each Workload's place as the fake Kueue orders
    them, once all are pending."""
    for i in range(count):
        fake.store.create("", "pods", NS, gpu_pod(f"w-{i:04d}"))
    assert fake.kueue is not None
    kueue_fake = fake.kueue

    def ordered() -> list[Any]:
        return list(kueue_fake.local_queue_pending(NS, QUEUE) or [])

    await polling.until(
        lambda: len(ordered()) == count, f"{count} pending Workloads", detail=lambda: len(ordered())
    )
    return {
        item["metadata"]["name"]: QueuePlace(QUEUE, index + 1, count)
        for index, item in enumerate(ordered())
    }


# -- discovery ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("crds", "served", "chosen"),
    [
        pytest.param(V019, ("v1beta2", "v1beta1"), KueueVersions("v1beta2", "v1beta2"), id="0.19"),
        pytest.param(V014, ("v1beta1",), KueueVersions("v1beta1", "v1beta1"), id="0.14"),
        pytest.param(V019, ("v1beta1",), KueueVersions("v1beta2", "v1beta1"), id="0.19-vis-v1b1"),
        pytest.param(V014, ("v1beta2",), KueueVersions("v1beta1", "v1beta2"), id="0.14-vis-v1b2"),
        pytest.param(V019, (), KueueVersions("v1beta2", None), id="0.19-no-visibility"),
    ],
)
async def test_discovery_speaks_what_the_cluster_serves_for_objects_and_visibility_each(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crds: Path,
    served: tuple[str, ...],
    chosen: KueueVersions,
) -> None:
    serving(monkeypatch, *served)
    async with connected(tmp_path, crds) as (_, api):
        discovery = preflight.Discovery()
        assert await discovery.versions(api) == chosen
        found, _ = await api.list(chosen.local_queues, NS)  # the kinds are served at it
        assert [q["metadata"]["name"] for q in found] == [QUEUE]
        assert [q["apiVersion"] for q in found] == [f"kueue.x-k8s.io/{chosen.kueue}"]


async def test_without_kueue_discovery_says_which_releases_work_and_asks_again(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path, crds=False) as (fake, api):
        discovery = preflight.Discovery()
        for _ in range(2):
            with pytest.raises(errors.KueueNotInstalled) as caught:
                await discovery.versions(api)
        assert str(caught.value) == kueue_versions.not_served({})
        assert "(API discovery lists no kueue.x-k8s.io group)" in str(caught.value)
        assert "Kueue 0.13 or newer" in str(caught.value)
        assert discovery.reads == 2 and fake.stats.requests[("get", "/apis")] == 2
        assert await discovery.workloads(api) is None  # nothing of Kueue's to delete


async def test_discovery_is_read_once_for_every_caller_and_retries_transient_failures(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api):
        fake.fail_next("get", "/apis", 500)
        fake.fail_next("get", "/apis", 429, retry_after=0)
        discovery = preflight.Discovery()
        found = await asyncio.gather(*(discovery.versions(api) for _ in range(5)))
        assert set(found) == {KueueVersions("v1beta2", "v1beta2")}
        assert await discovery.workloads(api) == found[0].workloads
        assert discovery.reads == 1
        assert fake.stats.requests[("get", "/apis")] == 3  # two faults, then the answer


# -- positions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("crds", "served"),
    [
        pytest.param(V019, ("v1beta2",), id="0.19"),
        pytest.param(V014, ("v1beta1",), id="0.14"),
    ],
)
@pytest.mark.parametrize(("count", "requests"), [(10, 4), (9, 3), (2, 1)])
async def test_every_waiting_workload_has_its_place_past_the_first_page(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crds: Path,
    served: tuple[str, ...],
    count: int,
    requests: int,
) -> None:
    serving(monkeypatch, *served)
    async with connected(tmp_path, crds) as (fake, api):
        expected = await pending(fake, count)
        versions = await preflight.Discovery().versions(api)
        before = fake.stats.requests[("get", VISIBILITY)]
        places = await positions.read_places(
            api, NS, QUEUE, served=versions, warned=positions.Warned(), log=LOG, page=3
        )
        assert places.found == expected
        # a page of 3 per request, and no empty page read after a full last one
        assert places.pages == requests
        assert fake.stats.requests[("get", VISIBILITY)] - before == requests


async def test_at_kueues_default_page_every_place_past_a_thousand_is_read(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api):
        expected = await pending(fake, 1200)
        versions = await preflight.Discovery().versions(api)
        places = await positions.read_places(
            api, NS, QUEUE, served=versions, warned=positions.Warned(), log=LOG
        )
        assert places.pages == 2
        assert places.found == expected
        assert places.of("w-1199") == expected["w-1199"]


async def test_without_a_visibility_api_every_kernel_is_told_the_queues_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    serving(monkeypatch)
    async with connected(tmp_path, V014) as (fake, api):
        await pending(fake, 3)
        versions = await preflight.Discovery().versions(api)
        assert versions == KueueVersions("v1beta1", None)

        async def counted() -> bool:
            found = fake.store.get("kueue.x-k8s.io", "localqueues", NS, QUEUE)
            return (found.get("status") or {}).get("pendingWorkloads") == 3

        await polling.until(counted, "the LocalQueue counting 3 pending Workloads")
        warned = positions.Warned()
        for _ in range(2):
            places = await positions.read_places(
                api, NS, QUEUE, served=versions, warned=warned, log=LOG
            )
            assert places.found == {}
            assert places.of("w-0001") == QueuePlace(QUEUE, 0, 3)
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
            "queue positions of default/user-queue unavailable (the cluster serves no "
            "visibility API kernel-queue speaks); showing the queue's length"
        ]


async def test_a_reader_tells_each_kernel_its_changed_place_and_waits_an_interval_per_page(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path, V014) as (fake, api):
        expected = await pending(fake, 7)
        placed: dict[str, QueuePlace | None] = {}
        told: list[str] = []
        slept: list[float] = []
        done = asyncio.Event()

        def place(name: str, found: QueuePlace | None) -> None:
            placed[name] = found
            told.append(name)

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) == 2:  # two reads of an unchanged queue are enough here
                done.set()
                await asyncio.Event().wait()

        owned = tasks.Tasks(LOG)

        async def connect() -> KubernetesApi:
            return api

        readers = positions.Readers(
            connect=connect,
            tasks=owned,
            waiting=lambda ns, queue: [*expected, "not-created-yet"],
            place=place,
            interval=lambda: 0.5,
            log=LOG,
            page=3,
            sleep=sleep,
        )
        readers.follow(NS, QUEUE)
        readers.follow(NS, QUEUE)  # one reader per LocalQueue
        async with asyncio.timeout(30):
            await done.wait()
        await owned.aclose()
        # One missing from a read of several pages keeps its last place (none yet), since it
        # may have crossed a page boundary while they were read.
        assert placed == expected
        assert sorted(told) == sorted(expected)  # the second read changed no place: none told
        assert slept == [0.5 * 3, 0.5 * 3]  # pages of 3: 3 requests, so 3 intervals
        assert fake.stats.requests[("get", VISIBILITY)] == 6


# -- clean-up -------------------------------------------------------------------------------


@pytest.mark.parametrize("crds", [pytest.param(V014, id="0.14"), pytest.param(V019, id="0.19")])
async def test_the_reaper_deletes_a_left_workload_at_the_version_the_cluster_serves(
    tmp_path: Path, crds: Path
) -> None:
    async with connected(tmp_path, crds) as (fake, api):
        ours = {kueue.KERNEL_ID_LABEL: "k-left", kueue.OWNER_LABEL: "me"}
        fake.store.create("", "pods", NS, gpu_pod("kq-left", ours))

        def workloads() -> list[str]:
            items, _ = fake.store.list_objects("kueue.x-k8s.io", "workloads", NS)
            return [w["metadata"]["name"] for w in items]

        await polling.until(lambda: workloads() == ["kq-left"], "the group's Workload")
        reaper = Reaper(owner="me", known=set, log=LOG)
        assert await reaper.sweep(api, [NS]) == []  # seen once
        # Kueue deletes the pod of the deleted Workload (or the reaper does, if it is first)
        assert (await reaper.sweep(api, [NS]))[0] == "Workload kq-left"
        assert workloads() == []
