"""What the kubernetes backend's caches keep of each object: no managedFields, no pod templates
in Workloads, strings shared between objects; and an informer caching (and handing its
handlers) what its transform keeps, against the fake API server over HTTP, also through a burst
of events read from the stream's buffer at once."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from kernel_queue.kube.client import caches
from kernel_queue.kube.client.api import PODS
from kernel_queue.kube.client.informer import BURST, Informer
from tests import polling
from tests.fake_api import connected

NS = "default"
MANAGED = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "managedFields": MANAGED},
        "spec": {"containers": [{"name": "kernel", "image": "registry.example/kernel:1.0"}]},
        "status": {"phase": "Pending"},
    }


WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": "kq-1", "namespace": NS, "managedFields": MANAGED},
    "spec": {
        "queueName": "user-queue",
        "podSets": [{"name": "a1b2c3d4", "count": 1, "template": pod("kq-1-head-0")}],
    },
    "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending"}]},
}


def test_a_cached_pod_keeps_all_but_its_managed_fields() -> None:
    original = pod("kq-1-head-0")
    kept = caches.slim(copy.deepcopy(original))
    assert kept == {**original, "metadata": {"name": "kq-1-head-0", "namespace": NS}}


def test_a_cached_workload_keeps_no_pod_template() -> None:
    assert caches.slim_workload(copy.deepcopy(WORKLOAD)) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "kq-1", "namespace": NS},
        "spec": {"queueName": "user-queue", "podSets": [{"name": "a1b2c3d4", "count": 1}]},
        "status": WORKLOAD["status"],
    }


def test_cached_objects_share_their_strings() -> None:
    # as two JSON decodes would give them: equal strings, distinct objects
    one, two = (caches.slim(pod("".join(["kq-", str(i)]))) for i in (1, 2))
    image = [p["spec"]["containers"][0]["image"] for p in (one, two)]
    assert image[0] == image[1] and image[0] is image[1]
    assert next(iter(one["spec"])) is next(iter(two["spec"]))


async def test_an_informer_caches_and_hands_on_what_its_transform_keeps(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        fake.store.create("", "pods", NS, pod("listed"))

        def mark(obj: dict[str, Any]) -> dict[str, Any]:
            return {**obj, "seen": True}

        informer = Informer(api, PODS, NS, transform=mark)
        handed: list[tuple[str, bool]] = []
        informer.add_handler(lambda kind, obj, old: handed.append((kind, obj.get("seen"))))
        await informer.start()
        try:
            count = BURST * 2 + 1  # more than a burst: the informer yields between them
            for i in range(count):
                fake.store.create("", "pods", NS, pod(f"watched-{i}"))

            def cached() -> int:
                return len(informer.items())

            await polling.until(lambda: cached() == count + 1, "every pod cached", every=0.01)
            assert all(obj["seen"] for obj in informer.items())
            assert handed == [("ADDED", True)] * (count + 1)  # the listed one too
        finally:
            await informer.aclose()
