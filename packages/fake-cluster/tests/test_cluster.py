"""FakeCluster as a whole: Kueue's own examples through the official client, the pytest fixture,
and a cluster in the test's own event loop."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from kernel_queue_fake_cluster.cluster import FakeCluster
from prerequisites import KUEUE_DATA, skip_unless_ci

EXAMPLES = KUEUE_DATA / "examples"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"


def _shared_or_skip() -> None:
    if not EXAMPLES.is_dir():
        skip_unless_ci(f"Kueue's examples are not at {EXAMPLES} (../shared is absent)")


def _api(cluster: FakeCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def _create(cluster: FakeCluster, doc: dict[str, Any]) -> dict[str, Any]:
    """POST a manifest document unchanged, as kubectl does (the generated client would first
    coerce it into its models, e.g. refusing `cpu: 3` as not a string)."""
    namespace = doc["metadata"].get("namespace", "default")
    if doc["apiVersion"] == "v1":
        path = f"/api/v1/namespaces/{namespace}/pods"
    else:
        plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
        scope = f"namespaces/{namespace}/" if doc["kind"] == "LocalQueue" else ""
        path = f"/apis/{doc['apiVersion']}/{scope}{plural}"
    request = urllib.request.Request(
        cluster.url + path,
        data=json.dumps(doc).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        return dict(json.loads(response.read()))


def _wait(check: Any, *, within: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_kueue_examples_load_unchanged_and_the_two_pod_group_runs(
    fake_cluster: FakeCluster,
) -> None:
    _shared_or_skip()
    api = _api(fake_cluster)
    for name in ("admin-single-clusterqueue-setup.yaml", "pods-kueue-kueue-pod-group.yaml"):
        for doc in yaml.safe_load_all((EXAMPLES / name).read_text()):
            _create(fake_cluster, doc)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def workload() -> dict[str, Any] | None:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "workloads")
        return next(iter(items["items"]), None)

    wl = _wait(workload, what="the group's Workload")
    assert wl["metadata"]["name"] == "sample-group"

    def finished() -> bool:
        conditions = (workload() or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Finished" and c["status"] == "True" for c in conditions)

    _wait(finished, within=90, what="the group to finish")
    pods = core.list_namespaced_pod(
        "default", label_selector="kueue.x-k8s.io/pod-group-name=sample-group"
    ).items
    assert sorted(p.status.phase for p in pods) == ["Succeeded", "Succeeded"]
    logs = {core.read_namespaced_pod_log(p.metadata.name, "default").strip() for p in pods}
    assert logs == {"hello world from the leader pod", "hello world from the worker pod"}
    admitted = next(c for c in finished_conditions(workload()) if c["type"] == "Admitted")
    assert admitted["status"] == "True"


def finished_conditions(wl: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((wl or {}).get("status", {}).get("conditions", []))


def test_a_cluster_in_the_test_loop_serves_the_asyncio_client(tmp_path: Path) -> None:
    from kubernetes import client as sync_client  # noqa: F401 - the aio client shares models
    from kubernetes.aio import client as aio_client
    from kubernetes.aio import config as aio_config

    async def scenario() -> list[str]:
        async with FakeCluster(root_dir=tmp_path / "cluster", kueue=False, kubelet=False) as fake:
            api = await aio_config.new_client_from_config(config_file=str(fake.kubeconfig))
            async with api:
                core = aio_client.CoreV1Api(api)
                await core.create_namespaced_config_map(
                    "default", {"metadata": {"name": "settings"}, "data": {"a": "1"}}
                )
                maps = await core.list_namespaced_config_map("default")
                return [m.metadata.name for m in maps.items]

    assert asyncio.run(scenario()) == ["settings"]
