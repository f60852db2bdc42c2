"""The fake cluster's injected faults over real HTTP: Retry-After, answers lost after the change
was made, and objects of the same name that someone else made."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kernel_queue_fake_cluster.apiserver import faults
from kernel_queue_fake_cluster.cluster import FakeCluster
from prerequisites import KUEUE_CRDS, skip_unless_ci

PODS = "/api/v1/namespaces/default/pods"
SECRETS = "/api/v1/namespaces/default/secrets"


@pytest.fixture
def cluster(tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[FakeCluster]:
    if not KUEUE_CRDS.exists():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS}")
    fake = FakeCluster(root_dir=tmp_path / "cluster", kubelet=False, kueue=False)
    jp_asyncio_loop.run_until_complete(fake.start())
    yield fake
    jp_asyncio_loop.run_until_complete(fake.stop())


async def request(
    cluster: FakeCluster, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body) if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.request(method, cluster.url + path, data=data, headers=headers) as response,
    ):
        return response.status, dict(response.headers), json.loads(await response.text())


def secret(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "stringData": {"key": "k"}}


async def test_a_429_says_when_to_come_back(cluster: FakeCluster) -> None:
    cluster.fail_next("list", "pods", 429)
    cluster.fail_next("list", "pods", 503, retry_after=7)
    cluster.fail_next("list", "pods", 500)
    status, headers, body = await request(cluster, "GET", PODS)
    assert (status, headers["Retry-After"], body["reason"]) == (429, "1", "TooManyRequests")
    status, headers, _ = await request(cluster, "GET", PODS)
    assert (status, headers["Retry-After"]) == (503, "7")
    status, headers, _ = await request(cluster, "GET", PODS)
    assert status == 500 and "Retry-After" not in headers
    assert (await request(cluster, "GET", PODS))[0] == 200
    assert cluster.faults_pending == 0


async def test_an_answer_lost_after_the_change_was_made(cluster: FakeCluster) -> None:
    cluster.fail_next("create", "secrets", 504, after=True)
    status, _, _ = await request(cluster, "POST", SECRETS, secret("s", mine="yes"))
    assert status == 504
    stored = cluster.store.get("", "secrets", "default", "s")
    assert stored["metadata"]["labels"] == {"mine": "yes"}  # made, though the answer was an error
    status, _, body = await request(cluster, "POST", SECRETS, secret("s", mine="yes"))
    assert (status, body["reason"]) == (409, "AlreadyExists")


async def test_a_planted_object_makes_the_next_create_meet_someone_elses(
    cluster: FakeCluster,
) -> None:
    cluster.plant_next("secrets", {"owner": "another-server"})
    status, _, body = await request(cluster, "POST", SECRETS, secret("s", mine="yes"))
    assert (status, body["reason"]) == (409, "AlreadyExists")
    stored = cluster.store.get("", "secrets", "default", "s")
    assert stored["metadata"]["labels"] == {"owner": "another-server", faults.PLANTED_LABEL: "true"}
    assert (await request(cluster, "POST", SECRETS, secret("t", mine="yes")))[0] == 201
    assert cluster.faults_pending == 0
