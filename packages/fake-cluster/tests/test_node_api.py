"""What the fake API server gives a node agent, over HTTP with the agent's own client: pod
binding, uid preconditions, status patches that keep other writers' conditions, the real
graceful deletion of pods, and requests of the cluster's own components kept out of stats and
faults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import pod_rules, resources
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.server import Server
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.node import client as node_client
from kernel_queue_fake_cluster.node.client import ApiError, Client, ClientConfig, path
from kernel_queue_fake_cluster.node.informer import Informer
from kernel_queue_fake_cluster.node.registration import (
    LEASE_GROUP,
    LEASE_NAMESPACE,
    Capacity,
    Heartbeat,
    register,
)

NS = "default"
GATE = "kueue.x-k8s.io/admission"


@contextlib.asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[Store, Server, Client]]:
    """A store with the built-in kinds and pod rules, served over HTTP, and a node client."""
    store = Store()
    resources.install(store, crds=(), namespaces=(NS,))
    pod_rules.install(store)
    server = Server(store, bookmark_interval=0.1, **options)
    await server.start()
    client = Client(ClientConfig(server.url))
    try:
        yield store, server, client
    finally:
        await client.close()
        await server.stop()
        store.close_watches()


async def until(check: Callable[[], bool], within: float = 5) -> None:
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - polling what another task changes
            await asyncio.sleep(0.01)


def pod(name: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
    }


def binding(name: str, node: str = "node-1", uid: str | None = None) -> Obj:
    meta: Obj = {"name": name, **({"uid": uid} if uid else {})}
    target = {"apiVersion": "v1", "kind": "Node", "name": node}
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": target}


def scheduled(pod: Obj) -> Obj:
    return next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")


async def test_a_binding_sets_the_node_once_and_refuses_gated_deleted_or_other_pods() -> None:
    async with serving() as (store, _, client):
        created = store.create("", "pods", NS, pod("p"))
        answer = await client.create(path("pods", NS, "p", "binding"), binding("p"))
        assert (answer["kind"], answer["status"], answer["code"]) == ("Status", "Success", 201)
        bound = store.get("", "pods", NS, "p")
        assert bound["spec"]["nodeName"] == "node-1"
        assert scheduled(bound)["status"] == "True"
        assert bound["metadata"]["uid"] == created["metadata"]["uid"]

        with pytest.raises(ApiError) as again:
            await client.create(path("pods", NS, "p", "binding"), binding("p", "node-2"))
        assert (again.value.code, again.value.reason) == (409, "Conflict")
        assert 'pod p is already assigned to node "node-1"' in again.value.message
        assert store.get("", "pods", NS, "p")["spec"]["nodeName"] == "node-1"

        store.create("", "pods", NS, pod("gated", schedulingGates=[{"name": GATE}]))
        with pytest.raises(ApiError, match=r"non-empty \.spec\.schedulingGates") as gated:
            await client.create(path("pods", NS, "gated", "binding"), binding("gated"))
        assert gated.value.code == 409
        assert scheduled(store.get("", "pods", NS, "gated"))["reason"] == "SchedulingGated"

        store.create("", "pods", NS, pod("q"))
        with pytest.raises(ApiError, match="Precondition failed: UID in precondition") as other:
            await client.create(path("pods", NS, "q", "binding"), binding("q", uid="not-q"))
        assert other.value.code == 409
        with pytest.raises(ApiError) as missing:
            await client.create(path("pods", NS, "ghost", "binding"), binding("ghost"))
        assert missing.value.code == 404


async def test_a_delete_with_a_uid_precondition_spares_another_pod_of_that_name() -> None:
    async with serving() as (store, _, client):
        first = store.create("", "pods", NS, pod("p"))
        store.delete("", "pods", NS, "p", grace_seconds=0)
        second = store.create("", "pods", NS, pod("p"))
        with pytest.raises(ApiError, match="Precondition failed") as caught:
            await client.delete(path("pods", NS, "p"), grace=0, uid=first["metadata"]["uid"])
        assert caught.value.code == 409
        assert store.get("", "pods", NS, "p")["metadata"]["uid"] == second["metadata"]["uid"]
        await client.delete(path("pods", NS, "p"), grace=0, uid=second["metadata"]["uid"])
        assert store.list_objects("", "pods", NS)[0] == []


async def test_a_status_patch_naming_another_uid_is_refused() -> None:
    async with serving() as (store, _, client):
        store.create("", "pods", NS, pod("p"))
        body = {"metadata": {"uid": "someone-else"}, "status": {"phase": "Running"}}
        with pytest.raises(ApiError, match="field is immutable") as caught:
            await client.patch(
                path("pods", NS, "p", "status"), body, node_client.STRATEGIC_MERGE_PATCH
            )
        assert caught.value.code == 422
        assert store.get("", "pods", NS, "p")["status"]["phase"] == "Pending"


async def test_a_status_patch_merges_conditions_by_type_and_keeps_foreign_ones() -> None:
    async with serving() as (store, _, client):
        created = store.create("", "pods", NS, pod("p"))
        await client.create(path("pods", NS, "p", "binding"), binding("p"))
        foreign = {"type": "TerminationTarget", "status": "True", "reason": "Preempted"}
        current = store.get("", "pods", NS, "p")
        current["status"]["conditions"].append(foreign)
        store.replace("", "pods", NS, "p", current, subresource="status")
        ready: Obj = {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
        uid = {"uid": created["metadata"]["uid"]}
        target = path("pods", NS, "p", "status")
        body = {"metadata": uid, "status": {"phase": "Running", "conditions": [ready]}}
        await client.patch(target, body, node_client.STRATEGIC_MERGE_PATCH)
        ready = {"type": "Ready", "status": "True", "reason": None, "message": None}
        await client.patch(
            target,
            {"metadata": uid, "status": {"conditions": [ready]}},
            node_client.STRATEGIC_MERGE_PATCH,
        )
        status = store.get("", "pods", NS, "p")["status"]
        by_type = {c["type"]: c for c in status["conditions"]}
        assert set(by_type) == {"PodScheduled", "TerminationTarget", "Ready"}
        assert by_type["TerminationTarget"] == foreign
        assert by_type["Ready"] == {"type": "Ready", "status": "True"}
        assert status["phase"] == "Running"


async def test_the_cluster_s_own_components_meet_no_fault_and_are_not_counted() -> None:
    agent = node_client.USER_AGENT.split("/")[0]
    async with serving(system_agents=(agent,)) as (store, server, client):
        store.create("", "pods", NS, pod("p"))
        server.fail_next("list", "pods", 500)
        server.fail_next("get", "pods", 500)
        server.expire_next_watch()
        server.latency = 5.0
        informer = Informer(client, "pods")
        informer.start()
        try:
            async with asyncio.timeout(2):
                await informer.synced.wait()
                assert (await client.get(path("pods", NS, "p")))["metadata"]["name"] == "p"
                await until(lambda: bool(server.watches.system))
        finally:
            await informer.stop()
        assert list(informer.cache) == [(NS, "p")]
        assert sum(server.stats.requests.values()) == 0
        assert (server.stats.watches, server.stats.peak_watches) == (0, 0)
        assert server.faults.pending() == 2 and server.watches.expire == 1


async def test_a_bound_pod_is_only_marked_until_its_kubelet_deletes_it_with_grace_0() -> None:
    async with serving() as (store, _, client):
        store.create(
            "", "pods", NS, pod("bound", nodeName="node-1", terminationGracePeriodSeconds=45)
        )
        marked = await client.delete(path("pods", NS, "bound"))
        assert marked["metadata"]["deletionTimestamp"]
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 45  # the pod's own
        assert store.get("", "pods", NS, "bound")["metadata"]["deletionTimestamp"]
        again = await client.delete(path("pods", NS, "bound"), grace=60)  # never longer
        assert again["metadata"]["deletionGracePeriodSeconds"] == 45
        shorter = await client.delete(path("pods", NS, "bound"), grace=5)
        assert shorter["metadata"]["deletionGracePeriodSeconds"] == 5
        uid = marked["metadata"]["uid"]
        await client.delete(path("pods", NS, "bound"), grace=0, uid=uid)  # the kubelet's
        assert store.list_objects("", "pods", NS)[0] == []

        store.create("", "pods", NS, pod("held", nodeName="node-1"))
        requested = await client.delete(path("pods", NS, "held"), grace=7)
        assert requested["metadata"]["deletionGracePeriodSeconds"] == 7

        store.create("", "pods", NS, pod("unbound"))
        store.create("", "pods", NS, pod("forced", nodeName="node-1"))
        store.create("", "pods", NS, pod("finished", nodeName="node-1"))
        done = store.get("", "pods", NS, "finished")
        done["status"]["phase"] = "Succeeded"
        store.replace("", "pods", NS, "finished", done, subresource="status")
        for name, grace in (("unbound", None), ("forced", 0), ("finished", None)):
            await client.delete(path("pods", NS, name), grace=grace)  # each goes at once
        assert [p["metadata"]["name"] for p in store.list_objects("", "pods", NS)[0]] == ["held"]

        finalized = pod("finalized", nodeName="node-1")
        finalized["metadata"]["finalizers"] = ["kueue.x-k8s.io/managed"]
        store.create("", "pods", NS, finalized)
        await client.delete(path("pods", NS, "finalized"), grace=0)
        kept = store.get("", "pods", NS, "finalized")  # grace 0, but a finalizer holds it
        assert kept["metadata"]["deletionGracePeriodSeconds"] == 0
        kept["metadata"]["finalizers"] = []
        store.replace("", "pods", NS, "finalized", kept)
        assert [p["metadata"]["name"] for p in store.list_objects("", "pods", NS)[0]] == ["held"]


async def test_an_informer_resumes_a_dropped_watch_and_lists_again_after_410() -> None:
    async with serving() as (store, server, client):
        store.create("", "secrets", NS, {"metadata": {"name": "a"}})
        informer = Informer(client, "secrets", namespace=NS)
        seen: list[tuple[str, str]] = []
        informer.add_handler(lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
        informer.start()
        try:
            await informer.synced.wait()
            assert seen == [("ADDED", "a")]
            store.create("", "secrets", NS, {"metadata": {"name": "b"}})
            await until(lambda: ("ADDED", "b") in seen)
            server.drop_watches()  # resumed from the last resourceVersion: no list
            store.create("", "secrets", NS, {"metadata": {"name": "c"}})
            await until(lambda: ("ADDED", "c") in seen)
            assert informer.lists == 1

            server.expire_next_watch()
            server.drop_watches()
            await until(lambda: informer.lists == 2)  # 410 Expired: listed again
            store.delete("", "secrets", NS, "a")
            await until(lambda: ("DELETED", "a") in seen)
            assert sorted(name for _, name in informer.cache) == ["b", "c"]
            assert await informer.fetch(NS, "ghost") is None
        finally:
            await informer.stop()


async def test_the_heartbeat_renews_the_node_lease_where_leases_are_served() -> None:
    async with serving() as (store, _, client):
        assert await Heartbeat(client, "node-1").run() is None  # not served: returns quietly
        store.register(ResourceType(LEASE_GROUP, "leases", "Lease", status_subresource=False))
        store.create("", "namespaces", None, {"metadata": {"name": LEASE_NAMESPACE}})
        await register(client, "node-1", Capacity(gpus=1))
        heartbeat = Heartbeat(client, "node-1", interval=0.05)
        task = asyncio.get_running_loop().create_task(heartbeat.run())
        try:
            await until(lambda: heartbeat.renewals >= 2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease = store.get(LEASE_GROUP, "leases", LEASE_NAMESPACE, "node-1")
        assert lease["spec"]["holderIdentity"] == "node-1"
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"
        again = await register(client, "node-1", Capacity(gpus=3))  # a restarted agent's
        assert again["status"]["capacity"]["nvidia.com/gpu"] == "3"


async def test_an_eviction_over_http_is_a_graceful_delete_of_a_bound_pod() -> None:
    """POST `pods/{name}/eviction` (policy/v1), as `kubectl drain` sends it: 201 Success, and
    the bound pod is marked for deletion with its own grace period, as the real API server
    does without a PodDisruptionBudget; an unbound one goes at once."""
    async with serving() as (store, _, client):
        store.create("", "pods", NS, pod("bound", terminationGracePeriodSeconds=20))
        await client.create(path("pods", NS, "bound", "binding"), binding("bound"))
        store.create("", "pods", NS, pod("pending"))
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction"}
        for name in ("bound", "pending"):
            body = {**eviction, "metadata": {"name": name, "namespace": NS}}
            answer = await client.create(path("pods", NS, name, "eviction"), body)
            assert (answer["kind"], answer["status"], answer["code"]) == ("Status", "Success", 201)
        evicted = store.get("", "pods", NS, "bound")
        assert evicted["metadata"]["deletionGracePeriodSeconds"] == 20
        with pytest.raises(Exception, match="not found"):
            store.get("", "pods", NS, "pending")
