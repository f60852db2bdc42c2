"""The two planes the kube tests run on, behind one face: the fake cluster and the real control
plane (kube-apiserver, etcd, kube-scheduler, kube-controller-manager, the real Kueue and the
node agent; `kernel_queue_fake_cluster.control_plane`).

A test that takes the `plane` fixture runs on both (ids `fake` and `real`); one that takes
`cluster` (a `FakeCluster`) needs what only the fake has (its store, its Kueue's hand-driven
admission, its kubelet's faults) and runs on the fake only. Both planes enforce
etc/kubernetes/rbac.yaml for the server, serve etc/kubernetes/queues.yaml at their Kueue
release's version with `GPU_QUOTA`, and inject faults with the same calls (`fail_next`,
`drop_watches`, `expire_next_watch`, `latency`): the fake in its API server, the real plane
through a `FaultProxy` in front of its API server, which the server's kubeconfig names.

A real plane starts once per Kueue release and session (about 10 s once built; the build
itself, `scripts/control-plane build`, is cached) and is brought back to its first state before
each test: everything kernel-queue made is deleted, extra namespaces and queues go, and the
queues, quota and RBAC are applied again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import itertools
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jupyter_server.serverapp import ServerApp
from kernel_queue_fake_cluster.apiserver import pod_rules
from kernel_queue_fake_cluster.apiserver.faults import PLANTED_LABEL
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.control_plane.client import ApiError
from kernel_queue_fake_cluster.control_plane.fault_proxy import FaultProxy
from kernel_queue_fake_cluster.control_plane.plane import ControlPlane, NodeSpec
from kernel_queue_fake_cluster.kueue import conversion
from kernel_queue_fake_cluster.node import volumes

from tests.kube import images
from tests.kube.support import COPIED_LABELS, GPU_QUOTA, OURS, QUEUES, RBAC

Obj = dict[str, Any]
KUEUE = "kueue.x-k8s.io"
VERSIONS = {
    "": "v1",
    "rbac.authorization.k8s.io": "v1",
    "networking.k8s.io": "v1",
    "apps": "v1",
    "coordination.k8s.io": "v1",
    "scheduling.k8s.io": "v1",
}
BASE_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", "kueue-system"}
KERNEL_PLURALS = ("pods", "services", "secrets", "configmaps")
"""What kernel-queue makes in a namespace (besides Workloads, which Kueue makes)."""
MERGE_PATCH = "application/merge-patch+json"
NO_WORKLOADS = "kernel-queue-test-no-workloads"
"""The ValidatingAdmissionPolicy (and its binding) that keeps Kueue from creating Workloads
while a test holds `kueue_controller_paused` on the real plane."""


class Plane:
    """What the kube tests ask of a cluster, on either plane."""

    kind = ""
    release = ""

    def objects(
        self, group: str, plural: str, namespace: str | None = "default", labels: str = ""
    ) -> list[Obj]:
        raise NotImplementedError

    def get(self, group: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        raise NotImplementedError

    def delete(
        self, group: str, plural: str, namespace: str | None, name: str, *, grace: int | None = None
    ) -> None:
        raise NotImplementedError

    def apply(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        """Create or replace each object; Kueue's at the version this release serves."""
        raise NotImplementedError

    def evict(self, namespace: str, name: str) -> None:
        """Evict pod `name` as a drain or the kubelet's pressure does: its `eviction`
        subresource (policy/v1), a graceful delete (the real plane's over HTTP as an admin)."""
        raise NotImplementedError

    def set_quota(self, cluster_queue: str, flavor: str, quota: Mapping[str, str | int]) -> None:
        raise NotImplementedError

    def server_kubeconfig(self, root: Path) -> Path:
        """A kubeconfig with the credentials etc/kubernetes/rbac.yaml grants the server."""
        raise NotImplementedError

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The local folder that holds claim `claim`'s files."""
        raise NotImplementedError

    def kinds(self) -> list[tuple[str, str]]:
        """(group, plural) of every namespaced kind the API server lists."""
        raise NotImplementedError

    def everything(self, namespace: str, labels: str) -> dict[str, list[str]]:
        """Objects of every namespaced kind that match `labels` in `namespace`, by
        "group/plural" (empty kinds dropped): what a clean-up may have forgotten."""
        found = {}
        for group, plural in self.kinds():
            names = [o["metadata"]["name"] for o in self.objects(group, plural, namespace, labels)]
            if names:
                found[f"{group}/{plural}" if group else plural] = names
        return found

    def merge_patch(
        self, group: str, plural: str, namespace: str | None, name: str, body: Obj
    ) -> Obj:
        """A JSON merge patch of the object, as its admin."""
        raise NotImplementedError

    def delete_labelled(self, plural: str, labels: str, namespace: str = "default") -> None:
        """Delete (at once) every object of core `plural` in `namespace` matching `labels`."""
        for obj in self.objects("", plural, namespace, labels):
            with contextlib.suppress(Exception):  # gone meanwhile
                self.delete("", plural, namespace, obj["metadata"]["name"], grace=0)

    def kueue_controller_paused(self) -> contextlib.AbstractContextManager[None]:
        """While held, Kueue's webhook gates pods as ever but its controller makes no Workload
        for them; on leaving, it catches up."""
        raise NotImplementedError

    def kueue_manages_only(self, selector: Obj) -> contextlib.AbstractContextManager[None]:
        """While held, Kueue's pod webhook acts only in namespaces matching label `selector`
        (Kueue's managedJobsNamespaceSelector): a pod elsewhere is created ungated."""
        raise NotImplementedError

    @property
    def requests(self) -> collections.Counter[tuple[str, str]]:
        """The server's requests so far by (verb, resource), as RBAC names them (`get`,
        `list`, `watch`, `create`, ...; `pods`, `localqueues/pendingworkloads`; a path for
        discovery): what reached the fake API server, or passed the real plane's proxy."""
        raise NotImplementedError

    # faults, as FakeCluster names them
    def fail_next(
        self, verb: str, plural: str, status: int = 500, count: int = 1, **options: Any
    ) -> None:
        self.faults.fail_next(verb, plural, status, count, **options)

    def plant_next(
        self, plural: str, labels: Mapping[str, str] | None = None, count: int = 1
    ) -> None:
        """Before each of the next `count` creates of the server on `plural`, an object of the
        same name carrying only `labels` (someone else's) is made: the create meets a 409."""
        self.faults.plant_next(plural, labels, count)

    def drop_watches(self) -> None:
        self.faults.drop_watches()

    @property
    def latency(self) -> float:
        """Seconds added to each of the server's requests."""
        return float(self.faults.latency)

    @latency.setter
    def latency(self, seconds: float) -> None:
        self.faults.latency = seconds

    def expire_next_watch(self, count: int = 1) -> None:
        self.faults.expire_next_watch(count)

    def clear_faults(self) -> None:
        self.faults.clear_faults()

    @property
    def faults_pending(self) -> int:
        return int(self.faults.faults_pending)

    @property
    def faults(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.kind} plane, Kueue {self.release}>"


class FakePlane(Plane):
    kind = "fake"

    def __init__(self, cluster: FakeCluster, server_token: str) -> None:
        self.cluster, self.server_token = cluster, server_token
        self.release = cluster.release.name if cluster.release is not None else ""

    @property
    def faults(self) -> Any:
        return self.cluster

    def objects(
        self, group: str, plural: str, namespace: str | None = "default", labels: str = ""
    ) -> list[Obj]:
        if (group, plural) not in self.cluster.store.types:
            return []
        items, _ = self.cluster.store.list_objects(group, plural, namespace, labels=labels or None)
        return list(items)

    def get(self, group: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        from kernel_queue_fake_cluster.apiserver.errors import ApiError as FakeError

        try:
            return dict(self.cluster.store.get(group, plural, namespace, name))
        except FakeError as exc:
            if exc.code == 404:
                return None
            raise

    def delete(
        self, group: str, plural: str, namespace: str | None, name: str, *, grace: int | None = None
    ) -> None:
        self.cluster.store.delete(group, plural, namespace, name, grace_seconds=grace)

    def apply(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        return self.cluster.apply(self.cluster.for_release(manifests))

    def evict(self, namespace: str, name: str) -> None:
        # the store's own eviction (this cluster serves on the test's loop: an HTTP call from
        # here would wait on itself); the HTTP route is the fake cluster's own tests'
        pod_rules.evict(self.cluster.store, namespace, name, _eviction(namespace, name))

    def set_quota(self, cluster_queue: str, flavor: str, quota: Mapping[str, str | int]) -> None:
        assert self.cluster.kueue is not None
        self.cluster.kueue.set_quota(cluster_queue, flavor, dict(quota))

    def server_kubeconfig(self, root: Path) -> Path:
        return self.cluster.kubeconfig_for(self.server_token, name="server-kubeconfig")

    def claim_dir(self, namespace: str, claim: str) -> Path:
        assert self.cluster.kubelet is not None
        return Path(self.cluster.kubelet.claim_dir(namespace, claim))

    def kinds(self) -> list[tuple[str, str]]:
        return sorted(key for key, rtype in self.cluster.store.types.items() if rtype.namespaced)

    def merge_patch(
        self, group: str, plural: str, namespace: str | None, name: str, body: Obj
    ) -> Obj:
        return dict(self.cluster.store.patch(group, plural, namespace, name, body, MERGE_PATCH))

    @property
    def requests(self) -> collections.Counter[tuple[str, str]]:
        return collections.Counter(self.cluster.stats.requests)

    @contextlib.contextmanager
    def kueue_controller_paused(self) -> Iterator[None]:
        kueue = self.cluster.kueue
        assert kueue is not None
        run = kueue._run

        def paused() -> None:  # the webhook still gates the pods; the controller does nothing
            kueue._scheduled = False

        kueue._run = paused  # type: ignore[method-assign]
        try:
            yield
        finally:
            del kueue._run  # the class's again
            assert kueue._run == run
            kueue._wake()

    @contextlib.contextmanager
    def kueue_manages_only(self, selector: Obj) -> Iterator[None]:
        assert self.cluster.kueue is not None
        webhook = self.cluster.kueue.webhook
        before, webhook.managed_namespaces = webhook.managed_namespaces, selector
        try:
            yield
        finally:
            webhook.managed_namespaces = before


class RealPlane(Plane):
    """A session's `ControlPlane` and this test's `FaultProxy` in front of it."""

    kind = "real"

    def __init__(self, control: ControlPlane, proxy: FaultProxy, server_token: str) -> None:
        self.control, self.proxy, self.server_token = control, proxy, server_token
        self.release = control.release.name
        self.admin = control.admin
        self._preferred: dict[str, str] = {}  # API group -> its preferred version (discovery)

    @property
    def faults(self) -> Any:
        return self.proxy

    def version(self, group: str) -> str:
        if group == KUEUE:
            return "v1beta1" if self.release == "0.14" else "v1beta2"
        return VERSIONS.get(group) or self._preferred.get(group, "v1")

    def objects(
        self, group: str, plural: str, namespace: str | None = "default", labels: str = ""
    ) -> list[Obj]:
        path = self.admin.resource(group, self.version(group), plural, namespace)
        query = {"labelSelector": labels} if labels else None
        try:
            return list(self.admin.request("GET", path, query=query)["items"])
        except ApiError as exc:
            if exc.code == 404:
                return []
            raise

    def get(self, group: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        try:
            found: Obj = self.admin.request(
                "GET", self.admin.resource(group, self.version(group), plural, namespace, name)
            )
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return found

    def delete(
        self, group: str, plural: str, namespace: str | None, name: str, *, grace: int | None = None
    ) -> None:
        path = self.admin.resource(group, self.version(group), plural, namespace, name)
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace  # type: ignore[assignment]
        self.admin.request("DELETE", path, body)

    def apply(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        return self.admin.apply(converted(manifests, self.version(KUEUE)))

    def evict(self, namespace: str, name: str) -> None:
        path = self.admin.resource("", "v1", "pods", namespace, name) + "/eviction"
        self.admin.request("POST", path, _eviction(namespace, name))

    def set_quota(self, cluster_queue: str, flavor: str, quota: Mapping[str, str | int]) -> None:
        """Kueue's controller writes the ClusterQueue's status while it runs, so a write
        from a read it has since overtaken is refused (409): read again and retry."""
        path = self.admin.resource(KUEUE, self.version(KUEUE), "clusterqueues", None, cluster_queue)
        for attempt in itertools.count():
            queue = self.admin.request("GET", path)
            for group in queue["spec"]["resourceGroups"]:
                for entry in group["flavors"]:
                    if entry["name"] != flavor:
                        continue
                    for resource in entry["resources"]:
                        if resource["name"] in quota:
                            resource["nominalQuota"] = quota[resource["name"]]
            try:
                self.admin.request("PUT", path, queue)
                return
            except ApiError as exc:
                if exc.code != 409 or attempt == 9:
                    raise

    def server_kubeconfig(self, root: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": self.proxy.url}}],
            "users": [{"name": "server", "user": {"token": self.server_token}}],
            "contexts": [
                {
                    "name": "real",
                    "context": {"cluster": "real", "user": "server", "namespace": "default"},
                }
            ],
            "current-context": "real",
        }
        path = root / "server-kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return Path(volumes.claim_dir(self.control.agent_root, namespace, claim))

    def merge_patch(
        self, group: str, plural: str, namespace: str | None, name: str, body: Obj
    ) -> Obj:
        path = self.admin.resource(group, self.version(group), plural, namespace, name)
        found: Obj = self.admin.request("PATCH", path, body, content_type=MERGE_PATCH)
        return found

    @property
    def requests(self) -> collections.Counter[tuple[str, str]]:
        return collections.Counter(self.proxy.requests)

    @contextlib.contextmanager
    def kueue_controller_paused(self) -> Iterator[None]:
        """A ValidatingAdmissionPolicy refuses every Workload create (Kueue's controller keeps
        trying, with its backoff); it goes on leaving."""
        admission = "admissionregistration.k8s.io/v1"
        rule = {
            "apiGroups": [KUEUE],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["workloads"],
        }
        self.admin.apply(
            [
                {
                    "apiVersion": admission,
                    "kind": "ValidatingAdmissionPolicy",
                    "metadata": {"name": NO_WORKLOADS},
                    "spec": {
                        "failurePolicy": "Fail",
                        "matchConstraints": {"resourceRules": [rule]},
                        "validations": [
                            {"expression": "false", "message": "Kueue's controller is paused"}
                        ],
                    },
                },
                {
                    "apiVersion": admission,
                    "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": NO_WORKLOADS},
                    "spec": {"policyName": NO_WORKLOADS, "validationActions": ["Deny"]},
                },
            ]
        )
        try:
            self.admin.wait("Workload creates refused", self._workloads_refused, within=30)
            yield
        finally:
            base = "/apis/admissionregistration.k8s.io/v1"
            for plural in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
                with contextlib.suppress(ApiError):
                    self.admin.request("DELETE", f"{base}/{plural}/{NO_WORKLOADS}")

    def _workloads_refused(self) -> bool:
        """Whether the API server now refuses a Workload create (tried as a dry run)."""
        workload = converted(
            [
                {
                    "apiVersion": f"{KUEUE}/v1beta2",
                    "kind": "Workload",
                    "metadata": {"name": "probe", "namespace": "default"},
                    "spec": {
                        "queueName": "user-queue",
                        "podSets": [
                            {
                                "name": "main",
                                "count": 1,
                                "template": {
                                    "spec": {"containers": [{"name": "c", "image": "probe"}]}
                                },
                            }
                        ],
                    },
                }
            ],
            self.version(KUEUE),
        )[0]
        path = self.admin.resource(KUEUE, self.version(KUEUE), "workloads", "default")
        try:
            self.admin.request("POST", path, workload, query={"dryRun": "All"})
        except ApiError as exc:
            return exc.code in (400, 403, 422) and "paused" in exc.message
        return False

    @contextlib.contextmanager
    def kueue_manages_only(self, selector: Obj) -> Iterator[None]:
        """Kueue's pod webhooks get `selector` as their namespaceSelector (beside the release's
        own), so the API server calls them only for pods of matching namespaces; back on
        leaving."""
        base = "/apis/admissionregistration.k8s.io/v1"
        kinds = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        saved = []
        for plural in kinds:
            for config in self.admin.request("GET", f"{base}/{plural}")["items"]:
                if not config["metadata"]["name"].startswith("kueue-"):
                    continue
                changed = copy.deepcopy(config)
                for hook in changed.get("webhooks") or []:
                    resources = {
                        r for rule in hook.get("rules") or [] for r in rule.get("resources") or []
                    }
                    if "pods" in resources:
                        hook["namespaceSelector"] = _and(hook.get("namespaceSelector"), selector)
                if changed != config:
                    path = f"{base}/{plural}/{config['metadata']['name']}"
                    saved.append((path, self.admin.request("PUT", path, changed)))
                    saved[-1][1]["webhooks"] = config["webhooks"]
        try:
            yield
        finally:
            for path, config in saved:
                config["metadata"] = {
                    **config["metadata"],
                    "resourceVersion": self.admin.request("GET", path)["metadata"][
                        "resourceVersion"
                    ],
                }
                self.admin.request("PUT", path, config)

    def kinds(self) -> list[tuple[str, str]]:
        """From discovery: every namespaced resource with the verb list (subresources out)."""
        found = set()
        groups = [("", "v1")] + [
            (g["name"], g["preferredVersion"]["version"])
            for g in self.admin.request("GET", "/apis")["groups"]
        ]
        for group, version in groups:
            where = f"/apis/{group}/{version}" if group else f"/api/{version}"
            try:
                resources = self.admin.request("GET", where)["resources"]
            except ApiError:
                continue  # an aggregated API that does not answer now
            for resource in resources:
                listed = "list" in resource.get("verbs", [])
                if resource["namespaced"] and "/" not in resource["name"] and listed:
                    found.add((group, resource["name"]))
                    self._preferred.setdefault(group, version)
        return sorted(found)

    # -- back to the first state ------------------------------------------------------------

    def reset(self) -> None:
        """Delete what earlier tests left, then apply the base queues, quota and RBAC again."""
        base = {
            (doc["kind"], (doc.get("metadata") or {}).get("name"))
            for doc in yaml.safe_load_all(QUEUES)
            if doc
        }
        for namespace in self.objects("", "namespaces", None):
            name = namespace["metadata"]["name"]
            if name not in BASE_NAMESPACES and not namespace["metadata"].get("deletionTimestamp"):
                self.delete("", "namespaces", None, name)
        for plural in (
            "localqueues",
            "clusterqueues",
            "resourceflavors",
            "workloadpriorityclasses",
        ):
            scoped = plural == "localqueues"
            for obj in self.objects(KUEUE, plural, None):
                meta = obj["metadata"]
                if (obj["kind"], meta["name"]) not in base or (
                    scoped and meta.get("namespace") != "default"
                ):
                    with contextlib.suppress(ApiError):
                        self.delete(
                            KUEUE, plural, meta.get("namespace") if scoped else None, meta["name"]
                        )
        self._clean("default")
        self.apply(QUEUES)
        self.set_quota("cluster-queue", "default-flavor", GPU_QUOTA)
        self.admin.apply([doc for doc in RBAC if doc])

        def gone() -> bool:
            names = {n["metadata"]["name"] for n in self.objects("", "namespaces", None)}
            return names <= BASE_NAMESPACES and not self._left("default")

        self.admin.wait("the plane back to its first state", gone, within=60)

    def _clean(self, namespace: str) -> None:
        for plural in KERNEL_PLURALS:
            for obj in self._leftovers(plural, namespace):
                with contextlib.suppress(ApiError):
                    self.delete("", plural, namespace, obj["metadata"]["name"], grace=0)
        for claim in self.objects("", "persistentvolumeclaims", namespace):
            with contextlib.suppress(ApiError):
                self.delete("", "persistentvolumeclaims", namespace, claim["metadata"]["name"])
        for workload in self.objects(KUEUE, "workloads", namespace):
            with contextlib.suppress(ApiError):
                self.delete(KUEUE, "workloads", namespace, workload["metadata"]["name"])

    def _leftovers(self, plural: str, namespace: str) -> list[Obj]:
        """Ours, and what a test planted in our way (`plant_next`: a copy of a kernel's pod
        holds a GPU of the node's two, and a gang of two then never fits)."""
        return self.objects("", plural, namespace, OURS) + self.objects(
            "", plural, namespace, PLANTED_LABEL
        )

    def _left(self, namespace: str) -> list[str]:
        found = [
            f"{plural}/{obj['metadata']['name']}"
            for plural in KERNEL_PLURALS
            for obj in self._leftovers(plural, namespace)
        ]
        found += [
            f"workloads/{w['metadata']['name']}"
            for w in self.objects(KUEUE, "workloads", namespace)
        ]
        # a claim's volume and folder go after it (the node agent's provisioner): the next
        # test's claim of that name starts empty
        found += [
            f"persistentvolumeclaims/{c['metadata']['name']}"
            for c in self.objects("", "persistentvolumeclaims", namespace)
        ]
        found += [
            f"persistentvolumes/{v['metadata']['name']}"
            for v in self.objects("", "persistentvolumes", None)
        ]
        return found


def _and(selector: Obj | None, more: Obj) -> Obj:
    """A label selector matching what both `selector` and `more` match."""
    joined: Obj = {}
    for part in (selector or {}, more):
        if part.get("matchLabels"):
            joined.setdefault("matchLabels", {}).update(part["matchLabels"])
        if part.get("matchExpressions"):
            joined.setdefault("matchExpressions", []).extend(part["matchExpressions"])
    return joined


def converted(manifests: str | Iterable[Obj], version: str) -> list[Obj]:
    """Kueue's objects of `manifests` at `kueue.x-k8s.io/<version>`, the others as they are."""
    docs = yaml.safe_load_all(manifests) if isinstance(manifests, str) else manifests
    target = f"{KUEUE}/{version}"
    return [
        conversion.convert(doc, target) if doc["apiVersion"].startswith(f"{KUEUE}/") else doc
        for doc in docs
        if doc
    ]


class RealPlanes:
    """The session's real planes, one per Kueue release, started when first asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.images = root / "images"
        """Where the test images' folders go (`images.make`): the node agent of every plane
        maps their images there from its start."""
        self._planes: dict[str, ControlPlane] = {}
        self._tokens: dict[str, str] = {}

    def plane(self, release: str) -> ControlPlane:
        if release not in self._planes:
            for other in list(self._planes):  # one at a time: 0.14 listens on a fixed port
                self._planes.pop(other).stop()
            started = time.monotonic()
            node = NodeSpec(
                image_paths=images.paths(self.images), missing_images=(images.MISSING_IMAGE,)
            )
            control = ControlPlane(
                kueue=release,
                root=self.root / f"kueue-{release}-{int(started)}",
                node=node,
                label_keys_to_copy=COPIED_LABELS,
            )
            self._planes[release] = control.start()
        return self._planes[release]

    def server_token(self, release: str) -> str:
        """The token of the service account etc/kubernetes/rbac.yaml grants (TokenRequest)."""
        if release not in self._tokens:
            control = self.plane(release)
            control.admin.apply([doc for doc in RBAC if doc])
            self._tokens[release] = control.service_account_token("default", "kernel-queue")
        return self._tokens[release]

    def close(self) -> None:
        for control in self._planes.values():
            control.stop()
        self._planes.clear()

    def __iter__(self) -> Iterator[ControlPlane]:
        return iter(self._planes.values())


def _eviction(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }


def stop_kernels(loop: asyncio.AbstractEventLoop) -> None:
    """The server's own clean-up runs after the cluster fixture's: stop its kernels while the
    cluster still answers, so nothing is left half-deleted and no client retries a closed
    port."""
    if ServerApp.initialized():
        loop.run_until_complete(ServerApp.instance().kernel_manager.shutdown_all())
