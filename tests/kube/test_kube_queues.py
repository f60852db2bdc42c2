"""`GET /api/kernel-queue/queues` on the kubernetes backend, end to end on both planes: the
counts come from the LocalQueue status Kueue writes, the holders and the waiting list
are this server's notebooks, another namespace's Workload in the same ClusterQueue is never
named, and a LocalQueue that cannot be read is a sentence in a 200, its kernels unaffected."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import GPU_QUOTA, gone, kube_spec, ours, settled, wait_clean

OTHER_NAMESPACE = "team-alice"
OTHER_WORKLOAD = "alice-secret-analysis"
"""Another user's Workload in the same ClusterQueue: its names must never reach the listing."""


def other_users_workload(plane: Plane) -> None:
    """A namespace of another user with its own LocalQueue on `cluster-queue`, and a Workload
    there asking for 1 GPU (Kueue admits it like any other)."""
    plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER_NAMESPACE}}])
    container = {
        "name": "notebook",
        "image": "jupyter/alice",
        "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}},
    }
    pod_set = {"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}

    def kueue(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        meta = {"name": name, "namespace": OTHER_NAMESPACE}
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": kind,
            "metadata": meta,
            "spec": spec,
        }

    plane.apply(
        [
            kueue("LocalQueue", "alice-queue", {"clusterQueue": "cluster-queue"}),
            kueue("Workload", OTHER_WORKLOAD, {"queueName": "alice-queue", "podSets": [pod_set]}),
        ]
    )


def admitted(plane: Plane, namespace: str, name: str) -> bool:
    workload = plane.get("kueue.x-k8s.io", "workloads", namespace, name) or {}
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)


async def listing(server: Server) -> tuple[str, dict[str, Any]]:
    """The endpoint's body as text (to search for names) and its queues by name."""
    response = await server.fetch("api", "kernel-queue", "queues", method="GET")
    text = response.body.decode()
    body = json.loads(text)
    assert body["backend"] == "kubernetes"
    return text, {q["name"]: q for q in body["queues"]}


async def user_queue_shows(
    server: Server, *, holders: list[str] | None = None, **expected: Any
) -> dict[str, Any]:
    """Poll the listing until `user-queue` shows `expected` and, when given, these `holders`
    (kernel ids): the fake Kueue writes the LocalQueue's status after each scheduling pass, and
    a kernel holds once this server has seen it admitted. Return that entry."""
    seen: dict[str, Any] = {}

    async def shows() -> bool:
        seen.clear()
        seen.update((await listing(server))[1].get("user-queue", {}))
        held = [row["kernel_id"] for row in seen.get("holders", [])]
        return all(seen.get(key) == value for key, value in expected.items()) and (
            holders is None or held == holders
        )

    await server.wait_for(shows, what=f"user-queue showing {expected}", detail=lambda: seen)
    return seen


def kernels(rows: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(row["kernel_id"], row["notebook"]) for row in rows]


# In conftest's SUBSET: on every release (0.14's v1beta1 status says flavorUsage, v1beta2's
# flavorsUsage; 0.19 serves both versions, 0.20 v1beta2 only).
async def test_the_queue_counts_its_own_kernels_and_never_names_another_users_workload(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    other_users_workload(plane)
    await server.wait_for(
        lambda: admitted(plane, OTHER_NAMESPACE, OTHER_WORKLOAD), what="alice's Workload admitted"
    )
    name = kube_spec(kernelspec)
    holder = await server.start_in_notebook(name, "work/first.ipynb")
    assert (await settled(server, holder))["live"]
    waiting = await server.start_in_notebook(name, "work/second.ipynb")
    await server.wait_reason(waiting, "position 1 of 1")  # alice holds the other GPU

    entry = await user_queue_shows(server, admitted=1, pending=1, holders=[holder])
    assert entry["in_use"] == {"gpus": 1}  # ours: alice's GPU is her LocalQueue's
    assert entry["capacity"] is None  # the ClusterQueue's quota is shared: not ours to say
    assert entry["error"] is None
    assert kernels(entry["holders"]) == [(holder, "work/first.ipynb")]
    assert kernels(entry["waiting"]) == [(waiting, "work/second.ipynb")]
    assert entry["waiting"][0]["position"] == 1
    text, by_name = await listing(server)
    assert set(by_name) == {"user-queue"}
    for foreign in (OTHER_WORKLOAD, OTHER_NAMESPACE, "alice"):
        assert foreign not in text

    await server.shutdown(holder)  # its GPU goes to the waiting kernel, not to alice's queue
    entry = await user_queue_shows(server, admitted=1, pending=0, holders=[waiting])
    assert entry["in_use"] == {"gpus": 1}
    assert kernels(entry["holders"]) == [(waiting, "work/second.ipynb")]
    assert entry["waiting"] == []
    assert (await server.execute(waiting, "6*7"))["data"] == "42"

    await server.shutdown(waiting)
    await gone(server, waiting)
    _, by_name = await listing(server)
    assert by_name == {}  # no kernel of this server left: no LocalQueue of its to read
    await wait_clean(server, plane, holder, waiting)
    assert admitted(plane, OTHER_NAMESPACE, OTHER_WORKLOAD)


@pytest.mark.parametrize(
    ("backend_config", "answer"),
    [
        pytest.param({"api_retry_seconds": 0.5}, "kept answering 500 InternalError", id="retried"),
        # The API's 30 s of retries would hold the listing: it waits capacity.READ_WITHIN.
        pytest.param({}, "did not answer in time", id="retrying-past-the-listings-bound"),
    ],
)
async def test_a_local_queue_the_api_keeps_failing_on_is_a_sentence_and_the_kernel_runs_on(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, answer: str
) -> None:
    kernel = await server.start_in_notebook(kube_spec(kernelspec), "work/first.ipynb")
    assert (await settled(server, kernel))["live"]
    plane.fail_next("get", "localqueues", 500, count=1000)
    text, by_name = await listing(server)  # a 200: `listing` raises on any other answer
    entry = by_name["user-queue"]
    assert entry["error"] == (
        "LocalQueue 'user-queue' in namespace 'default': could not read its status: the "
        f"Kubernetes API server {answer}, also on retries; try again in a minute, and if it "
        "keeps failing ask the cluster's admin to check the API server"
    )
    assert "injected fault" not in text and "Traceback" not in text
    assert entry["in_use"] is None and "pending" not in entry
    assert kernels(entry["holders"]) == [(kernel, "work/first.ipynb")]  # what this server knows
    plane.clear_faults()
    assert (await server.execute(kernel, "1+1"))["data"] == "2"
    entry = await user_queue_shows(server, admitted=1, pending=0, error=None)
    assert entry["in_use"] == {"gpus": 1}
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


def delete_the_local_queue(plane: Plane) -> None:
    plane.delete("kueue.x-k8s.io", "localqueues", "default", "user-queue")


def revoke_reading_local_queues(plane: Plane) -> None:
    role = plane.get("rbac.authorization.k8s.io", "roles", "default", "kernel-queue")
    assert role is not None
    rules = [r for r in role["rules"] if "localqueues" not in r["resources"]]
    plane.merge_patch(
        "rbac.authorization.k8s.io", "roles", "default", "kernel-queue", {"rules": rules}
    )


@pytest.mark.parametrize(
    ("lose", "sentence"),
    [
        pytest.param(
            delete_the_local_queue,
            "LocalQueue 'user-queue' does not exist in namespace 'default' (any more): Kueue "
            "admits none of its kernels until it is created again; ask the cluster's admin to "
            "create it (see etc/kubernetes/queues.yaml)",
            id="deleted",
        ),
        pytest.param(
            revoke_reading_local_queues,
            "LocalQueue 'user-queue' in namespace 'default': the server's service account "
            "'default/kernel-queue' may not get localqueues.kueue.x-k8s.io in namespace "
            "'default'; grant it a Role in 'default' with verb 'get' on "
            "'localqueues.kueue.x-k8s.io' bound to it (see etc/kubernetes/rbac.yaml), or use a "
            "namespace where it may",
            id="rbac-revoked",
        ),
    ],
)
async def test_a_local_queue_that_cannot_be_read_is_named_with_its_namespace_and_what_to_do(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    lose: Callable[[Plane], None],
    sentence: str,
) -> None:
    kernel = await server.start_in_notebook(kube_spec(kernelspec), "work/first.ipynb")
    assert (await settled(server, kernel))["live"]
    lose(plane)
    _, by_name = await listing(server)
    entry = by_name["user-queue"]
    assert entry["error"] == sentence
    assert entry["in_use"] is None
    assert kernels(entry["holders"]) == [(kernel, "work/first.ipynb")]
    assert (await server.execute(kernel, "1+1"))["data"] == "2"  # admitted, it runs on
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


SECOND_NAMESPACE = "team-b"


def a_second_namespace(plane: Plane) -> None:
    """`SECOND_NAMESPACE` set up as etc/kubernetes/rbac.yaml and queues.yaml set up 'default':
    the server's service account may work there, and it has its own LocalQueue 'user-queue'
    on the same ClusterQueue."""
    plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SECOND_NAMESPACE}}])
    for plural in ("roles", "rolebindings"):
        found = plane.get("rbac.authorization.k8s.io", plural, "default", "kernel-queue")
        copied = copy.deepcopy(found)
        assert copied is not None
        copied["metadata"] = {"name": "kernel-queue", "namespace": SECOND_NAMESPACE}
        plane.apply([copied])
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": SECOND_NAMESPACE},
        "spec": {"clusterQueue": "cluster-queue"},
    }
    plane.apply([local_queue])


async def test_a_kernel_in_its_kernelspecs_namespace_is_counted_in_that_namespaces_local_queue(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    # Two LocalQueues named alike, in two namespaces: each entry reads its own namespace's.
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    a_second_namespace(plane)
    here = await server.start_in_notebook(kube_spec(kernelspec), "work/here.ipynb")
    spec_there = kube_spec(kernelspec, "kube-b", namespace=SECOND_NAMESPACE)
    there = await server.start_in_notebook(spec_there, "work/there.ipynb")
    for kernel in (here, there):
        assert (await settled(server, kernel))["live"]
    seen: dict[str, Any] = {}

    async def both_counted() -> bool:
        response = await server.fetch("api", "kernel-queue", "queues", method="GET")
        seen.clear()
        seen.update({q.get("namespace"): q for q in json.loads(response.body)["queues"]})
        return set(seen) == {"default", SECOND_NAMESPACE} and all(
            (q["error"], q.get("admitted"), q["in_use"]) == (None, 1, {"gpus": 1})
            for q in seen.values()
        )

    await server.wait_for(both_counted, what="one admitted kernel in each", detail=lambda: seen)
    for namespace, kernel, notebook in (
        ("default", here, "work/here.ipynb"),
        (SECOND_NAMESPACE, there, "work/there.ipynb"),
    ):
        assert seen[namespace]["name"] == "user-queue"
        assert kernels(seen[namespace]["holders"]) == [(kernel, notebook)]

    # Its own namespace's LocalQueue gone: that entry says so, naming it; the other reads on.
    plane.delete("kueue.x-k8s.io", "localqueues", SECOND_NAMESPACE, "user-queue")
    response = await server.fetch("api", "kernel-queue", "queues", method="GET")
    by_namespace = {q["namespace"]: q for q in json.loads(response.body)["queues"]}
    assert by_namespace[SECOND_NAMESPACE]["error"].startswith(
        f"LocalQueue 'user-queue' does not exist in namespace '{SECOND_NAMESPACE}'"
    )
    assert kernels(by_namespace[SECOND_NAMESPACE]["holders"]) == [(there, "work/there.ipynb")]
    assert (by_namespace["default"]["error"], by_namespace["default"]["in_use"]) == (
        None,
        {"gpus": 1},
    )
    assert (await server.execute(there, "6*7"))["data"] == "42"  # admitted, it runs on

    for kernel in (here, there):
        await server.shutdown(kernel)
    await gone(server, here, there)
    await wait_clean(server, plane, here)
    await server.wait_for(lambda: not ours(plane), what="nothing left in either namespace")
