"""The fake API server over real HTTP: the official client (sync and `kubernetes.aio`), raw
requests and kubectl against verbs, watches, errors, discovery, extra routes and faults."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes.aio.client
import kubernetes.aio.watch
import kubernetes.client
import kubernetes.watch
import pytest

from kernel_queue_fake_cluster.apiserver import pod_rules, resources
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import Server
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import visibility
from prerequisites import KUEUE_DATA

API_ERRORS = (kubernetes.client.ApiException, kubernetes.aio.client.ApiException)
KUEUE = ("kueue.x-k8s.io", "v1beta2")
EXAMPLES = KUEUE_DATA / "examples"
GATE = "kueue.x-k8s.io/admission"


def make_server(loop: asyncio.AbstractEventLoop, **kwargs: Any) -> Iterator[Server]:
    store = Store(history=kwargs.pop("history", 1000))
    resources.install(store)
    server = Server(store, bookmark_interval=kwargs.pop("bookmark_interval", 0.1), **kwargs)
    loop.run_until_complete(server.start())
    yield server
    loop.run_until_complete(server.stop())


@pytest.fixture
def cluster(jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[Server]:
    """A started server with the built-in kinds, Kueue's CRDs and `default`."""
    yield from make_server(jp_asyncio_loop)


@pytest.fixture
def short_history(jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[Server]:
    """A server whose watch history keeps only three events."""
    yield from make_server(jp_asyncio_loop, history=3)


class Client:
    """The official client, sync (each call in a thread so the loop keeps serving) or aio."""

    def __init__(self, url: str, flavour: str) -> None:
        self.flavour = flavour
        module: Any = kubernetes.client if flavour == "sync" else kubernetes.aio.client
        self.api = module.ApiClient(module.Configuration(host=url))
        self.core = module.CoreV1Api(self.api)
        self.custom = module.CustomObjectsApi(self.api)

    async def __call__(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async with asyncio.timeout(10):
            if self.flavour == "sync":
                return await asyncio.to_thread(method, *args, **kwargs)
            return await method(*args, **kwargs)

    async def close(self) -> None:
        if self.flavour == "sync":
            self.api.close()
        else:
            await self.api.close()


async def fetch(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One raw request; the JSON (or text) reply."""
    data = json.dumps(body) if body is not None and not isinstance(body, str) else body
    if headers is None and data is not None:
        headers = {"Content-Type": "application/json"}
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.request(method, url, data=data, headers=headers) as response,
    ):
        text = await response.text()
        is_json = response.content_type == "application/json" and text
        return response.status, json.loads(text) if is_json else text


async def watch_lines(url: str, within: float = 5) -> list[Obj]:
    """A raw watch request read to its end."""
    async with (
        asyncio.timeout(within),
        aiohttp.ClientSession() as http,
        http.get(url) as response,
    ):
        assert response.status == 200
        return [json.loads(line) async for line in response.content if line.strip()]


async def eventually(check: Callable[[], bool], within: float = 5) -> None:
    for _ in range(int(within / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"not true within {within} s")


def pod(name: str, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulingGates": [{"name": GATE}], "containers": [{"name": "c", "image": "i"}]},
    }


def workload(name: str) -> Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    pod_set = {"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queueName": "user-queue", "podSets": [pod_set]},
    }


CLIENTS = [pytest.param("sync", id="sync-client"), pytest.param("aio", id="aio-client")]


# -- CRUD with the official client ---------------------------------------------------------


@pytest.mark.parametrize("flavour", CLIENTS)
async def test_the_official_client_creates_reads_replaces_patches_and_deletes_pods(
    cluster: Server, flavour: str
) -> None:
    client = Client(cluster.url, flavour)
    try:
        created = await client(client.core.create_namespaced_pod, "default", pod("p", app="k"))
        assert created.metadata.resource_version and created.metadata.uid
        fetched = await client(client.core.read_namespaced_pod, "p", "default")
        assert fetched.spec.scheduling_gates[0].name == GATE
        listed = await client(client.core.list_namespaced_pod, "default", label_selector="app=k")
        assert [p.metadata.name for p in listed.items] == ["p"]
        assert listed.metadata.resource_version == str(cluster.store.resource_version)

        body = cluster.store.get("", "pods", "default", "p")
        body["metadata"]["annotations"] = {"note": "replaced"}
        replaced = await client(client.core.replace_namespaced_pod, "p", "default", body)
        assert replaced.metadata.annotations == {"note": "replaced"}

        smp = {"metadata": {"labels": {"tier": "gpu"}}, "spec": {"schedulingGates": []}}
        patched = await client(client.core.patch_namespaced_pod, "p", "default", smp)
        assert patched.metadata.labels == {"app": "k", "tier": "gpu"}
        assert [g.name for g in patched.spec.scheduling_gates] == [GATE]  # SMP keeps the gate
        ungate = [{"op": "remove", "path": "/spec/schedulingGates"}]
        ungated = await client(client.core.patch_namespaced_pod, "p", "default", ungate)
        assert ungated.spec.scheduling_gates is None

        await client(client.core.delete_namespaced_pod, "p", "default")
        with pytest.raises(API_ERRORS) as caught:
            await client(client.core.read_namespaced_pod, "p", "default")
        assert caught.value.status == 404
    finally:
        await client.close()


@pytest.mark.parametrize("flavour", CLIENTS)
async def test_the_official_client_creates_reads_and_deletes_secrets(
    cluster: Server, flavour: str
) -> None:
    client = Client(cluster.url, flavour)
    try:
        body = {"metadata": {"name": "conn"}, "data": {"key": "MQ=="}}
        await client(client.core.create_namespaced_secret, "default", body)
        secret = await client(client.core.read_namespaced_secret, "conn", "default")
        assert secret.data == {"key": "MQ=="}
        patched = await client(
            client.core.patch_namespaced_secret, "conn", "default", {"data": {"b": "Mg=="}}
        )
        assert patched.data == {"key": "MQ==", "b": "Mg=="}
        await client(client.core.delete_namespaced_secret, "conn", "default")
        assert cluster.store.list_objects("", "secrets", "default")[0] == []
    finally:
        await client.close()


async def test_a_post_without_content_type_is_taken_as_json(cluster: Server) -> None:
    async with asyncio.timeout(10), aiohttp.ClientSession() as http:
        url = f"{cluster.url}/api/v1/namespaces/default/configmaps"
        body = json.dumps({"metadata": {"name": "cm"}, "data": {"a": "b"}}).encode()
        headers = {"Content-Type": ""}
        async with http.post(url, data=body, headers=headers, skip_auto_headers=["Content-Type"]):
            pass
    assert cluster.store.get("", "configmaps", "default", "cm")["data"] == {"a": "b"}


# -- custom resources -------------------------------------------------------------------


async def test_kueue_objects_are_served_at_v1beta2_and_v1beta1_alike(cluster: Server) -> None:
    client = Client(cluster.url, "aio")
    custom = client.custom
    try:
        cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue"}
        cq |= {"metadata": {"name": "cq"}, "spec": {"namespaceSelector": {}}}
        await client(custom.create_cluster_custom_object, *KUEUE, "clusterqueues", cq)
        lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue"}
        lq |= {"metadata": {"name": "user-queue"}, "spec": {"clusterQueue": "cq"}}
        await client(custom.create_namespaced_custom_object, *KUEUE, "default", "localqueues", lq)
        created = await client(
            custom.create_namespaced_custom_object, *KUEUE, "default", "workloads", workload("w")
        )
        assert created["spec"]["active"] is True  # the schema's default

        old = await client(
            custom.get_namespaced_custom_object,
            "kueue.x-k8s.io",
            "v1beta1",
            "default",
            "workloads",
            "w",
        )
        assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        assert old["metadata"]["uid"] == created["metadata"]["uid"]
        queues = await client(custom.list_cluster_custom_object, *KUEUE, "clusterqueues")
        assert queues["kind"] == "ClusterQueueList" and queues["metadata"]["resourceVersion"]

        lq_now = await client(
            custom.get_namespaced_custom_object, *KUEUE, "default", "localqueues", "user-queue"
        )
        lq_now["metadata"]["labels"] = {"team": "a"}
        replaced = await client(
            custom.replace_namespaced_custom_object,
            *KUEUE,
            "default",
            "localqueues",
            "user-queue",
            lq_now,
        )
        assert replaced["metadata"]["labels"] == {"team": "a"}
        patched = await client(
            custom.patch_cluster_custom_object,
            *KUEUE,
            "clusterqueues",
            "cq",
            {"spec": {"queueingStrategy": "StrictFIFO"}},
        )
        assert patched["spec"]["queueingStrategy"] == "StrictFIFO"
        assert patched["metadata"]["generation"] == 2

        for args in (("default", "workloads", "w"), ("default", "localqueues", "user-queue")):
            await client(custom.delete_namespaced_custom_object, *KUEUE, *args)
        await client(custom.delete_cluster_custom_object, *KUEUE, "clusterqueues", "cq")
        assert list(cluster.store.objects("kueue.x-k8s.io", "workloads")) == []
    finally:
        await client.close()


async def test_a_status_merge_patch_on_a_workload_changes_only_its_status(
    cluster: Server,
) -> None:
    cluster.store.create("kueue.x-k8s.io", "workloads", "default", workload("w"))
    client = Client(cluster.url, "sync")
    try:
        condition = {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "QuotaReserved",
            "message": "Quota reserved in ClusterQueue cq",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        body = {"status": {"conditions": [condition]}, "spec": {"active": False}}
        patched = await client(
            client.custom.patch_namespaced_custom_object_status,
            *KUEUE,
            "default",
            "workloads",
            "w",
            body,
        )
        assert patched["status"]["conditions"][0]["type"] == "QuotaReserved"
        assert patched["spec"]["active"] is True
        assert patched["metadata"]["generation"] == 1
    finally:
        await client.close()


async def test_a_strategic_merge_patch_on_a_custom_object_is_415(cluster: Server) -> None:
    cluster.store.create("kueue.x-k8s.io", "workloads", "default", workload("w"))
    client = Client(cluster.url, "aio")
    try:
        with pytest.raises(API_ERRORS) as caught:
            await client(
                client.custom.patch_namespaced_custom_object,
                *KUEUE,
                "default",
                "workloads",
                "w",
                {"metadata": {"labels": {"a": "b"}}},
                _content_type="application/strategic-merge-patch+json",
            )
        assert caught.value.status == 415
        assert json.loads(caught.value.body)["reason"] == "UnsupportedMediaType"
    finally:
        await client.close()


async def test_a_cluster_queue_violating_its_schema_is_422_with_the_field_path(
    cluster: Server,
) -> None:
    quota = {"name": "cpu", "nominalQuota": "lots"}
    flavor = {"name": "default-flavor", "resources": [quota]}
    spec = {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [flavor]}]}
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue"}
    body |= {"metadata": {"name": "cq"}, "spec": spec}
    status, reply = await fetch(
        "POST", f"{cluster.url}/apis/kueue.x-k8s.io/v1beta2/clusterqueues", body
    )
    assert (status, reply["kind"], reply["reason"]) == (422, "Status", "Invalid")
    path = "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"
    assert [cause["field"] for cause in reply["details"]["causes"]] == [path]
    assert reply["message"].startswith(f'ClusterQueue "cq" is invalid: {path}: Invalid value')


# -- watches ------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", CLIENTS)
async def test_a_watch_with_timeout_seconds_ends_after_that_time(
    cluster: Server, flavour: str
) -> None:
    cluster.store.create("", "pods", "default", pod("a"))
    client = Client(cluster.url, flavour)

    async def watch(seconds: int) -> list[tuple[str, str]]:
        if flavour == "sync":
            stream = kubernetes.watch.Watch().stream
            events = await client(
                lambda: list(
                    stream(client.core.list_namespaced_pod, "default", timeout_seconds=seconds)
                )
            )
        else:
            async with asyncio.timeout(10), kubernetes.aio.watch.Watch() as watcher:
                watched = watcher.stream(
                    client.core.list_namespaced_pod, "default", timeout_seconds=seconds
                )
                events = [event async for event in watched]
        return [(e["type"], e["object"].metadata.name) for e in events]

    loop = asyncio.get_running_loop()
    try:
        short, long = loop.create_task(watch(1)), loop.create_task(watch(2))
        await eventually(lambda: cluster.stats.watches == 2)
        cluster.store.create("", "pods", "default", pod("b"))
        seen_by_short = await short  # it ends by itself, first
        assert cluster.stats.watches == 1  # the longer one is still open
        cluster.store.create("", "pods", "default", pod("c"))
        seen_by_long = await long
    finally:
        await client.close()
    # Each stream ended by itself when its own timeoutSeconds had passed: the shorter one first,
    # while the longer one was still open for what came after. Nothing closed or dropped them.
    assert seen_by_short == [("ADDED", "a"), ("ADDED", "b")]
    assert seen_by_long == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    assert cluster.stats.watches == 0


async def test_a_watch_from_a_list_resource_version_sees_only_later_changes(
    cluster: Server,
) -> None:
    client = Client(cluster.url, "aio")
    try:
        await client(client.core.create_namespaced_pod, "default", pod("before"))
        listed = await client(client.core.list_namespaced_pod, "default")
        await client(client.core.create_namespaced_pod, "default", pod("after"))
        await client(client.core.delete_namespaced_pod, "before", "default")
        async with asyncio.timeout(10), kubernetes.aio.watch.Watch() as watch:
            watched = watch.stream(
                client.core.list_namespaced_pod,
                "default",
                resource_version=listed.metadata.resource_version,
                timeout_seconds=1,
            )
            seen = [(e["type"], e["object"].metadata.name) async for e in watched]
    finally:
        await client.close()
    assert seen == [("ADDED", "after"), ("DELETED", "before")]


async def test_a_watch_from_an_expired_version_gets_one_410_error_line(
    short_history: Server,
) -> None:
    store = short_history.store
    since = store.resource_version
    for index in range(5):
        store.create("", "secrets", "default", {"metadata": {"name": f"s{index}"}})
    url = f"{short_history.url}/api/v1/namespaces/default/secrets?watch=1&resourceVersion={since}"
    lines = await watch_lines(url)
    assert [line["type"] for line in lines] == ["ERROR"]
    assert lines[0]["object"]["kind"] == "Status"
    assert (lines[0]["object"]["code"], lines[0]["object"]["reason"]) == (410, "Expired")

    client = Client(short_history.url, "aio")
    try:
        with pytest.raises(API_ERRORS) as caught:
            async with asyncio.timeout(10), kubernetes.aio.watch.Watch() as watch:
                watched = watch.stream(
                    client.core.list_namespaced_secret,
                    "default",
                    resource_version=str(since),
                    timeout_seconds=5,
                )
                [event async for event in watched]
        assert caught.value.status == 410
        sync = Client(short_history.url, "sync")
        stream = kubernetes.watch.Watch().stream  # retries a 410 once, then raises
        with pytest.raises(API_ERRORS) as caught:
            await sync(
                lambda: list(
                    stream(sync.core.list_namespaced_secret, "default", resource_version=str(since))
                )
            )
        assert caught.value.status == 410
        await sync.close()
    finally:
        await client.close()


async def test_an_idle_watch_with_bookmarks_gets_bookmark_events(cluster: Server) -> None:
    cluster.store.create("", "pods", "default", pod("a"))
    rv = str(cluster.store.resource_version)
    client = Client(cluster.url, "aio")
    try:
        async with asyncio.timeout(10), kubernetes.aio.watch.Watch() as watch:
            watched = watch.stream(
                client.core.list_namespaced_pod,
                "default",
                allow_watch_bookmarks=True,
                timeout_seconds=1,
            )
            events = [event async for event in watched]
    finally:
        await client.close()
    assert events[0]["type"] == "ADDED"
    bookmarks = [e["raw_object"] for e in events[1:]]
    assert len(bookmarks) >= 3  # every 0.1 s while idle, for 1 s
    expected = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    assert all(bookmark == expected for bookmark in bookmarks)
    assert {e["type"] for e in events[1:]} == {"BOOKMARK"}


async def test_a_watch_on_one_object_path_filters_by_name(cluster: Server) -> None:
    cluster.store.create("", "pods", "default", pod("a"))
    cluster.store.create("", "pods", "default", pod("b"))
    url = f"{cluster.url}/api/v1/namespaces/default/pods/b?watch=true&timeoutSeconds=1"
    lines = await watch_lines(url)
    assert [(line["type"], line["object"]["metadata"]["name"]) for line in lines] == [
        ("ADDED", "b")
    ]


# -- selectors and collections -------------------------------------------------------------


async def test_label_and_field_selectors_filter_lists_and_watches(cluster: Server) -> None:
    for name, tier in (("a", "gpu"), ("b", "cpu"), ("c", "gpu")):
        cluster.store.create("", "pods", "default", pod(name, tier=tier))
    client = Client(cluster.url, "aio")
    try:
        gpus = await client(client.core.list_namespaced_pod, "default", label_selector="tier=gpu")
        assert [p.metadata.name for p in gpus.items] == ["a", "c"]
        named = await client(
            client.core.list_pod_for_all_namespaces,
            field_selector="metadata.name!=a",
            label_selector="tier in (gpu,cpu)",
        )
        assert [p.metadata.name for p in named.items] == ["b", "c"]
        with pytest.raises(API_ERRORS) as caught:
            await client(client.core.list_namespaced_pod, "default", label_selector="tier in (")
        assert caught.value.status == 400
        async with asyncio.timeout(10), kubernetes.aio.watch.Watch() as watch:
            watched = watch.stream(
                client.core.list_namespaced_pod,
                "default",
                label_selector="tier=cpu",
                timeout_seconds=1,
            )
            seen = []
            async for event in watched:
                seen.append((event["type"], event["object"].metadata.name))
                if len(seen) == 1:  # relabel a: it enters the selection
                    label = {"metadata": {"labels": {"tier": "cpu"}}}
                    await client(client.core.patch_namespaced_pod, "a", "default", label)
    finally:
        await client.close()
    assert seen == [("ADDED", "b"), ("ADDED", "a")]


async def test_deletecollection_deletes_only_the_selected_objects(cluster: Server) -> None:
    for name, app in (("a", "kernel"), ("b", "kernel"), ("c", "other")):
        body = {"metadata": {"name": name, "labels": {"app": app}}}
        cluster.store.create("", "secrets", "default", body)
    client = Client(cluster.url, "sync")
    try:
        await client(
            client.core.delete_collection_namespaced_secret, "default", label_selector="app=kernel"
        )
    finally:
        await client.close()
    remaining = cluster.store.list_objects("", "secrets", "default")[0]
    assert [s["metadata"]["name"] for s in remaining] == ["c"]


async def test_delete_options_carry_the_grace_period(cluster: Server) -> None:
    pod_rules.install(cluster.store)
    for name in ("a", "b"):
        bound = pod(name)
        bound["spec"] = {"nodeName": "node-1", "containers": bound["spec"]["containers"]}
        cluster.store.create("", "pods", "default", bound)
    client = Client(cluster.url, "sync")
    try:
        options = kubernetes.client.V1DeleteOptions(
            grace_period_seconds=7, propagation_policy="Background"
        )
        terminating = await client(client.core.delete_namespaced_pod, "a", "default", body=options)
        assert terminating.metadata.deletion_timestamp is not None
        assert terminating.metadata.deletion_grace_period_seconds == 7
        await client(client.core.delete_namespaced_pod, "b", "default", grace_period_seconds=0)
    finally:
        await client.close()
    pods = cluster.store.list_objects("", "pods", "default")[0]
    assert [p["metadata"]["name"] for p in pods] == ["a"]


# -- errors, discovery, extra routes ------------------------------------------------------


NS = "/api/v1/namespaces/default"
TAKEN, STALE = {"metadata": {"name": "taken"}}, {"metadata": {"resourceVersion": "1"}}
ELSEWHERE, RENAMED = {"metadata": {"namespace": "x"}}, {"metadata": {"name": "x"}}
ERROR_CASES = [  # id, method, path, body, code, reason
    ("missing-object", "GET", f"{NS}/pods/nope", None, 404, "NotFound"),
    ("unknown-plural", "GET", f"{NS}/gizmos", None, 404, "NotFound"),
    ("unknown-group", "GET", "/apis/example.com/v1/gizmos", None, 404, "NotFound"),
    ("unknown-version", "GET", "/apis/kueue.x-k8s.io/v1alpha9/workloads", None, 404, "NotFound"),
    ("cluster-kind-in-namespace", "GET", f"{NS}/namespaces", None, 404, "NotFound"),
    ("already-exists", "POST", f"{NS}/secrets", TAKEN, 409, "AlreadyExists"),
    ("stale-put", "PUT", f"{NS}/secrets/taken", STALE, 409, "Conflict"),
    ("bad-json", "POST", f"{NS}/secrets", "{not json", 400, "BadRequest"),
    ("namespace-mismatch", "POST", f"{NS}/secrets", ELSEWHERE, 400, "BadRequest"),
    ("name-mismatch", "PUT", f"{NS}/secrets/taken", RENAMED, 400, "BadRequest"),
    ("bad-watch-flag", "GET", f"{NS}/secrets?watch=maybe", None, 400, "BadRequest"),
    ("dry-run", "POST", f"{NS}/secrets?dryRun=All", {}, 400, "BadRequest"),
    ("put-collection", "PUT", f"{NS}/secrets", {}, 405, "MethodNotAllowed"),
    ("post-name", "POST", f"{NS}/secrets/taken", {}, 405, "MethodNotAllowed"),
    ("post-all-namespaces", "POST", "/api/v1/pods", {}, 405, "MethodNotAllowed"),
    ("delete-discovery", "DELETE", "/apis", None, 405, "MethodNotAllowed"),
    ("patch-as-json", "PATCH", f"{NS}/secrets/taken", {}, 415, "UnsupportedMediaType"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "reason"),
    [pytest.param(*case, id=name) for name, *case in ERROR_CASES],
)
async def test_errors_are_status_bodies(
    cluster: Server, method: str, path: str, body: Any, code: int, reason: str
) -> None:
    cluster.store.create("", "secrets", "default", {"metadata": {"name": "taken"}})
    headers = {"Content-Type": "application/json"}
    status, reply = await fetch(method, cluster.url + path, body, headers)
    assert (status, reply["kind"], reply["status"]) == (code, "Status", "Failure")
    assert (reply["code"], reply["reason"]) == (code, reason)


async def test_not_found_and_already_exists_name_the_object(cluster: Server) -> None:
    client = Client(cluster.url, "aio")
    try:
        with pytest.raises(API_ERRORS) as caught:
            await client(client.core.read_namespaced_pod, "nope", "default")
        assert json.loads(caught.value.body)["message"] == 'pods "nope" not found'
        await client(client.core.create_namespaced_pod, "default", pod("p"))
        with pytest.raises(API_ERRORS) as caught:
            await client(client.core.create_namespaced_pod, "default", pod("p"))
        status = json.loads(caught.value.body)
        assert (caught.value.status, status["reason"]) == (409, "AlreadyExists")
        assert status["message"] == 'pods "p" already exists'
    finally:
        await client.close()


async def test_discovery_lists_core_kueue_and_rbac_resources(cluster: Server) -> None:
    for path in ("/version", "/version/"):
        status, version = await fetch("GET", cluster.url + path)
        assert status == 200 and version["major"] == "1"
    _, api = await fetch("GET", cluster.url + "/api")
    assert api["versions"] == ["v1"]
    _, core = await fetch("GET", cluster.url + "/api/v1")
    names = {r["name"]: r for r in core["resources"]}
    assert {"pods", "pods/status", "secrets", "services", "namespaces", "events"} <= set(names)
    assert "watch" in names["pods"]["verbs"] and names["namespaces"]["namespaced"] is False
    _, groups = await fetch("GET", cluster.url + "/apis")
    kueue = next(g for g in groups["groups"] if g["name"] == "kueue.x-k8s.io")
    assert [v["version"] for v in kueue["versions"]] == ["v1beta2", "v1beta1"]
    assert kueue["preferredVersion"]["version"] == "v1beta2"
    _, old = await fetch("GET", cluster.url + "/apis/kueue.x-k8s.io/v1beta1")
    workloads = next(r for r in old["resources"] if r["name"] == "workloads")
    assert (workloads["kind"], workloads["namespaced"]) == ("Workload", True)
    status, _ = await fetch("GET", cluster.url + "/apis/example.com/v1")
    assert status == 404


async def test_pod_logs_are_routed_to_the_log_provider(cluster: Server) -> None:
    cluster.store.create("", "pods", "default", pod("p"))
    cluster.store.create("", "pods", "default", pod("silent"))
    client = Client(cluster.url, "aio")
    try:
        with pytest.raises(API_ERRORS) as caught:  # no provider yet
            await client(client.core.read_namespaced_pod_log, "p", "default")
        assert caught.value.status == 404
        asked: list[tuple[str, str, str | None, int | None]] = []

        def logs(namespace: str, name: str, container: str | None, tail: int | None) -> str | None:
            asked.append((namespace, name, container, tail))
            return None if name == "silent" else "line 1\nline 2\n"

        cluster.serve_logs(logs)
        text = await client(
            client.core.read_namespaced_pod_log, "p", "default", container="c", tail_lines=2
        )
        assert text == "line 1\nline 2\n"
        assert asked == [("default", "p", "c", 2)]
        for name in ("silent", "missing"):
            with pytest.raises(API_ERRORS) as caught:
                await client(client.core.read_namespaced_pod_log, name, "default")
            assert caught.value.status == 404
    finally:
        await client.close()


async def test_pending_workloads_are_served_through_the_visibility_routes(
    cluster: Server,
) -> None:
    items = [{"metadata": {"name": f"w{i}", "namespace": "default"}} for i in range(3)]

    def by_local_queue(namespace: str, name: str) -> list[Obj] | None:
        return items if (namespace, name) == ("default", "user-queue") else None

    visibility.serve(cluster, by_local_queue, lambda name: items[:1] if name == "cq" else None)
    base = f"{cluster.url}/apis/visibility.kueue.x-k8s.io/v1beta2"
    status, summary = await fetch(
        "GET", f"{base}/namespaces/default/localqueues/user-queue/pendingworkloads?offset=1"
    )
    assert (status, summary["kind"]) == (200, "PendingWorkloadsSummary")
    assert [i["metadata"]["name"] for i in summary["items"]] == ["w1", "w2"]
    assert summary["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta2"
    old = base.replace("v1beta2", "v1beta1")  # Kueue up to 0.19 serves the same body at v1beta1
    _, summary = await fetch(
        "GET", f"{old}/namespaces/default/localqueues/user-queue/pendingworkloads?limit=1"
    )
    assert summary["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
    assert [i["metadata"]["name"] for i in summary["items"]] == ["w0"]
    _, summary = await fetch("GET", f"{base}/clusterqueues/cq/pendingworkloads?limit=5")
    assert [i["metadata"]["name"] for i in summary["items"]] == ["w0"]
    status, missing = await fetch("GET", f"{base}/clusterqueues/nope/pendingworkloads")
    assert (status, missing["message"]) == (
        404,
        'clusterqueue.visibility.kueue.x-k8s.io "nope" not found',
    )
    status, _ = await fetch("POST", f"{base}/clusterqueues/cq/pendingworkloads", {})
    assert status == 405
    _, groups = await fetch("GET", cluster.url + "/apis")
    assert "visibility.kueue.x-k8s.io" in [g["name"] for g in groups["groups"]]
    for version in (base, old):
        _, listed = await fetch("GET", version)
        assert "localqueues/pendingworkloads" in [r["name"] for r in listed["resources"]]


# -- kubectl --------------------------------------------------------------------------------


def kubectl_runner(url: str, home: Path) -> Callable[..., Awaitable[str]]:
    async def run(*args: str | Path) -> str:
        env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(home / "none")}
        process = await asyncio.create_subprocess_exec(
            "kubectl",
            "--server",
            url,
            *map(str, args),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(30):
                out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode()
        return out.decode() + err.decode()

    return run


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"no Kueue examples at {EXAMPLES}")
async def test_kubectl_gets_applies_labels_and_deletes(cluster: Server, tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed: this test runs the real kubectl; install it")
    kubectl = kubectl_runner(cluster.url, tmp_path)
    visibility.serve(cluster, lambda ns, name: [], lambda name: [])  # an extra group
    assert "No resources found in default namespace" in await kubectl(
        "get", "pods", "-n", "default"
    )

    # validation on: kubectl reads /openapi/v3 and leaves field validation to the server
    setup = EXAMPLES / "admin-single-clusterqueue-setup.yaml"
    applied = await kubectl("apply", "-f", setup)
    assert "clusterqueue.kueue.x-k8s.io/cluster-queue created" in applied
    again = await kubectl("apply", "-f", setup)
    assert "localqueue.kueue.x-k8s.io/user-queue unchanged" in again
    assert "cluster-queue" in await kubectl("get", "clusterqueues")
    await kubectl("label", "localqueue", "user-queue", "-n", "default", "team=a")
    labels = cluster.store.get("kueue.x-k8s.io", "localqueues", "default", "user-queue")
    assert labels["metadata"]["labels"] == {"team": "a"}

    example = EXAMPLES / "pods-kueue-kueue-pod.yaml"
    await kubectl("create", "-n", "default", "-f", example)
    pods = cluster.store.list_objects("", "pods", "default")[0]
    assert [p["metadata"]["generateName"] for p in pods] == ["kueue-sleep-"]
    await kubectl("label", "pods", "--all", "-n", "default", "team=a")
    assert "kueue-sleep-" in await kubectl("get", "pods", "-n", "default", "-l", "team=a")

    await kubectl("delete", "pods", "--all", "-n", "default")
    deleted = await kubectl("delete", "-f", setup)
    assert 'clusterqueue.kueue.x-k8s.io "cluster-queue" deleted' in deleted
    for plural in ("clusterqueues", "localqueues", "resourceflavors"):
        assert list(cluster.store.objects("kueue.x-k8s.io", plural)) == []
    assert cluster.store.list_objects("", "pods")[0] == []


# -- faults and stats -----------------------------------------------------------------------


async def test_fail_next_answers_injected_errors_then_serves_again(cluster: Server) -> None:
    cluster.fail_next("create", "pods", status=409)
    cluster.fail_next("list", "pods", status=500, count=2)
    client = Client(cluster.url, "aio")
    try:
        with pytest.raises(API_ERRORS) as caught:
            await client(client.core.create_namespaced_pod, "default", pod("p"))
        assert (caught.value.status, json.loads(caught.value.body)["reason"]) == (409, "Conflict")
        await client(client.core.create_namespaced_pod, "default", pod("p"))
        for _ in range(2):
            with pytest.raises(API_ERRORS) as caught:
                await client(client.core.list_namespaced_pod, "default")
            assert caught.value.status == 500
        assert len((await client(client.core.list_namespaced_pod, "default")).items) == 1
    finally:
        await client.close()


async def test_latency_delays_each_request_without_blocking_the_loop(cluster: Server) -> None:
    cluster.latency = 1.0
    started = time.monotonic()
    url = f"{cluster.url}/api/v1/namespaces/default/pods"
    replies = await asyncio.gather(*(fetch("GET", url) for _ in range(5)))
    assert [status for status, _ in replies] == [200] * 5
    assert time.monotonic() - started >= 1.0  # each one waited the latency
    assert cluster.stats.peak_requests == 5  # all waited at once: side by side, loop not blocked


async def test_drop_watches_ends_every_open_stream(cluster: Server) -> None:
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=1"
    watches = [asyncio.create_task(watch_lines(url)) for _ in range(2)]
    await eventually(lambda: cluster.stats.watches == 2)
    cluster.drop_watches()
    assert await asyncio.gather(*watches) == [[], []]
    assert cluster.stats.watches == 0


async def test_expire_next_watch_answers_the_next_watch_with_a_410_line(cluster: Server) -> None:
    cluster.store.create("", "pods", "default", pod("a"))
    cluster.expire_next_watch()
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1"
    expired = await watch_lines(url)
    assert [(e["type"], e["object"]["code"]) for e in expired] == [("ERROR", 410)]
    assert [e["type"] for e in await watch_lines(url)] == ["ADDED"]


async def test_a_client_going_away_ends_its_watch_stream(cluster: Server) -> None:
    cluster.store.create("", "pods", "default", pod("a"))
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=1"
    async with asyncio.timeout(10), aiohttp.ClientSession() as http, http.get(url) as response:
        assert json.loads(await response.content.readline())["type"] == "ADDED"
        assert cluster.stats.watches == 1
        response.close()
    await eventually(lambda: cluster.stats.watches == 0)
    assert cluster.store.open_watches == 0


async def test_stop_ends_open_watch_streams(cluster: Server) -> None:
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=1"
    watch = asyncio.create_task(watch_lines(url))
    await eventually(lambda: cluster.stats.watches == 1)
    await cluster.stop()
    assert await watch == []


async def test_stats_count_requests_and_open_and_peak_watches(cluster: Server) -> None:
    client = Client(cluster.url, "aio")
    try:
        await client(client.core.create_namespaced_pod, "default", pod("p"))
        await client(client.core.patch_namespaced_pod_status, "p", "default", {"status": {}})
        await client(client.core.list_namespaced_pod, "default")
        await client(client.core.list_namespaced_pod, "default")
    finally:
        await client.close()
    url = f"{cluster.url}/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1"
    await asyncio.gather(watch_lines(url), watch_lines(url), watch_lines(url))
    stats = cluster.stats
    assert stats.requests[("create", "pods")] == 1
    assert stats.requests[("patch", "pods/status")] == 1
    assert stats.requests[("list", "pods")] == 2
    assert stats.requests[("watch", "pods")] == 3
    assert (stats.watches, stats.peak_watches) == (0, 3)
