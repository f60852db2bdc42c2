"""`KubernetesApi` against the fake API server over HTTP: plain dicts in and out, each patch
type under its own content type, and every error status as our own error class."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.apiserver.rbac import User
from kernel_queue_fake_cluster.cluster import FakeCluster
from kubernetes.aio import client as kube_client

from kernel_queue import errors
from kernel_queue.kube.client import api as kube
from kernel_queue.kube.client import retries
from kernel_queue.kube.client.api import PODS, KubernetesApi, Resource
from kernel_queue.kube.kueue import SECRETS, SERVICES
from tests import polling

WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", namespaced=True)
LOCAL_QUEUES = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", namespaced=True)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NS = "default"


@contextlib.asynccontextmanager
async def connected(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[FakeCluster, KubernetesApi]]:
    """A fake cluster in this loop (no kubelet unless asked) and an api connected to it."""
    options.setdefault("kubelet", False)
    async with (
        asyncio.timeout(60),
        FakeCluster(root_dir=tmp_path / "cluster", **options) as fake,
    ):
        api = await KubernetesApi.connect(fake.kubeconfig)
        try:
            yield fake, api
        finally:
            await api.aclose()


def pod(name: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python", "command": ["sleep", "60"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], **spec},
    }


def workload(name: str) -> dict[str, Any]:
    container = {"name": "main", "image": "python", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}
            ],
        },
    }


# -- CRUD ------------------------------------------------------------------------------------


async def test_core_objects_round_trip_as_plain_dicts(tmp_path: Path) -> None:
    async with connected(tmp_path) as (_, api):
        created = await api.create(PODS, NS, pod("p"))
        assert type(created) is dict and created["metadata"]["resourceVersion"]
        secret = {"metadata": {"name": "key"}, "stringData": {"key": "k" * 32}}
        service = {
            "metadata": {"name": "kernel"},
            "spec": {"selector": {"app": "k"}, "ports": [{"name": "shell", "port": 5000}]},
        }
        await api.create(SECRETS, NS, {"apiVersion": "v1", "kind": "Secret", **secret})
        await api.create(SERVICES, NS, {"apiVersion": "v1", "kind": "Service", **service})

        assert (await api.get(PODS, NS, "p"))["metadata"]["uid"] == created["metadata"]["uid"]
        assert (await api.get(SERVICES, NS, "kernel"))["spec"]["ports"][0]["port"] == 5000
        items, version = await api.list(PODS, NS)
        assert [i["metadata"]["name"] for i in items] == ["p"] and int(version) > 0
        assert (items[0]["apiVersion"], items[0]["kind"]) == ("v1", "Pod")

        for kind, name in ((PODS, "p"), (SECRETS, "key"), (SERVICES, "kernel")):
            await api.delete(kind, NS, name, grace_seconds=0)
            with pytest.raises(errors.ClusterNotFound):
                await api.get(kind, NS, name)
        await api.delete(PODS, NS, "p")  # already gone: fine


async def test_a_pod_with_integer_cpu_is_sent_unvalidated(tmp_path: Path) -> None:
    # The generated typed APIs would refuse `cpu: 3` (pydantic wants a string); we send JSON.
    async with connected(tmp_path) as (_, api):
        body = pod("p")
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": 3, "memory": "1Gi"}}
        created = await api.create(PODS, NS, body)
        requests = created["spec"]["containers"][0]["resources"]["requests"]
        # A real API server answers "3"; the fake keeps the number as sent.
        assert str(requests["cpu"]) == "3" and requests["memory"] == "1Gi"


async def test_kueue_workloads_and_local_queues_round_trip(tmp_path: Path) -> None:
    async with connected(tmp_path, kueue=False) as (_, api):
        queue = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "user-queue"},
            "spec": {"clusterQueue": "cluster-queue"},
        }
        await api.create(LOCAL_QUEUES, NS, queue)
        stored = await api.get(LOCAL_QUEUES, NS, "user-queue")
        assert stored["spec"]["clusterQueue"] == "cluster-queue"  # plus schema defaults
        created = await api.create(WORKLOADS, NS, workload("w"))
        assert created["spec"]["podSets"][0]["count"] == 1
        items, _ = await api.list(WORKLOADS, NS)
        assert [(i["kind"], i["metadata"]["name"]) for i in items] == [("Workload", "w")]
        await api.delete(WORKLOADS, NS, "w")
        await api.delete(LOCAL_QUEUES, NS, "user-queue")
        assert (await api.list(WORKLOADS, NS))[0] == []


# -- patches -----------------------------------------------------------------------------------


async def test_strategic_merge_patch_on_a_pod_merges_lists_by_their_keys(tmp_path: Path) -> None:
    async with connected(tmp_path) as (_, api):
        body = pod("p")
        body["metadata"]["finalizers"] = ["example.com/a"]
        await api.create(PODS, NS, body)
        patch = {"metadata": {"finalizers": ["example.com/b"], "labels": {"x": "1"}}}
        patched = await api.patch(PODS, NS, "p", patch, patch_type="strategic")
        # Finalizers are a set under SMP; a merge patch would have replaced the list.
        assert patched["metadata"]["finalizers"] == ["example.com/a", "example.com/b"]
        assert patched["metadata"]["labels"] == {"x": "1"}


async def test_merge_patch_on_workload_status_changes_only_the_status(tmp_path: Path) -> None:
    async with connected(tmp_path, kueue=False) as (_, api):
        await api.create(WORKLOADS, NS, workload("w"))
        condition = {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "QuotaReserved",
            "message": "reserved",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        patch = {"status": {"conditions": [condition]}, "spec": {"active": False}}
        patched = await api.patch(
            WORKLOADS, NS, "w", patch, patch_type="merge", subresource="status"
        )
        assert patched["status"]["conditions"] == [condition]
        assert patched["spec"].get("active", True) is True  # the status subresource ignores spec


async def test_json_patch_removes_a_scheduling_gate_and_works_on_custom_resources(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path, kueue=False) as (_, api):
        await api.create(PODS, NS, pod("p", schedulingGates=[{"name": "example.com/gate"}]))
        remove = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
        patched = await api.patch(PODS, NS, "p", remove, patch_type="json")
        assert not patched["spec"].get("schedulingGates")
        await api.create(WORKLOADS, NS, workload("w"))
        replace = [{"op": "add", "path": "/spec/active", "value": False}]
        assert (await api.patch(WORKLOADS, NS, "w", replace, patch_type="json"))["spec"][
            "active"
        ] is False


async def test_strategic_merge_patch_on_a_custom_resource_is_415(tmp_path: Path) -> None:
    async with connected(tmp_path, kueue=False) as (_, api):
        await api.create(WORKLOADS, NS, workload("w"))
        with pytest.raises(errors.ClusterApiError) as caught:
            await api.patch(WORKLOADS, NS, "w", {"spec": {"active": False}}, patch_type="strategic")
        assert type(caught.value) is errors.ClusterApiError
        assert (caught.value.status, caught.value.reason) == (415, "UnsupportedMediaType")
        assert caught.value.message  # the server's words
        with pytest.raises(TypeError, match="JSON patch"):  # refused before anything is sent
            await api.patch(WORKLOADS, NS, "w", {"spec": {}}, patch_type="json")


# -- errors ----------------------------------------------------------------------------------


async def test_not_found_and_conflict_keep_the_server_message(tmp_path: Path) -> None:
    async with connected(tmp_path) as (_, api):
        with pytest.raises(errors.ClusterNotFound) as missing:
            await api.get(PODS, NS, "nope")
        assert missing.value.status == 404 and missing.value.reason == "NotFound"
        assert str(missing.value) == 'pods "nope" not found'
        assert isinstance(missing.value, kube.NotFound)
        assert (missing.value.details["name"], missing.value.details["kind"]) == ("nope", "pods")
        widgets = Resource("example.com", "v1", "widgets", namespaced=True)
        with pytest.raises(kube.NotFound) as unserved:
            await api.get(widgets, NS, "w")
        assert unserved.value.details == {}  # a path the server does not serve names nothing
        assert getattr(missing.value.__cause__, "status", None) == 404  # the client's ApiException

        await api.create(PODS, NS, pod("p"))
        with pytest.raises(errors.ClusterConflict) as exists:
            await api.create(PODS, NS, pod("p"))
        assert exists.value.status == 409 and exists.value.reason == "AlreadyExists"
        assert str(exists.value) == 'pods "p" already exists'


def test_a_404_that_is_not_a_status_names_nothing() -> None:
    raw = kube_client.ApiException(status=404, reason="Not Found")
    raw.body = "404 page not found"
    error = kube.api_error(raw, "get localqueues.kueue.x-k8s.io")
    assert isinstance(error, kube.NotFound) and error.details == {}
    assert str(error) == "get localqueues.kueue.x-k8s.io: the API server answered 404 Not Found"


async def test_forbidden_names_the_verb_and_the_resource(tmp_path: Path) -> None:
    sa = "system:serviceaccount:default:kernel"
    policy = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "reader", "namespace": NS},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "kernel", "namespace": NS}],
        },
    ]
    tokens = {"admin": User("admin", ("system:masters",)), "sa": sa}
    async with connected(tmp_path, tokens=tokens, rbac_objects=policy) as (fake, admin):
        await admin.create(PODS, NS, pod("p"))
        api = await KubernetesApi.connect(fake.kubeconfig_for("sa"))
        stranger = await KubernetesApi.connect(fake.kubeconfig_for("wrong"))
        try:
            assert (await api.get(PODS, NS, "p"))["metadata"]["name"] == "p"
            with pytest.raises(errors.ClusterForbidden) as caught:
                await api.create(PODS, NS, pod("q"))
            assert caught.value.status == 403 and caught.value.reason == "Forbidden"
            assert str(caught.value) == (
                f'pods is forbidden: User "{sa}" cannot create resource "pods" '
                f'in API group "" in the namespace "{NS}"'
            )
            assert isinstance(caught.value, PermissionError)
            refused = caught.value
            assert isinstance(refused, kube.Forbidden)
            assert (refused.verb, refused.resource, refused.namespace) == ("create", "pods", NS)
            assert refused.user == sa
            with pytest.raises(errors.ClusterForbidden) as unknown:
                await stranger.get(PODS, NS, "p")
            assert unknown.value.status == 401
        finally:
            await api.aclose()
            await stranger.aclose()


async def test_server_errors_and_refused_connections_are_unavailable(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        api.retry = retries.NEVER
        fake.fail_next("list", "pods", 500)
        with pytest.raises(errors.ClusterUnavailable) as failed:
            await api.list(PODS, NS)
        assert failed.value.status == 500 and failed.value.reason == "InternalError"
        assert str(failed.value) == "injected fault: list pods answered 500"  # the server's words
        assert isinstance(failed.value, ConnectionError)
        assert (await api.list(PODS, NS))[0] == []  # the fault was one answer only
        late = await KubernetesApi.connect(fake.kubeconfig, retry=retries.NEVER)
    try:
        with pytest.raises(errors.ClusterUnavailable) as refused:
            await late.get(PODS, NS, "p")
        assert refused.value.status == 0
        assert str(refused.value).startswith('get pods "p" in namespace "default": ')
        assert refused.value.__cause__ is not None
    finally:
        await late.aclose()


class Pauses:
    """A `Backoff.sleep` that records each pause and waits for none (no wall-clock time)."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_get_list_and_delete_retry_transient_answers(tmp_path: Path, status: int) -> None:
    async with connected(tmp_path) as (fake, api):
        pauses = Pauses()
        api.retry = retries.Backoff(first=0.2, largest=5, budget=30, sleep=pauses)
        await api.create(PODS, NS, pod("p"))
        for verb in ("get", "list", "delete"):
            fake.fail_next(verb, "pods", status, count=2, retry_after=None if status != 429 else 3)
        assert (await api.get(PODS, NS, "p"))["metadata"]["name"] == "p"
        assert [i["metadata"]["name"] for i in (await api.list(PODS, NS))[0]] == ["p"]
        await api.delete(PODS, NS, "p", grace_seconds=0)
        assert (await api.list(PODS, NS))[0] == []
        assert fake.faults_pending == 0
        # Retry-After wins over the backoff (3 s, as the server asked); else 0.2 s, then 0.4 s.
        assert pauses.taken == ([3.0, 3.0] if status == 429 else [0.2, 0.4]) * 3


async def test_retries_stop_when_their_budget_is_spent(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        pauses = Pauses()
        api.retry = retries.Backoff(first=1, largest=4, budget=10, sleep=pauses)
        fake.fail_next("get", "pods", 500, count=100)
        with pytest.raises(errors.ClusterUnavailable):
            await api.get(PODS, NS, "p")
        assert pauses.taken == [1, 2, 4] == api.retry.delays()  # 1 + 2 + 4 + 4 > 10
        assert fake.stats.requests[("get", "pods")] == 4


async def test_a_create_is_never_retried_by_the_api(tmp_path: Path) -> None:
    # A POST whose answer was lost may have created the object: only the caller, who can tell
    # its own object from another's, may try again (see kube.ownership).
    async with connected(tmp_path) as (fake, api):
        api.retry = retries.Backoff(sleep=Pauses())
        fake.fail_next("create", "pods", 500)
        with pytest.raises(errors.ClusterUnavailable):
            await api.create(PODS, NS, pod("p"))
        assert fake.stats.requests[("create", "pods")] == 1


# -- watch -------------------------------------------------------------------------------------


async def test_watch_streams_events_bookmarks_and_ends_at_its_timeout(tmp_path: Path) -> None:
    async with connected(tmp_path) as (fake, api):
        _, version = await api.list(PODS, NS)
        await api.create(PODS, NS, pod("p"))
        seen = [
            (kind, obj["metadata"].get("name"))
            async for kind, obj in api.watch(PODS, NS, resource_version=version, timeout_seconds=2)
        ]
        assert seen[0] == ("ADDED", "p")
        assert ("BOOKMARK", None) in seen  # the fake bookmarks an idle watch every second
        assert fake.stats.watches == 0


async def test_a_watch_error_event_raises_gone_and_closing_ends_the_stream(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as (fake, api):
        fake.expire_next_watch()
        with pytest.raises(errors.ClusterGone) as gone:
            async for _ in api.watch(PODS, NS, resource_version="1"):
                pass
        assert gone.value.status == 410 and gone.value.reason == "Expired"

        await api.create(PODS, NS, pod("p"))
        events = api.watch(PODS, NS, resource_version="")
        assert (await anext(events))[0] == "ADDED"
        assert fake.stats.watches == 1
        await events.aclose()
        async with asyncio.timeout(5):
            while fake.stats.watches:  # noqa: ASYNC110 - the server notices the close itself
                await asyncio.sleep(0.01)


# -- logs and aggregated APIs ----------------------------------------------------------------


async def test_read_log_returns_the_container_output(tmp_path: Path) -> None:
    async with connected(tmp_path, kubelet=True, kueue=False) as (_, api):
        script = "print('one'); print('two'); print('three')"
        body = pod("p", restartPolicy="Never")
        body["spec"]["containers"][0]["command"] = [sys.executable, "-c", script]
        await api.create(PODS, NS, body)
        _, version = await api.list(PODS, NS)
        async for _, obj in api.watch(PODS, NS, resource_version=version, timeout_seconds=30):
            if obj.get("status", {}).get("phase") == "Succeeded":
                break
        assert await api.read_log(NS, "p") == "one\ntwo\nthree\n"
        assert await api.read_log(NS, "p", container="main", tail_lines=1) == "three\n"
        with pytest.raises(errors.ClusterNotFound):
            await api.read_log(NS, "nope")


async def test_get_path_reads_kueue_pending_workloads(tmp_path: Path) -> None:
    async with connected(tmp_path, manual_admission=True) as (fake, api):
        fake.setup_queues()
        body = pod("p")
        body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        await api.create(PODS, NS, body)
        path = (
            "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/default"
            "/localqueues/user-queue/pendingworkloads"
        )

        async def listed() -> dict[str, Any] | None:  # once Kueue has made the pod's Workload
            summary = await api.get_path(path, {"limit": "10"})
            return summary if summary["items"] else None

        summary = await polling.until(listed, "the pod's Workload pending in user-queue")
        assert summary["kind"] == "PendingWorkloadsSummary"
        assert len(summary["items"]) == 1
        (workload_name,) = [w["metadata"]["name"] for w in (await api.list(WORKLOADS, NS))[0]]
        assert summary["items"][0]["metadata"]["name"] == workload_name
        with pytest.raises(errors.ClusterNotFound):
            await api.get_path(path.replace("user-queue", "missing"))


# -- configuration -------------------------------------------------------------------------


def test_importing_reads_no_kubeconfig_and_connect_reads_it(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")  # valid YAML, no cluster in it
    probe = textwrap.dedent(
        f"""
        import asyncio, sys
        opened = []
        sys.addaudithook(
            lambda event, args: opened.append(str(args[0]))
            if event == "open" and "kubeconfig" in str(args[0]) else None
        )
        from kernel_queue.kube.client import api, informer
        assert opened == [], opened
        try:
            asyncio.run(api.KubernetesApi.connect())
        except api.errors.ConfigError as exc:
            assert {str(kubeconfig)!r} in str(exc), exc
        assert opened, "connect() did not read KUBECONFIG"
        print("ok")
        """
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_resource_paths() -> None:
    assert PODS.path("ns", "p", "log") == "/api/v1/namespaces/ns/pods/p/log"
    assert WORKLOADS.path(None) == "/apis/kueue.x-k8s.io/v1beta2/workloads"
    cluster_queues = Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", namespaced=False)
    assert cluster_queues.path("ignored", "cq") == "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/cq"
    assert (WORKLOADS.api_version, WORKLOADS.qualified) == (
        "kueue.x-k8s.io/v1beta2",
        "workloads.kueue.x-k8s.io",
    )
    assert kube.PATCH_CONTENT_TYPES == {
        "json": "application/json-patch+json",
        "merge": "application/merge-patch+json",
        "strategic": "application/strategic-merge-patch+json",
    }
    with pytest.raises(ValueError, match="needs a namespace"):
        PODS.path(None, "p")
