"""The launcher's ConfigMap raced, faulted and found made: kernels submitted together in a fresh
namespace write one copy; a create the API server refuses is tried again by the next kernel;
another server's copy of the same bytes is taken as it is. Real client, fake API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.objects import launcher_archive
from kernel_queue.kube.objects.delivery import LauncherDelivery
from tests.fake_api import connected

NS = "default"


def copies(fake: FakeCluster) -> list[str]:
    items, _ = fake.store.list_objects("", "configmaps", NS)
    return [i["metadata"]["name"] for i in items]


async def test_kernels_submitted_together_write_one_copy(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        delivery = LauncherDelivery()
        names = await asyncio.gather(*(delivery.ensure(api, NS) for _ in range(10)))
        assert len(set(names)) == 1
        assert copies(fake) == names[:1]
        assert fake.stats.requests[("create", "configmaps")] == 1


async def test_a_refused_create_fails_that_kernel_and_the_next_one_makes_it(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api):
        delivery = LauncherDelivery()
        fake.fail_next("create", "configmaps", 500)
        with pytest.raises(errors.ClusterApiError):
            await delivery.ensure(api, NS)
        assert copies(fake) == []
        name = await delivery.ensure(api, NS)
        assert copies(fake) == [name]


async def test_another_servers_copy_of_the_same_bytes_is_taken_as_it_is(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        archive = await asyncio.to_thread(launcher_archive.current)
        await api.create(kueue.CONFIGMAPS, NS, launcher_archive.configmap(archive, NS))
        assert await LauncherDelivery().ensure(api, NS) == archive.name
        assert copies(fake) == [archive.name]
        assert fake.stats.requests[("create", "configmaps")] == 2  # ours met a 409
