"""Kueue's behaviour for plain pods and pod groups as table-driven tests against the fake Kueue.

In-process against a `Store` with the real Kueue CRDs (`../shared/data/kueue/crds`, or
`v0.14/crds` for a cluster of `release="0.14"`) and the apiserver's pod rules; "the pods stop
running" is written by the test as a kubelet would. Every cluster made here checks at teardown
that the fake logged no reconcile error and that every Workload it wrote conforms to the Workload
CRD of its storage version (nothing pruned, no violation). The reasons each release writes are
at the end.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver import pod_rules, resources
from kernel_queue_fake_cluster.apiserver import schema as openapi
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import conversion, releases
from kernel_queue_fake_cluster.kueue.controller import FakeKueue
from prerequisites import KUEUE_DATA, skip_unless_ci

Obj = dict[str, Any]
G = k.KUEUE_GROUP
NS = "team-a"


# -- the cluster under test ------------------------------------------------------------------


class Cluster:
    """A store with Kueue's CRDs, the fake Kueue and the apiserver's pod rules (a pod the test
    ran on a node is held through a graceful delete until the test ends it, as a kubelet's)."""

    def __init__(self, release: str = releases.DEFAULT, **options: Any) -> None:
        self.store = Store()
        namespaces = ("default", "kube-system", "kueue-system", NS, "team-b")
        profile = releases.RELEASES[release]
        crds = KUEUE_DATA / ("v0.14/crds" if release == "0.14" else "crds")
        types = releases.serve(profile, crd_files.load(crds), str(crds))
        resources.install(self.store, crds=types, namespaces=namespaces)
        self.kueue = FakeKueue(self.store, release=profile, **options)
        self.kueue.install()
        pod_rules.install(self.store)
        self.written: list[Obj] = []  # every Workload as written, before pruning
        self.store.add_admission(G, "workloads", self._record)

    def _record(self, operation: str, new: Obj | None, old: Obj | None) -> None:
        if new is not None:
            self.written.append(copy.deepcopy(new))

    async def settle(self) -> None:
        # A bound on a hang, not a speed: on a loaded 2-core machine the passes over 300 pod
        # groups take longer than 5 s (seen failing), and what a test asserts is the outcome.
        await self.kueue.settle(within=60)

    # objects

    def create(self, obj: Obj) -> Obj:
        """Create any manifest by its kind at its apiVersion (Kueue's converted where the
        release serves another), as `kubectl create -f` would."""
        rtype = next(t for t in self.store.types.values() if t.kind == obj["kind"])
        namespace = obj["metadata"].get("namespace", "default") if rtype.namespaced else None
        version = obj["apiVersion"].rpartition("/")[2]
        return self.store.create(rtype.group, rtype.plural, namespace, obj, version=version)

    def queues(
        self,
        *,
        cpu: str | int = 9,
        gpu: int | None = None,
        flavor: Obj | None = None,
        strategy: str = "BestEffortFIFO",
        preemption: str = "Never",
        local_queues: tuple[tuple[str, str], ...] = ((NS, "user-queue"),),
    ) -> None:
        """ResourceFlavor `default-flavor`, ClusterQueue `cluster-queue`, LocalQueues."""
        self.create(_kueue("ResourceFlavor", "default-flavor", spec=flavor or {}))
        covered = ["cpu", "memory"] + (["nvidia.com/gpu"] if gpu is not None else [])
        quota = {"cpu": cpu, "memory": "36Gi", "nvidia.com/gpu": gpu}
        spec = {
            "namespaceSelector": {},
            "queueingStrategy": strategy,
            "preemption": {"withinClusterQueue": preemption},
            "resourceGroups": [
                {
                    "coveredResources": covered,
                    "flavors": [
                        {
                            "name": "default-flavor",
                            "resources": [{"name": r, "nominalQuota": quota[r]} for r in covered],
                        }
                    ],
                }
            ],
        }
        self.create(_kueue("ClusterQueue", "cluster-queue", spec=spec))
        for namespace, name in local_queues:
            self.create(_kueue("LocalQueue", name, namespace, {"clusterQueue": "cluster-queue"}))

    def priority_class(self, name: str, value: int) -> None:
        self.create({**_kueue("WorkloadPriorityClass", name), "value": value})

    def pod(self, name: str, namespace: str = NS, **options: Any) -> Obj:
        return self.store.create("", "pods", namespace, pod_manifest(name, **options))

    def get_pod(self, name: str, namespace: str = NS) -> Obj | None:
        try:
            return self.store.get("", "pods", namespace, name)
        except ApiError:
            return None

    def the_pod(self, name: str, namespace: str = NS) -> Obj:
        found = self.get_pod(name, namespace)
        assert found is not None, f"pod {name} is gone"
        return found

    def the_workload(self, name: str, namespace: str = NS) -> Obj:
        found = self.workload(name, namespace)
        assert found is not None, f"Workload {name} is gone"
        return found

    def workload(self, name: str, namespace: str = NS) -> Obj | None:
        try:
            return self.store.get(G, "workloads", namespace, name)
        except ApiError:
            return None

    def events(self, reason: str, name: str | None = None) -> list[Obj]:
        found, _ = self.store.list_objects("", "events")
        return [
            e
            for e in found
            if e["reason"] == reason and name in (None, e["involvedObject"]["name"])
        ]

    # the kubelet's part, written by the test

    def run(self, name: str, namespace: str = NS) -> None:
        """Bind the pod to a node, then Running and Ready."""
        pod = self.store.get("", "pods", namespace, name)
        pod["spec"]["nodeName"] = "node-1"
        pod = self.store.replace("", "pods", namespace, name, pod)
        pod["status"].update(phase="Running", podIP="10.0.0.1")
        pod["status"]["conditions"] = [
            c for c in pod["status"].get("conditions") or [] if c["type"] != "PodScheduled"
        ] + [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]
        self.store.replace("", "pods", namespace, name, pod, subresource="status")

    def exit(self, name: str, code: int, namespace: str = NS, *, final: bool = True) -> None:
        """The kernel exits with `code`: Succeeded or Failed (Kubernetes >= 1.27), Ready False,
        and (`final`) a terminating pod gets the kubelet's final grace-0 DELETE."""
        pod = self.store.get("", "pods", namespace, name)
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["conditions"] = [
            {**c, "status": "False"} if c["type"] == "Ready" else c
            for c in pod["status"].get("conditions") or []
        ]
        self.store.replace("", "pods", namespace, name, pod, subresource="status")
        if final and pod["metadata"].get("deletionTimestamp"):
            self.store.delete("", "pods", namespace, name, grace_seconds=0)

    # checks made when the test ends

    def check(self) -> None:
        assert self.kueue.errors == []
        stored, _ = self.store.list_objects(G, "workloads")
        for wl in [*self.written, *stored]:
            assert crd_problems(self.store, wl) == [], wl["metadata"]["name"]


def crd_problems(store: Store, wl: Obj) -> list[str]:
    """How `wl` breaks the Workload CRD of its storage version: schema violations (the store's
    validator and jsonschema's) and fields the apiserver would silently prune."""
    rtype = store.type(G, "workloads")
    schema = rtype.schemas[rtype.storage_version]
    pruned, causes = openapi.prune_default_validate(wl, schema)
    problems = [f"{path}: {message}" for path, message in causes]
    problems += [f"{path}: unknown field" for path in _dropped(wl, pruned)]
    problems += [error.message for error in jsonschema.Draft4Validator(schema).iter_errors(wl)]
    return problems


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    if not KUEUE_DATA.is_dir():
        message = f"Kueue's CRDs and examples are not at {KUEUE_DATA}"
        skip_unless_ci(message)
    made: list[Cluster] = []

    def make(**options: Any) -> Cluster:
        made.append(Cluster(**options))
        return made[-1]

    yield make
    for cluster in made:
        cluster.check()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()


def _kueue(kind: str, name: str, namespace: str | None = None, spec: Obj | None = None) -> Obj:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    body: Obj = {"apiVersion": f"{G}/v1beta2", "kind": kind, "metadata": meta}
    return body | ({"spec": spec} if spec is not None else {})


def pod_manifest(
    name: str,
    *,
    group: str | None = None,
    count: int | str | None = None,
    queue: str | None = "user-queue",
    cpu: str | int | None = "1",
    gpu: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: Obj | None = None,
) -> Obj:
    """A kernel pod as the provisioner would create it (a group when `group` is given)."""
    labels = dict(labels or {})
    annotations = dict(annotations or {})
    if queue:
        labels[k.QUEUE_LABEL] = queue
    if group:
        labels[k.GROUP_NAME_LABEL] = group
    if count is not None:
        annotations[k.GROUP_TOTAL_COUNT_ANNOTATION] = str(count)
    requests: Obj = ({"cpu": cpu} if cpu else {}) | ({"nvidia.com/gpu": gpu} if gpu else {})
    container = {"name": "kernel", "image": "kernel:1", "resources": {"requests": requests}}
    body_spec = {"restartPolicy": "Never", "containers": [container], **(spec or {})}
    meta = {"name": name, "labels": labels, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body_spec}


def cond(obj: Obj | None, kind: str) -> Obj:
    """One condition as (status, reason, message) fields, {} when absent."""
    assert obj is not None
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return {key: found[key] for key in ("status", "reason", "message") if key in found}
    return {}


def gates(pod: Obj | None) -> list[str]:
    assert pod is not None
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def _dropped(raw: Any, pruned: Any, path: str = "") -> list[str]:
    """Paths present in `raw` that pruning removed (fields the CRD does not know)."""
    if isinstance(raw, dict) and isinstance(pruned, dict):
        return [
            p
            for key, value in raw.items()
            for p in (
                [f"{path}.{key}"]
                if key not in pruned
                else _dropped(value, pruned[key], f"{path}.{key}")
            )
        ]
    if isinstance(raw, list) and isinstance(pruned, list):
        return [
            p
            for i, (a, b) in enumerate(zip(raw, pruned, strict=False))
            for p in _dropped(a, b, f"{path}[{i}]")
        ]
    return []


def _preempted_message(preemptor: Obj) -> str:
    return (
        f"Preempted to accommodate a workload (UID: {preemptor['metadata']['uid']}, JobUID: "
        "UNKNOWN) due to prioritization in the ClusterQueue; preemptor path: /cluster-queue; "
        "preemptee path: /cluster-queue"
    )


# -- the pod webhook -------------------------------------------------------------------------

MANAGED = {"managed": True, "gates": [k.ADMISSION_GATE, k.TOPOLOGY_GATE], "queue": "user-queue"}
UNTOUCHED = {"managed": False, "gates": []}


@pytest.mark.parametrize(
    ("options", "namespace", "manifest", "want"),
    [
        pytest.param({}, NS, {}, MANAGED, id="queue-name-managed"),
        pytest.param(
            {"topology": False}, NS, {}, MANAGED | {"gates": [k.ADMISSION_GATE]}, id="no-tas-gate"
        ),
        pytest.param(
            {}, NS, {"queue": None}, UNTOUCHED | {"queue": None}, id="no-queue-no-default-lq"
        ),
        pytest.param({}, "kueue-system", {}, UNTOUCHED, id="kueue-namespace-exempt"),
        pytest.param({}, "kube-system", {}, UNTOUCHED, id="kube-system-exempt"),
        pytest.param(
            {"managed_jobs_namespace_selector": {"matchLabels": {"kueue": "on"}}},
            NS,
            {},
            UNTOUCHED,
            id="namespace-selector-no-match",
        ),
        pytest.param(
            {
                "managed_jobs_namespace_selector": {
                    "matchLabels": {"kubernetes.io/metadata.name": NS}
                }
            },
            NS,
            {},
            MANAGED,
            id="namespace-selector-match",
        ),
    ],
)
def test_webhook_defaults(
    make_cluster: Callable[..., Cluster], options: Obj, namespace: str, manifest: Obj, want: Obj
) -> None:
    cluster = make_cluster(**options)
    pod = cluster.pod("kernel-0", namespace, **manifest)
    labels, meta = pod["metadata"].get("labels") or {}, pod["metadata"]
    assert (labels.get(k.MANAGED_LABEL) == "true") is want["managed"]
    assert (k.POD_FINALIZER in (meta.get("finalizers") or [])) is want["managed"]
    assert gates(pod) == want["gates"]
    assert labels.get(k.QUEUE_LABEL) == want.get("queue", "user-queue")
    role = (meta.get("annotations") or {}).get(k.ROLE_HASH_ANNOTATION)
    assert (role is not None and re.fullmatch("[0-9a-f]{8}", role) is not None) is want["managed"]
    if not want["managed"]:
        assert cond(pod, "PodScheduled") == {}  # not SchedulingGated: it runs ungated


def test_webhook_defaults_to_the_local_queue_named_default(cluster: Cluster) -> None:
    cluster.create(_kueue("LocalQueue", "default", NS, {"clusterQueue": "cluster-queue"}))
    pod = cluster.pod("kernel-0", queue=None)
    assert pod["metadata"]["labels"][k.QUEUE_LABEL] == "default"
    assert gates(pod) == [k.ADMISSION_GATE, k.TOPOLOGY_GATE]
    assert cond(pod, "PodScheduled")["reason"] == "SchedulingGated"


def test_role_hash_follows_kueues_spec_shape(cluster: Cluster) -> None:
    def role(name: str, **options: Any) -> str:
        pod = cluster.pod(name, **options)
        return str(pod["metadata"]["annotations"][k.ROLE_HASH_ANNOTATION])

    same = role("a", spec={"terminationGracePeriodSeconds": 120})
    assert role("b") == same  # grace, command, image: not part of the role
    assert role("c", cpu="2") != same
    assert role("d", spec={"nodeSelector": {"disk": "ssd"}}) != same
    assert role("e", annotations={k.ROLE_HASH_ANNOTATION: "0000abcd"}) == "0000abcd"
    # The value Kueue's own webhook test expects for `MakePod` (one container, no requests).
    bare = {"containers": [{"name": "c", "image": "pause", "resources": {"requests": {}}}]}
    assert role("f", cpu=None, spec=bare) == "a9f06f3a"


GROUP_NAME_PATH = f"metadata.labels[{k.GROUP_NAME_LABEL}]"
COUNT_PATH = f"metadata.annotations[{k.GROUP_TOTAL_COUNT_ANNOTATION}]"
BOTH = (
    f"both the '{k.GROUP_TOTAL_COUNT_ANNOTATION}' annotation and the '{k.GROUP_NAME_LABEL}' "
    "label should be set"
)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        pytest.param(
            {"group": "g"}, f"{COUNT_PATH}: Required value: {BOTH}", id="group-without-count"
        ),
        pytest.param(
            {"count": 2}, f"{GROUP_NAME_PATH}: Required value: {BOTH}", id="count-without-group"
        ),
        pytest.param(
            {"group": "g", "count": "two"},
            f'{COUNT_PATH}: Invalid value: "two": strconv.Atoi: parsing "two": invalid syntax',
            id="count-not-int",
        ),
        pytest.param(
            {"group": "g", "count": 0},
            f'{COUNT_PATH}: Invalid value: "0": incorrect annotation value '
            f"'{k.GROUP_TOTAL_COUNT_ANNOTATION}=0': group total count should be greater than zero",
            id="count-zero",
        ),
        pytest.param(
            {"labels": {k.MANAGED_LABEL: "yes"}, "queue": None},
            f"metadata.labels[{k.MANAGED_LABEL}]: Forbidden: "
            "managed label value can only be 'true'",
            id="managed-not-true",
        ),
        pytest.param(
            {"group": "Bad_Name", "count": 1},
            f'{GROUP_NAME_PATH}: Invalid value: "Bad_Name": {openapi.DNS_SUBDOMAIN_MESSAGE}',
            id="group-not-dns",
        ),
        pytest.param(
            {"group": "g", "count": 1, "labels": {k.PREBUILT_WORKLOAD_LABEL: "other"}},
            f'metadata.labels[{k.PREBUILT_WORKLOAD_LABEL}]: Invalid value: "other": '
            "prebuilt workload and pod group should be equal",
            id="prebuilt-not-group",
        ),
    ],
)
def test_webhook_rejects_bad_group_metadata(cluster: Cluster, manifest: Obj, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        cluster.pod("kernel-0", **manifest)
    assert (caught.value.code, caught.value.reason) == (403, "Forbidden")
    assert caught.value.message == f'admission webhook "vpod.kb.io" denied the request: {message}'
    assert cluster.get_pod("kernel-0") is None


@pytest.mark.parametrize(
    ("gated", "change", "error"),
    [
        pytest.param(
            False, {"labels": {k.QUEUE_LABEL: "other"}}, "field is immutable", id="queue-ungated"
        ),
        pytest.param(True, {"labels": {k.QUEUE_LABEL: "other"}}, None, id="queue-gated-ok"),
        pytest.param(
            True, {"labels": {k.GROUP_NAME_LABEL: "h"}}, "field is immutable", id="group-name"
        ),
        pytest.param(
            True,
            {"annotations": {k.RETRIABLE_IN_GROUP_ANNOTATION: "true"}},
            "unretriable pod group can't be converted to retriable",
            id="retriable-back-to-true",
        ),
        pytest.param(
            True,
            {"annotations": {k.RETRIABLE_IN_GROUP_ANNOTATION: "false"}},
            None,
            id="retriable-false-ok",
        ),
    ],
)
async def test_webhook_rejects_forbidden_changes(
    make_cluster: Callable[..., Cluster], gated: bool, change: Obj, error: str | None
) -> None:
    cluster = make_cluster(manual=gated)  # manual: nothing is admitted, the pod stays gated
    cluster.queues()
    annotations = {k.RETRIABLE_IN_GROUP_ANNOTATION: "false"} if "annotations" in change else {}
    cluster.pod("kernel-0", group="g", count=1, annotations=annotations)
    await cluster.settle()
    pod = cluster.get_pod("kernel-0")
    assert pod is not None and bool(gates(pod)) is gated
    for key, values in change.items():
        pod["metadata"].setdefault(key, {}).update(values)
    if error is None:
        cluster.store.replace("", "pods", NS, "kernel-0", pod)
        return
    with pytest.raises(ApiError) as caught:
        cluster.store.replace("", "pods", NS, "kernel-0", pod)
    assert caught.value.code == 403
    assert error in caught.value.message


# -- Workload naming and creation ------------------------------------------------------------


async def test_group_workload_waits_for_total_count_pods(cluster: Cluster) -> None:
    cluster.queues()
    first = cluster.pod("kernel-0", group="kernel-7f3c2a", count=2)
    await cluster.settle()
    assert cluster.workload("kernel-7f3c2a") is None
    [compose] = cluster.events("ErrWorkloadCompose", "kernel-0")
    assert compose["type"] == "Warning"
    assert compose["message"] == "'kernel-7f3c2a' group has fewer runnable pods than expected"

    second = cluster.pod("kernel-1", group="kernel-7f3c2a", count=2)
    await cluster.settle()
    wl = cluster.workload("kernel-7f3c2a")
    assert wl is not None
    meta, spec = wl["metadata"], wl["spec"]
    assert meta["annotations"] == {k.IS_GROUP_WORKLOAD_ANNOTATION: "true"}
    assert meta["finalizers"] == [k.RESOURCE_IN_USE_FINALIZER]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": p["metadata"]["name"],
            "uid": p["metadata"]["uid"],
        }
        for p in (first, second)
    ]
    role = first["metadata"]["annotations"][k.ROLE_HASH_ANNOTATION]
    assert [(s["name"], s["count"]) for s in spec["podSets"]] == [(role, 2)]
    assert spec["podSets"][0]["topologyRequest"] == {"podIndexLabel": k.POD_INDEX_LABEL}
    assert gates(spec["podSets"][0]["template"]) == [k.ADMISSION_GATE, k.TOPOLOGY_GATE]
    assert (spec["active"], spec["queueName"], spec["priority"]) == (True, "user-queue", 0)
    assert "priorityClassRef" not in spec
    assert [e["message"] for e in cluster.events("CreatedWorkload")] == [
        f"Created Workload: {NS}/kernel-7f3c2a"
    ]


async def test_roles_become_pod_sets_sorted_by_hash(cluster: Cluster) -> None:
    cluster.queues()
    made = [cluster.pod(f"p{i}", group="g", count=3, cpu=cpu) for i, cpu in enumerate("121")]
    await cluster.settle()
    roles = {p["metadata"]["annotations"][k.ROLE_HASH_ANNOTATION] for p in made}
    wl = cluster.workload("g")
    assert wl is not None
    counts = {s["name"]: s["count"] for s in wl["spec"]["podSets"]}
    assert sorted(counts) == [s["name"] for s in wl["spec"]["podSets"]] and set(counts) == roles
    assert sorted(counts.values()) == [1, 2]


async def test_fast_admission_creates_the_workload_at_the_first_pod(cluster: Cluster) -> None:
    cluster.queues()
    fast = {k.GROUP_FAST_ADMISSION_ANNOTATION: "true"}
    cluster.pod("kernel-0", group="g", count=3, annotations=fast)
    await cluster.settle()
    wl = cluster.workload("g")
    assert wl is not None and wl["spec"]["podSets"][0]["count"] == 3
    assert cond(wl, k.ADMITTED)["status"] == "True"
    assert gates(cluster.get_pod("kernel-0")) == []


async def test_a_single_pod_gets_a_workload_named_after_it(cluster: Cluster) -> None:
    cluster.queues()
    pod = cluster.pod("kueue-sleep-x7k2p")
    await cluster.settle()
    uid = pod["metadata"]["uid"]
    digest = hashlib.sha1(f"Pod\n\nkueue-sleep-x7k2p\n{uid}".encode()).hexdigest()[:5]
    wl = cluster.workload(f"pod-kueue-sleep-x7k2p-{digest}")
    assert wl is not None
    assert wl["metadata"]["labels"] == {k.JOB_UID_LABEL: uid}
    assert wl["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "kueue-sleep-x7k2p", "uid": uid}
        | {"controller": True, "blockOwnerDeletion": True}
    ]
    assert [s["name"] for s in wl["spec"]["podSets"]] == ["main"]
    assert cond(wl, k.ADMITTED)["status"] == "True"
    assert cluster.the_pod("kueue-sleep-x7k2p")["metadata"]["labels"][k.PODSET_LABEL] == "main"

    cluster.run("kueue-sleep-x7k2p")
    cluster.exit("kueue-sleep-x7k2p", 0)
    await cluster.settle()
    wl = cluster.workload(f"pod-kueue-sleep-x7k2p-{digest}")
    assert cond(wl, k.FINISHED) == {"status": "True", "reason": "Succeeded", "message": ""}
    assert not cluster.the_pod("kueue-sleep-x7k2p")["metadata"].get("finalizers")


async def test_pods_beyond_the_total_count_are_deleted(cluster: Cluster) -> None:
    cluster.queues()
    for i in range(3):
        cluster.pod(f"kernel-{i}", group="g", count=2)
    await cluster.settle()
    wl = cluster.workload("g")
    assert wl is not None and wl["spec"]["podSets"][0]["count"] == 2
    assert [cluster.get_pod(f"kernel-{i}") is None for i in range(3)] == [False, False, True]
    assert [e["message"] for e in cluster.events("ExcessPodDeleted", "kernel-2")] == [
        "Excess pod deleted"
    ]


async def test_a_foreign_workload_with_the_group_name_is_not_adopted(cluster: Cluster) -> None:
    cluster.queues()
    foreign = _kueue("Workload", "g", NS, {"queueName": "user-queue", "podSets": []})
    foreign["spec"]["podSets"] = [
        {"name": "main", "count": 1, "template": {"spec": pod_manifest("x")["spec"]}}
    ]
    cluster.kueue.manual = True
    cluster.create(foreign)
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    [conflict] = cluster.events("WorkloadNameConflict", "kernel-0")
    assert conflict["message"] == (
        'A Workload named "g" already exists but is not a pod group workload; '
        "this pod group cannot be admitted"
    )
    assert gates(cluster.get_pod("kernel-0")) == [k.ADMISSION_GATE, k.TOPOLOGY_GATE]


async def test_missing_workload_priority_class_means_no_workload(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod(
        "kernel-0", group="g", count=1, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "interactive"}
    )
    await cluster.settle()
    assert cluster.workload("g") is None
    [warning] = cluster.events("WorkloadPriorityClassNotFound", "kernel-0")
    assert (warning["type"], warning["message"]) == (
        "Warning",
        'WorkloadPriorityClass "interactive" not found',
    )

    cluster.priority_class("interactive", 1000)
    await cluster.settle()
    wl = cluster.workload("g")
    assert wl is not None and wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": G,
        "kind": "WorkloadPriorityClass",
        "name": "interactive",
    }


# -- admission ---------------------------------------------------------------------------------


async def test_admission_reserves_quota_and_ungates_with_the_flavor(cluster: Cluster) -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    flavor = {"nodeLabels": {"cloud.example/accelerator": "a100"}, "tolerations": [toleration]}
    cluster.queues(gpu=2, flavor=flavor)
    spec = {"nodeSelector": {"disk": "ssd"}, "tolerations": [{"key": "spot", "operator": "Exists"}]}
    cluster.pod("kernel-0", group="g", count=1, cpu="500m", gpu=1, spec=spec)
    await cluster.settle()

    wl = cluster.workload("g")
    assert wl is not None
    role = wl["spec"]["podSets"][0]["name"]
    assert wl["status"]["admission"] == {
        "clusterQueue": "cluster-queue",
        "podSetAssignments": [
            {
                "name": role,
                "count": 1,
                "flavors": {"cpu": "default-flavor", "nvidia.com/gpu": "default-flavor"},
                "resourceUsage": {"cpu": "500m", "nvidia.com/gpu": "1"},
            }
        ],
    }
    assert cond(wl, k.QUOTA_RESERVED) == {
        "status": "True",
        "reason": "QuotaReserved",
        "message": "Quota reserved in ClusterQueue cluster-queue",
    }
    assert cond(wl, k.ADMITTED) == {
        "status": "True",
        "reason": "Admitted",
        "message": "The workload is admitted",
    }
    assert cond(wl, k.PODS_READY) == {
        "status": "False",
        "reason": "WaitForStart",
        "message": "Not all pods are ready or succeeded",
    }
    pod = cluster.get_pod("kernel-0")
    assert pod is not None and gates(pod) == []
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd", "cloud.example/accelerator": "a100"}
    assert pod["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}, toleration]
    labels = pod["metadata"]["labels"]
    assert (labels[k.PODSET_LABEL], labels[k.LOCAL_QUEUE_LABEL], labels[k.CLUSTER_QUEUE_LABEL]) == (
        role,
        "user-queue",
        "cluster-queue",
    )
    assert pod["metadata"]["annotations"][k.WORKLOAD_ANNOTATION] == "g"
    [reserved] = cluster.events("QuotaReserved", "g")
    assert reserved["message"].startswith(
        "Quota reserved in ClusterQueue cluster-queue, wait time since queued was "
    )
    assert [e["message"] for e in cluster.events("Admitted", "g")] == [
        "Admitted by ClusterQueue cluster-queue, wait time since reservation was 0s"
    ]
    assert [e["message"] for e in cluster.events("Started", "kernel-0")] == [
        "Admitted by clusterQueue cluster-queue"
    ]

    cluster.run("kernel-0")
    await cluster.settle()
    assert cond(cluster.workload("g"), k.PODS_READY) == {
        "status": "True",
        "reason": "Started",
        "message": "All pods reached readiness and the workload is running",
    }


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        pytest.param(
            {"cpu": 10},
            "insufficient quota for cpu in flavor default-flavor, previously considered podsets "
            "requests (0) + current podset request (10) > maximum capacity (9)",
            id="larger-than-quota",
        ),
        pytest.param(
            {"gpu": 1},
            "resource nvidia.com/gpu unavailable in ClusterQueue",
            id="undeclared-resource",
        ),
    ],
)
async def test_requests_that_can_never_fit_wait_with_kueues_message(
    cluster: Cluster, manifest: Obj, message: str
) -> None:
    cluster.queues()
    pod = cluster.pod("kernel-0", group="g", count=1, **manifest)
    await cluster.settle()
    role = pod["metadata"]["annotations"][k.ROLE_HASH_ANNOTATION]
    assert cond(cluster.workload("g"), k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": "Pending",
        "message": f"couldn't assign flavors to pod set {role}: {message}",
    }
    assert k.ADMITTED not in {c["type"] for c in cluster.the_workload("g")["status"]["conditions"]}
    assert gates(cluster.get_pod("kernel-0")) != []
    assert len(cluster.events("Pending", "g")) == 1


async def test_a_request_larger_than_free_quota_waits_for_it(cluster: Cluster) -> None:
    cluster.queues(cpu=4)
    cluster.pod("a-0", group="a", count=1, cpu=3)
    cluster.pod("b-0", group="b", count=1, cpu=2)
    await cluster.settle()
    role = cluster.the_workload("b")["spec"]["podSets"][0]["name"]
    assert cond(cluster.workload("b"), k.QUOTA_RESERVED)["message"] == (
        f"couldn't assign flavors to pod set {role}: insufficient unused quota for cpu in flavor "
        "default-flavor, 1 more needed"
    )
    cluster.run("a-0")
    cluster.exit("a-0", 0)
    await cluster.settle()
    assert cond(cluster.workload("a"), k.FINISHED)["message"] == "Pods succeeded: 1/1."
    assert cond(cluster.workload("b"), k.ADMITTED)["status"] == "True"


async def test_set_quota_admits_what_now_fits(cluster: Cluster) -> None:
    cluster.queues(cpu=1)
    cluster.pod("a-0", group="a", count=1, cpu=2)
    await cluster.settle()
    assert cond(cluster.workload("a"), k.QUOTA_RESERVED)["status"] == "False"
    cluster.kueue.set_quota("cluster-queue", "default-flavor", {"cpu": "2"})
    await cluster.settle()
    assert cond(cluster.workload("a"), k.QUOTA_RESERVED)["status"] == "True"


async def test_manual_mode_admits_only_what_the_test_admits(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(manual=True)
    cluster.queues()
    cluster.pod("a-0", group="a", count=1)
    cluster.pod("b-0", group="b", count=1)
    await cluster.settle()
    assert [cond(cluster.workload(n), k.QUOTA_RESERVED) for n in "ab"] == [{}, {}]
    cluster.kueue.admit("b")
    await cluster.settle()
    assert cond(cluster.workload("a"), k.QUOTA_RESERVED) == {}
    assert cond(cluster.workload("b"), k.ADMITTED)["status"] == "True"
    assert gates(cluster.get_pod("b-0")) == []
    cluster.kueue.manual = False
    await cluster.settle()
    assert cond(cluster.workload("a"), k.ADMITTED)["status"] == "True"


async def test_higher_priority_is_admitted_first(cluster: Cluster) -> None:
    cluster.queues(cpu=1)
    cluster.priority_class("high", 100)
    cluster.pod("first-0", group="first", count=1)
    await cluster.settle()
    cluster.pod("low-0", group="low", count=1)
    cluster.pod("high-0", group="high", count=1, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "high"})
    await cluster.settle()
    names = [
        i["metadata"]["name"]
        for i in cluster.kueue.pending_workloads_for_cluster_queue("cluster-queue")["items"]
    ]
    assert names == ["high", "low"]
    cluster.run("first-0")
    cluster.exit("first-0", 0)
    await cluster.settle()
    assert cond(cluster.workload("high"), k.ADMITTED)["status"] == "True"
    assert cond(cluster.workload("low"), k.ADMITTED) == {}


@pytest.mark.parametrize(
    ("strategy", "small_admitted"), [("BestEffortFIFO", True), ("StrictFIFO", False)]
)
async def test_queueing_strategy_decides_whether_the_head_blocks(
    cluster: Cluster, strategy: str, small_admitted: bool
) -> None:
    cluster.queues(cpu=4, strategy=strategy)
    cluster.pod("first-0", group="first", count=1, cpu=2)
    await cluster.settle()
    cluster.pod("head-0", group="head", count=1, cpu=4)
    await cluster.settle()
    cluster.pod("small-0", group="small", count=1, cpu=1)
    await cluster.settle()
    assert cond(cluster.workload("head"), k.QUOTA_RESERVED)["status"] == "False"
    assert (cond(cluster.workload("small"), k.ADMITTED).get("status") == "True") is small_admitted


# -- eviction, preemption, replacement pods ----------------------------------------------------


async def test_preemption_stops_the_victim_and_waits_for_its_pods(cluster: Cluster) -> None:
    cluster.queues(cpu=4, preemption="LowerPriority")
    cluster.priority_class("low", 10)
    cluster.priority_class("high", 1000)
    cluster.pod(
        "low-0", group="low", count=1, cpu=4, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "low"}
    )
    await cluster.settle()
    cluster.run("low-0")
    cluster.pod(
        "high-0", group="high", count=1, cpu=4, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "high"}
    )
    await cluster.settle()

    high, low = cluster.the_workload("high"), cluster.the_workload("low")
    uid = low["metadata"]["uid"]
    message = _preempted_message(high)
    assert cond(low, k.EVICTED) == {"status": "True", "reason": "Preempted", "message": message}
    assert cond(low, k.PREEMPTED) == {
        "status": "True",
        "reason": "InClusterQueue",
        "message": message,
    }
    assert cond(low, k.QUOTA_RESERVED)["status"] == "True"  # held until its pod stops
    assert low["status"]["schedulingStats"] == {
        "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]
    }
    victim = cluster.get_pod("low-0")
    assert victim is not None and victim["metadata"].get("deletionTimestamp")
    assert victim["metadata"]["deletionGracePeriodSeconds"] == 30
    assert cond(victim, k.TERMINATION_TARGET) == {
        "status": "True",
        "reason": "WorkloadEvictedDueToPreempted",
        "message": message,
    }
    assert cond(victim, "DisruptionTarget") == {}
    assert [e["message"] for e in cluster.events("Stopped", "low-0")] == [message]
    assert len(cluster.events("EvictedDueToPreempted", "low")) == 1
    assert cluster.events("Preempted", "low")[0]["message"].startswith(
        message + "; preemptor effective priority: 1000"
    )
    assert len(cluster.events("PreemptedWorkload", "high")) == 1
    role = high["spec"]["podSets"][0]["name"]
    assert cond(high, k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": "Pending",
        "message": f"couldn't assign flavors to pod set {role}: insufficient unused quota for "
        "cpu in flavor default-flavor, 4 more needed. Pending the preemption of 1 workload(s)",
    }
    assert gates(cluster.get_pod("high-0")) != []

    cluster.exit("low-0", 143)
    await cluster.settle()
    low = cluster.workload("low")
    assert cond(low, k.REQUEUED) == {"status": "True", "reason": "Preempted", "message": message}
    assert cond(low, k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": "Pending",
        "message": message,
    }
    assert cond(low, k.ADMITTED) == {
        "status": "False",
        "reason": "NoReservation",
        "message": "The workload has no reservation",
    }
    assert cond(low, k.WAITING_FOR_REPLACEMENT_PODS) == {
        "status": "True",
        "reason": "Preempted",
        "message": message,
    }
    assert cond(low, k.EVICTED)["status"] == "True"
    assert "admission" not in low["status"]
    assert low["status"]["accumulatedPastExecutionTimeSeconds"] >= 0
    assert cond(cluster.workload("high"), k.ADMITTED)["status"] == "True"
    assert gates(cluster.get_pod("high-0")) == []
    assert k.POD_FINALIZER in cluster.the_pod("low-0")["metadata"]["finalizers"]
    assert cluster.kueue.pending_workloads_for_cluster_queue("cluster-queue")["items"] == []

    # A replacement pod rejoins the Workload; the old pod is finalized and goes.
    cluster.pod(
        "low-1", group="low", count=1, cpu=4, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "low"}
    )
    await cluster.settle()
    assert cluster.get_pod("low-0") is None
    low = cluster.workload("low")
    assert cond(low, k.WAITING_FOR_REPLACEMENT_PODS) == {
        "status": "False",
        "reason": "PodsReady",
        "message": "No pods need replacement",
    }
    assert low["metadata"]["uid"] == uid  # the same Workload all along
    [item] = cluster.kueue.pending_workloads_for_cluster_queue("cluster-queue")["items"]
    assert (item["metadata"]["name"], item["positionInClusterQueue"]) == ("low", 0)

    cluster.run("high-0")
    cluster.exit("high-0", 0)
    await cluster.settle()
    low = cluster.workload("low")
    assert cond(low, k.ADMITTED)["status"] == "True"
    assert cond(low, k.EVICTED) == {
        "status": "False",
        "reason": "QuotaReserved",
        "message": "Previously: " + message,
    }
    assert cond(low, k.PREEMPTED)["status"] == "False"
    assert gates(cluster.get_pod("low-1")) == []


@pytest.mark.parametrize(
    ("code", "finished"),
    [pytest.param(0, True, id="exit-0-finishes"), pytest.param(143, False, id="exit-143-requeues")],
)
async def test_exit_code_during_eviction_decides_finish_or_requeue(
    cluster: Cluster, code: int, finished: bool
) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cluster.run("kernel-0")
    cluster.kueue.preempt("g")
    await cluster.settle()
    cluster.exit("kernel-0", code, final=False)
    await cluster.settle()
    wl = cluster.workload("g")
    if finished:
        assert cond(wl, k.FINISHED) == {
            "status": "True",
            "reason": "Succeeded",
            "message": "Pods succeeded: 1/1.",
        }
        assert cond(wl, k.REQUEUED) == {}
        assert wl is not None and not wl["metadata"].get("finalizers")
        assert not cluster.the_pod("kernel-0")["metadata"].get("finalizers")
        cluster.store.delete("", "pods", NS, "kernel-0", grace_seconds=0)  # the kubelet's last word
        await cluster.settle()
        assert cluster.get_pod("kernel-0") is None
        assert cluster.workload("g") is None  # no owner pod left: garbage-collected
    else:
        assert cond(wl, k.FINISHED) == {}
        assert cond(wl, k.REQUEUED)["status"] == "True"
        assert cond(wl, k.WAITING_FOR_REPLACEMENT_PODS)["status"] == "True"
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    assert cq["status"]["reservingWorkloads"] == 0


async def test_eviction_for_another_reason_requeues_false(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cluster.kueue.evict("g")  # ungated but not running yet: stopped, and the quota goes at once
    await cluster.settle()
    wl = cluster.workload("g")
    timeout = f"Exceeded the PodsReady timeout {NS}/g"
    assert cond(wl, k.REQUEUED) == {
        "status": "False",
        "reason": "PodsReadyTimeout",
        "message": timeout,
    }
    assert cond(wl, k.WAITING_FOR_REPLACEMENT_PODS)["reason"] == "PodsReadyTimeout"
    assert wl is not None and wl["status"]["schedulingStats"]["evictions"] == [
        {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 1}
    ]
    assert cond(cluster.get_pod("kernel-0"), k.TERMINATION_TARGET)["reason"] == (
        "WorkloadEvictedDueToPodsReadyTimeout"
    )
    assert [e["message"] for e in cluster.events("EvictedDueToPodsReadyTimeout", "g")] == [timeout]
    with pytest.raises(ValueError, match="holds no quota"):
        cluster.kueue.evict("g")
    # No requeue backoff is modelled: a replacement pod is admitted at once.
    cluster.pod("kernel-1", group="g", count=1)
    await cluster.settle()
    assert cond(cluster.workload("g"), k.EVICTED) == {
        "status": "False",
        "reason": "QuotaReserved",
        "message": "Previously: " + timeout,
    }


async def test_deactivation_evicts_and_reactivation_requeues(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cluster.run("kernel-0")
    wl = cluster.workload("g")
    assert wl is not None
    wl["spec"]["active"] = False
    cluster.store.replace(G, "workloads", NS, "g", wl)
    await cluster.settle()
    deactivated = "The workload is deactivated"
    assert cond(cluster.workload("g"), k.EVICTED) == {
        "status": "True",
        "reason": "Deactivated",
        "message": deactivated,
    }
    assert (
        cond(cluster.get_pod("kernel-0"), k.TERMINATION_TARGET)["reason"]
        == "WorkloadEvictedDueToDeactivated"
    )
    cluster.exit("kernel-0", 143)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.REQUEUED) == {
        "status": "False",
        "reason": "Deactivated",
        "message": deactivated,
    }
    assert cond(wl, k.QUOTA_RESERVED)["status"] == "False"
    assert cluster.kueue.pending_workloads_for_local_queue(NS, "user-queue")["items"] == []

    assert wl is not None
    wl["spec"]["active"] = True
    cluster.store.replace(G, "workloads", NS, "g", wl)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.REQUEUED) == {
        "status": "True",
        "reason": "Reactivated",
        "message": "The workload was reactivated",
    }
    assert cond(wl, k.ADMITTED)["status"] == "False"  # waiting for replacement pods
    cluster.pod("kernel-1", group="g", count=1)
    await cluster.settle()
    assert cond(cluster.workload("g"), k.ADMITTED)["status"] == "True"
    assert gates(cluster.get_pod("kernel-1")) == []


async def test_deleting_the_workload_stops_all_pods_and_strips_finalizers(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=2)
    cluster.pod("kernel-1", group="g", count=2)
    await cluster.settle()
    cluster.run("kernel-0")
    cluster.run("kernel-1")
    cluster.exit("kernel-1", 0)
    await cluster.settle()
    cluster.store.delete(G, "workloads", NS, "g")
    await cluster.settle()
    assert cluster.workload("g") is None
    assert cluster.get_pod("kernel-1") is None  # finished pods are deleted too
    running = cluster.get_pod("kernel-0")
    assert running is not None and running["metadata"].get("finalizers") in (None, [])
    assert cond(running, k.TERMINATION_TARGET) == {
        "status": "True",
        "reason": "WorkloadDeleted",
        "message": "Workload is deleted",
    }
    cluster.exit("kernel-0", 143)
    assert cluster.get_pod("kernel-0") is None


async def test_retriable_in_group_false_ends_the_group(cluster: Cluster) -> None:
    cluster.queues()
    for i in range(2):
        cluster.pod(f"kernel-{i}", group="g", count=2)
    await cluster.settle()
    for i in range(2):
        cluster.run(f"kernel-{i}")
    pod = cluster.get_pod("kernel-0")
    assert pod is not None
    pod["metadata"]["annotations"][k.RETRIABLE_IN_GROUP_ANNOTATION] = "false"
    cluster.store.replace("", "pods", NS, "kernel-0", pod)
    for i in range(2):
        cluster.store.delete("", "pods", NS, f"kernel-{i}")
    await cluster.settle()
    assert cond(cluster.workload("g"), k.FINISHED) == {}
    for i in range(2):
        cluster.exit(f"kernel-{i}", 143, final=False)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.FINISHED) == {
        "status": "True",
        "reason": "Succeeded",
        "message": "Pods succeeded: 0/2.",
    }
    assert wl is not None and not wl["metadata"].get("finalizers")
    assert not any(cluster.the_pod(f"kernel-{i}")["metadata"].get("finalizers") for i in range(2))
    assert [e["message"] for e in cluster.events("FinishedWorkload")] == [
        f"Workload '{NS}/g' is declared finished"
    ]
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    assert cq["status"]["reservingWorkloads"] == 0


async def test_a_deleted_pod_of_an_admitted_group_frees_nothing(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cluster.run("kernel-0")
    cluster.store.delete("", "pods", NS, "kernel-0")
    cluster.exit("kernel-0", 143)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.ADMITTED)["status"] == "True"
    assert cond(wl, k.WAITING_FOR_REPLACEMENT_PODS) == {
        "status": "True",
        "reason": "PodsFailed",
        "message": "Some Failed pods need replacement",
    }
    assert k.POD_FINALIZER in cluster.the_pod("kernel-0")["metadata"]["finalizers"]


# -- queues: visibility and status -------------------------------------------------------------


async def test_visibility_positions_per_cluster_queue_and_local_queue(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(manual=True)
    cluster.queues(local_queues=((NS, "user-queue"), ("team-b", "other-queue")))
    cluster.priority_class("high", 100)
    made = {
        "a1": cluster.pod("a1-0", group="a1", count=1),
        "b1": cluster.pod("b1-0", "team-b", group="b1", count=1, queue="other-queue",
                          labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "high"}),
        "a2": cluster.pod("a2-0", group="a2", count=1),
    }  # fmt: skip
    await cluster.settle()

    summary = cluster.kueue.pending_workloads_for_cluster_queue("cluster-queue")
    assert (summary["kind"], summary["apiVersion"], summary["metadata"]) == (
        "PendingWorkloadsSummary",
        "visibility.kueue.x-k8s.io/v1beta2",
        {},
    )
    b1 = cluster.workload("b1", "team-b")
    assert b1 is not None
    pod = made["b1"]["metadata"]
    assert summary["items"][0] == {
        "metadata": {
            "name": "b1",
            "namespace": "team-b",
            "creationTimestamp": b1["metadata"]["creationTimestamp"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "b1-0", "uid": pod["uid"]}
            ],
        },
        "priority": 100,
        "localQueueName": "other-queue",
        "positionInClusterQueue": 0,
        "positionInLocalQueue": 0,
    }
    positions = [
        (i["metadata"]["name"], i["positionInClusterQueue"], i["positionInLocalQueue"])
        for i in summary["items"]
    ]
    assert positions == [("b1", 0, 0), ("a1", 1, 0), ("a2", 2, 1)]
    local = cluster.kueue.pending_workloads_for_local_queue(NS, "user-queue")["items"]
    assert [
        (i["metadata"]["name"], i["positionInClusterQueue"], i["positionInLocalQueue"])
        for i in local
    ] == [
        ("a1", 1, 0),
        ("a2", 2, 1),
    ]
    page = cluster.kueue.pending_workloads_for_cluster_queue("cluster-queue", limit=1, offset=1)
    assert [i["metadata"]["name"] for i in page["items"]] == ["a1"]
    for call, what in (
        (lambda: cluster.kueue.pending_workloads_for_local_queue(NS, "nope"), "localqueue"),
        (lambda: cluster.kueue.pending_workloads_for_cluster_queue("nope"), "clusterqueue"),
    ):
        with pytest.raises(ApiError) as caught:
            call()
        assert (caught.value.code, caught.value.message) == (
            404,
            f'{what}.visibility.kueue.x-k8s.io "nope" not found',
        )

    cluster.kueue.admit("b1")
    await cluster.settle()
    local = cluster.kueue.pending_workloads_for_local_queue(NS, "user-queue")["items"]
    assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in local] == [
        ("a1", 0),
        ("a2", 1),
    ]


async def test_queue_status_counts_usage_and_active(cluster: Cluster) -> None:
    cluster.queues(cpu=2)
    for name in ("a", "b", "c"):
        cluster.pod(f"{name}-0", group=name, count=1, cpu=1)
    cluster.create(_kueue("LocalQueue", "orphan", NS, {"clusterQueue": "missing-cq"}))
    await cluster.settle()
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    usage = [
        {
            "name": "default-flavor",
            "resources": [
                {"name": "cpu", "total": "2", "borrowed": "0"},
                {"name": "memory", "total": "0", "borrowed": "0"},
            ],
        }
    ]
    status = cq["status"]
    assert (
        status["pendingWorkloads"],
        status["reservingWorkloads"],
        status["admittedWorkloads"],
    ) == (1, 2, 2)
    assert status["flavorsUsage"] == usage and status["flavorsReservation"] == usage
    assert cond(cq, "Active") == {
        "status": "True",
        "reason": "Ready",
        "message": "Can admit new workloads",
    }
    lq = cluster.store.get(G, "localqueues", NS, "user-queue")
    assert (lq["status"]["pendingWorkloads"], lq["status"]["admittedWorkloads"]) == (1, 2)
    assert lq["status"]["flavorsUsage"][0]["resources"][0] == {"name": "cpu", "total": "2"}
    assert cond(lq, "Active") == {
        "status": "True",
        "reason": "Ready",
        "message": "Can submit new workloads to localQueue",
    }
    orphan = cluster.store.get(G, "localqueues", NS, "orphan")
    assert cond(orphan, "Active") == {
        "status": "False",
        "reason": "ClusterQueueDoesNotExist",
        "message": "Can't submit new workloads to clusterQueue",
    }
    cluster.pod("o-0", group="o", count=1, queue="orphan")
    cluster.pod("n-0", group="n", count=1, queue="no-such-queue")
    await cluster.settle()
    assert cond(cluster.workload("o"), k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": "Inadmissible",
        "message": "ClusterQueue missing-cq is terminating or missing",
    }
    assert (
        cond(cluster.workload("n"), k.QUOTA_RESERVED)["message"]
        == "LocalQueue no-such-queue is terminating or missing"
    )


async def test_each_local_queue_counts_only_its_own_namespaces_workloads(cluster: Cluster) -> None:
    """Two namespaces share one ClusterQueue: each LocalQueue's status (what a user of that
    namespace may read) counts and sums only its own Workloads, at v1beta2 and as v1beta1 serves
    it (`flavorUsage`); the ClusterQueue counts both."""
    cluster.queues(cpu=2, local_queues=((NS, "user-queue"), ("team-b", "other-queue")))
    cluster.pod("a-0", group="a", count=1, cpu=1)
    cluster.pod("b-0", "team-b", group="b", count=1, cpu=1, queue="other-queue")
    await cluster.settle()
    cluster.pod("c-0", group="c", count=1, cpu=1)  # no CPU left: pending in team-a
    await cluster.settle()

    def counts(namespace: str, name: str) -> tuple[int, int, int, str]:
        status = cluster.store.get(G, "localqueues", namespace, name)["status"]
        (cpu,) = [r for r in status["flavorsUsage"][0]["resources"] if r["name"] == "cpu"]
        counted = (status["pendingWorkloads"], status["reservingWorkloads"])
        return (*counted, status["admittedWorkloads"], cpu["total"])

    assert counts(NS, "user-queue") == (1, 1, 1, "1")
    assert counts("team-b", "other-queue") == (0, 1, 1, "1")
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")["status"]
    assert (cq["pendingWorkloads"], cq["admittedWorkloads"]) == (1, 2)
    v1beta2 = cluster.store.get(G, "localqueues", NS, "user-queue")
    v1beta1 = conversion.convert(v1beta2, f"{G}/v1beta1")["status"]
    assert "flavorsUsage" not in v1beta1
    assert v1beta1["flavorUsage"] == v1beta2["status"]["flavorsUsage"]


async def test_a_cluster_queue_with_a_missing_flavor_is_inactive(cluster: Cluster) -> None:
    spec = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {"name": "gpu-flavor", "resources": [{"name": "cpu", "nominalQuota": 4}]}
                ],
            }
        ],
    }
    cluster.create(_kueue("ClusterQueue", "cluster-queue", spec=spec))
    cluster.create(_kueue("LocalQueue", "user-queue", NS, {"clusterQueue": "cluster-queue"}))
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    assert cond(cq, "Active") == {
        "status": "False",
        "reason": "FlavorNotFound",
        "message": "Can't admit new workloads: references missing ResourceFlavor(s): gpu-flavor.",
    }
    assert (
        cond(cluster.workload("g"), k.QUOTA_RESERVED)["message"]
        == "ClusterQueue cluster-queue is inactive"
    )
    assert (
        cond(cluster.store.get(G, "localqueues", NS, "user-queue"), "Active")["reason"]
        == "ClusterQueueIsInactive"
    )
    cluster.create(_kueue("ResourceFlavor", "gpu-flavor", spec={}))
    await cluster.settle()
    assert cond(cluster.workload("g"), k.ADMITTED)["status"] == "True"


async def test_namespace_selector_of_the_cluster_queue(cluster: Cluster) -> None:
    cluster.queues()
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    cq["spec"]["namespaceSelector"] = {"matchLabels": {"team": "ml"}}
    cluster.store.replace(G, "clusterqueues", None, "cluster-queue", cq)
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    assert cond(cluster.workload("g"), k.QUOTA_RESERVED)["message"] == (
        "workload namespace doesn't match ClusterQueue selector"
    )
    namespace = cluster.store.get("", "namespaces", None, NS)
    namespace["metadata"]["labels"] = {"team": "ml"}
    cluster.store.replace("", "namespaces", None, NS, namespace)
    await cluster.settle()
    assert cond(cluster.workload("g"), k.ADMITTED)["status"] == "True"


async def test_stop_policy_hold_and_drain_then_restart(cluster: Cluster) -> None:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    cq["spec"]["stopPolicy"] = "HoldAndDrain"
    cluster.store.replace(G, "clusterqueues", None, "cluster-queue", cq)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.EVICTED) == {
        "status": "True",
        "reason": "ClusterQueueStopped",
        "message": "The ClusterQueue is stopped",
    }
    assert cond(wl, k.REQUEUED)["reason"] == "ClusterQueueStopped"
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    assert cond(cq, "Active")["reason"] == "Stopped"
    cq["spec"]["stopPolicy"] = "None"
    cluster.store.replace(G, "clusterqueues", None, "cluster-queue", cq)
    await cluster.settle()
    wl = cluster.workload("g")
    assert cond(wl, k.REQUEUED) == {
        "status": "True",
        "reason": "ClusterQueueRestarted",
        "message": "The ClusterQueue was restarted after being stopped",
    }


def test_the_crd_check_sees_unknown_and_invalid_fields(cluster: Cluster) -> None:
    wl = _kueue("Workload", "g", NS, {"queueName": "q", "podSets": []})
    wl["spec"]["podSets"] = [{"name": "Main", "template": {"spec": pod_manifest("x")["spec"]}}]
    wl["status"] = {"admission": {"clusterQueue": "cq", "podSetAssignments": []}, "flavour": "x"}
    problems = crd_problems(cluster.store, wl)
    assert ".status.flavour: unknown field" in problems
    assert any(p.startswith("spec.podSets[0].name") for p in problems)


# -- Kueue's own examples, and scale -----------------------------------------------------------


async def test_kueues_example_manifests_load_and_the_group_is_admitted(cluster: Cluster) -> None:
    for name in ("admin-single-clusterqueue-setup.yaml", "pods-kueue-kueue-pod-group.yaml"):
        with (KUEUE_DATA / "examples" / name).open() as stream:
            for document in yaml.safe_load_all(stream):
                if document:
                    cluster.create(document)
    await cluster.settle()
    wl = cluster.workload("sample-group", "default")
    assert wl is not None
    assert [s["count"] for s in wl["spec"]["podSets"]] == [2]
    assert cond(wl, k.ADMITTED)["status"] == "True"
    assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {"cpu": "6"}
    found, _ = cluster.store.list_objects("", "pods", "default")
    assert len(found) == 2 and all(gates(p) == [] for p in found)


@pytest.mark.parametrize(
    "groups", [pytest.param(1, id="one-group-of-300"), pytest.param(300, id="300-groups")]
)
async def test_a_burst_of_pods_is_reconciled_in_coalesced_passes(
    cluster: Cluster, groups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.queues(cpu=400)
    calls: list[str] = []
    reconcile, schedule = cluster.kueue.groups.reconcile, cluster.kueue.scheduler.schedule

    def counted(step: Callable[[Any], None], name: str) -> Callable[[Any], None]:
        def wrapper(arg: Any) -> None:
            calls.append(name)
            step(arg)

        wrapper.__name__ = name
        return wrapper

    monkeypatch.setattr(cluster.kueue.groups, "reconcile", counted(reconcile, "reconcile"))
    monkeypatch.setattr(cluster.kueue.scheduler, "schedule", counted(schedule, "schedule"))
    for i in range(300):
        cluster.pod(f"kernel-{i}", group=f"g{i % groups}", count=300 // groups)
    await cluster.settle()
    assert all(
        cond(cluster.workload(f"g{i}"), k.ADMITTED)["status"] == "True" for i in range(groups)
    )
    assert all(gates(p) == [] for p in cluster.store.list_objects("", "pods", NS)[0])
    assert calls.count("reconcile") <= 4 * groups  # per group: create, ungate, status
    assert calls.count("schedule") <= 4  # per pass, not per pod


# -- per Kueue release: the reasons of QuotaReserved=False, PodsReady, priority defaulting -----


def _edit_cluster_queue(cluster: Cluster, **spec: Any) -> None:
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    cq["spec"].update(spec)
    cluster.store.replace(G, "clusterqueues", None, "cluster-queue", cq)


async def _larger_than_quota(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1, cpu=10)
    return "g", (
        "couldn't assign flavors to pod set {role}: insufficient quota for cpu in flavor "
        "default-flavor, previously considered podsets requests (0) + current podset request "
        "(10) > maximum capacity (9)"
    )


async def _undeclared_resource(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1, gpu=1)
    return (
        "g",
        "couldn't assign flavors to pod set {role}: resource nvidia.com/gpu unavailable in "
        "ClusterQueue",
    )


async def _short_of_quota(cluster: Cluster) -> tuple[str, str]:
    cluster.queues(cpu=4)
    cluster.pod("a-0", group="a", count=1, cpu=3)
    await cluster.settle()
    cluster.pod("b-0", group="b", count=1, cpu=2)
    return "b", (
        "couldn't assign flavors to pod set {role}: insufficient unused quota for cpu in flavor "
        "default-flavor, 1 more needed"
    )


async def _preempting(cluster: Cluster) -> tuple[str, str]:
    cluster.queues(cpu=4, preemption="LowerPriority")
    cluster.priority_class("low", 100)
    cluster.priority_class("high", 1000)
    labels = {k.WORKLOAD_PRIORITY_CLASS_LABEL: "low"}
    cluster.pod("low-0", group="low", count=1, cpu=4, labels=labels)
    await cluster.settle()
    cluster.run("low-0")
    labels = {k.WORKLOAD_PRIORITY_CLASS_LABEL: "high"}
    cluster.pod("high-0", group="high", count=1, cpu=4, labels=labels)
    return "high", (
        "couldn't assign flavors to pod set {role}: insufficient unused quota for cpu in flavor "
        "default-flavor, 4 more needed. Pending the preemption of 1 workload(s)"
    )


async def _requeued_after_preemption(cluster: Cluster) -> tuple[str, str]:
    await _preempting(cluster)
    await cluster.settle()
    cluster.exit("low-0", 143)
    return "low", _preempted_message(cluster.the_workload("high"))


async def _local_queue_missing(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1, queue="no-such-queue")
    return "g", "LocalQueue no-such-queue is terminating or missing"


async def _cluster_queue_held(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    _edit_cluster_queue(cluster, stopPolicy="Hold")
    cluster.pod("kernel-0", group="g", count=1)
    return "g", "ClusterQueue cluster-queue is stopped"


async def _cluster_queue_inactive(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    cluster.store.delete(G, "resourceflavors", None, "default-flavor")
    cluster.pod("kernel-0", group="g", count=1)
    return "g", "ClusterQueue cluster-queue is inactive"


async def _namespace_not_selected(cluster: Cluster) -> tuple[str, str]:
    cluster.queues()
    _edit_cluster_queue(cluster, namespaceSelector={"matchLabels": {"team": "ml"}})
    cluster.pod("kernel-0", group="g", count=1)
    words = "orkload namespace doesn't match ClusterQueue selector"
    return "g", ("W" if cluster.kueue.release.name == "0.14" else "w") + words


REASONS = {
    # case: (its set-up, QuotaReserved=False reason on 0.14 and 0.19, on 0.20)
    "larger-than-quota": (_larger_than_quota, "Pending", "ExceedsMaxQuota"),
    "undeclared-resource": (_undeclared_resource, "Pending", "NoMatchingFlavor"),
    "short-of-quota": (_short_of_quota, "Pending", "WaitingForQuota"),
    "preempting": (_preempting, "Pending", "WaitingForPreemptedWorkloads"),
    "requeued": (_requeued_after_preemption, "Pending", "PendingEvaluation"),
    "local-queue-missing": (_local_queue_missing, "Inadmissible", "Misconfigured"),
    "cluster-queue-held": (_cluster_queue_held, "Inadmissible", "Suspended"),
    "cluster-queue-inactive": (_cluster_queue_inactive, "Pending", "Suspended"),
    "namespace-not-selected": (_namespace_not_selected, "Pending", "Misconfigured"),
}


@pytest.mark.parametrize("release", ["0.14", "0.19", "0.20"])
@pytest.mark.parametrize("case", list(REASONS))
async def test_quota_reserved_false_has_each_releases_reason_and_kueues_message(
    make_cluster: Callable[..., Cluster], case: str, release: str
) -> None:
    cluster = make_cluster(release=release)
    setup, legacy, granular = REASONS[case]
    name, message = await setup(cluster)
    await cluster.settle()
    wl = cluster.the_workload(name)
    role = wl["spec"]["podSets"][0]["name"]
    reason = granular if release == "0.20" else legacy
    assert cond(wl, k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": reason,
        "message": message.format(role=role),
    }
    if case != "requeued":  # the scheduler's and the workload controller's Warning event
        assert [e["message"] for e in cluster.events(reason, name)] == [message.format(role=role)]


@pytest.mark.parametrize(("release", "ready"), [("0.14", False), ("0.19", True), ("0.20", True)])
async def test_the_pods_ready_condition_comes_with_wait_for_pods_ready_from_0_19(
    make_cluster: Callable[..., Cluster], release: str, ready: bool
) -> None:
    cluster = make_cluster(release=release)
    cluster.queues()
    cluster.pod("kernel-0", group="g", count=1)
    await cluster.settle()
    cluster.run("kernel-0")
    await cluster.settle()
    wl = cluster.the_workload("g")
    assert cond(wl, k.ADMITTED)["status"] == "True"
    assert cond(wl, k.PODS_READY) == (
        {"status": "True", "reason": "Started", "message": k.READY_MESSAGE} if ready else {}
    )


@pytest.mark.parametrize(
    ("release", "labels", "priority"),
    [
        pytest.param("0.19", {}, None, id="0.19-unlabelled-no-default"),
        pytest.param("0.20", {}, ("default", 10), id="0.20-unlabelled-gets-default"),
        pytest.param(
            "0.20",
            {k.WORKLOAD_PRIORITY_CLASS_LABEL: "low"},
            ("low", 1),
            id="0.20-labelled-keeps-its-own",
        ),
    ],
)
async def test_priority_class_defaulting_from_0_20_never_relabels_a_pod(
    make_cluster: Callable[..., Cluster],
    release: str,
    labels: dict[str, str],
    priority: tuple[str, int] | None,
) -> None:
    cluster = make_cluster(release=release)
    cluster.queues()
    cluster.priority_class("default", 10)
    cluster.priority_class("low", 1)
    pod = cluster.pod("kernel-0", group="g", count=1, labels=labels)
    await cluster.settle()
    wl = cluster.store.get(G, "workloads", NS, "g")
    if priority is None:
        assert k.WORKLOAD_PRIORITY_CLASS_LABEL not in pod["metadata"]["labels"]
        assert "priorityClassRef" not in wl["spec"] and wl["spec"]["priority"] == 0
        return
    name, value = priority
    assert pod["metadata"]["labels"][k.WORKLOAD_PRIORITY_CLASS_LABEL] == name
    ref = {"group": G, "kind": "WorkloadPriorityClass", "name": name}
    assert (wl["spec"]["priorityClassRef"], wl["spec"]["priority"]) == (ref, value)


async def test_without_a_default_class_0_20_leaves_an_unlabelled_pod_alone(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(release="0.20")
    cluster.queues()
    pod = cluster.pod("kernel-0", group="g", count=1)
    assert k.WORKLOAD_PRIORITY_CLASS_LABEL not in pod["metadata"]["labels"]


async def test_on_0_14_the_controller_writes_v1beta1_through_its_one_v1beta2_shape(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(release="0.14")
    cluster.queues(cpu=4, preemption="LowerPriority")
    cluster.priority_class("low", 100)
    cluster.pod("low-0", group="low", count=1, labels={k.WORKLOAD_PRIORITY_CLASS_LABEL: "low"})
    await cluster.settle()
    wl = cluster.the_workload("low")
    assert wl["apiVersion"] == f"{G}/v1beta1"
    assert (wl["spec"]["priorityClassSource"], wl["spec"]["priorityClassName"]) == (
        "kueue.x-k8s.io/workloadpriorityclass",
        "low",
    )
    assert "priorityClassRef" not in wl["spec"]
    lq = cluster.store.get(G, "localqueues", NS, "user-queue")
    assert lq["status"]["flavorUsage"][0]["resources"][0] == {"name": "cpu", "total": "1"}
    assert "flavorsUsage" not in lq["status"]
    cluster.kueue.set_quota("cluster-queue", "default-flavor", {"cpu": 5})
    cq = cluster.store.get(G, "clusterqueues", None, "cluster-queue")
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 5
    assert cq["spec"]["flavorFungibility"]["whenCanBorrow"] == "Borrow"  # 0.14's default
    cluster.run("low-0")
    await cluster.settle()
    cluster.kueue.evict("low")
    await cluster.settle()
    cluster.exit("low-0", 143)
    await cluster.settle()
    status = cluster.the_workload("low")["status"]
    assert status["accumulatedPastExexcutionTimeSeconds"] >= 0
    assert "accumulatedPastExecutionTimeSeconds" not in status
    events = cluster.events("QuotaReserved", "low")
    assert [e["involvedObject"]["apiVersion"] for e in events] == [f"{G}/v1beta1"]
