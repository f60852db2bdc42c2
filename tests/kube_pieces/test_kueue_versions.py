"""Kueue's API versions: which one discovery makes us speak, and one shape of the fields that
differ, from literal objects that Kueue's own CRDs (0.14's v1beta1; 0.19's v1beta1 and v1beta2)
accept unchanged."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.apiserver import crds, schema

from kernel_queue.kube.queueing import kueue_versions
from kernel_queue.kube.queueing.kueue_versions import (
    ClusterQueueView,
    KueueVersions,
    LocalQueueView,
    PriorityClassRef,
    WorkloadView,
)
from tests.conftest import KUEUE_DATA, skip_unless_ci

V014, V019 = KUEUE_DATA / "v0.14" / "crds", KUEUE_DATA / "crds"
SCHEMAS = {  # what serves each shape: (CRD directory, version)
    "v1beta1": [(V014, "v1beta1"), (V019, "v1beta1")],
    "v1beta2": [(V019, "v1beta2")],
}


def crd_schema(directory: Path, plural: str, version: str) -> dict[str, Any]:
    if not directory.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {directory} (../shared is absent)")
    for rtype in crds.load(directory):
        if rtype.plural == plural:
            return dict(rtype.schemas[version])
    raise LookupError(f"no {plural} in {directory}")


def pruned_fields(original: Any, kept: Any, path: str = "") -> list[str]:
    """The fields of `original` the apiserver's pruning dropped (unknown to the schema)."""
    if isinstance(original, dict):
        lost = [f"{path}.{k}".lstrip(".") for k in original if k not in kept]
        for key in original.keys() & kept.keys():
            lost += pruned_fields(original[key], kept[key], f"{path}.{key}")
        return lost
    if isinstance(original, list):
        return [x for a, b in zip(original, kept, strict=True) for x in pruned_fields(a, b, path)]
    return []


def accepted(obj: dict[str, Any], plural: str, version: str) -> None:
    """`obj` (of `version`'s shape) stores unchanged and valid at every CRD serving that shape."""
    for directory, served in SCHEMAS[version]:
        kept, problems = schema.prune_default_validate(
            copy.deepcopy(obj), crd_schema(directory, plural, served)
        )
        assert problems == [], (directory, served)
        assert pruned_fields(obj, kept) == [], (directory, served)


CONDITION = {"lastTransitionTime": "2026-08-20T10:00:00Z", "status": "True"}
ADMITTED = [
    {**CONDITION, "type": "QuotaReserved", "reason": "QuotaReserved", "message": "Quota reserved"},
    {**CONDITION, "type": "Admitted", "reason": "Admitted", "message": "The workload is admitted"},
]
POD_SET = {
    "name": "a1b2c3d4",
    "count": 1,
    "template": {"spec": {"containers": [{"name": "kernel", "image": "kernel-image"}]}},
}
ADMISSION = {
    "clusterQueue": "gpu-cq",
    "podSetAssignments": [
        {"name": "a1b2c3d4", "count": 1, "flavors": {"nvidia.com/gpu": "a100"}},
    ],
}


def workload(spec: dict[str, Any], status: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "Workload",
        "metadata": {"name": "kq-1a2b3c4d", "namespace": "team-a"},
        "spec": {"queueName": "user-queue", "podSets": [POD_SET], **spec},
        "status": {"conditions": ADMITTED, "admission": ADMISSION, **status},
    }


ADMITTED_VIEW = {"name": "kq-1a2b3c4d", "namespace": "team-a", "queue": "user-queue"}
PAST_EXECUTION = {  # the status field of the time run before, by version
    "v1beta1": "accumulatedPastExexcutionTimeSeconds",  # sic
    "v1beta2": "accumulatedPastExecutionTimeSeconds",
}


def classed(version: str, kind: str, name: str, priority: int, past: int, id: str) -> Any:
    """An admitted Workload of `version`'s shape naming a priority class, and how it reads."""
    group = "kueue.x-k8s.io" if kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
    if version == "v1beta1":
        spec: dict[str, Any] = {
            "priorityClassName": name,
            "priorityClassSource": f"{group}/{kind.lower()}",
        }
    else:
        spec = {"priorityClassRef": {"group": group, "kind": kind, "name": name}}
    status = {PAST_EXECUTION[version]: past} if past else {}
    view = WorkloadView(
        **ADMITTED_VIEW,
        priority=priority,
        priority_class=PriorityClassRef(kind, name),
        cluster_queue="gpu-cq",
        past_execution_seconds=past,
    )
    obj = workload({**spec, "priority": priority}, status, version)
    return pytest.param(obj, version, view, id=id)


def pending(version: str) -> Any:
    """A Workload of `version`'s shape not yet admitted, naming no class."""
    view = WorkloadView(
        **ADMITTED_VIEW,
        priority=None,
        priority_class=None,
        cluster_queue=None,
        past_execution_seconds=0,
    )
    obj = {**workload({}, {}, version), "status": {}}
    return pytest.param(obj, version, view, id=f"{version}-pending-without-class")


WORKLOADS = [
    classed(
        "v1beta1", "WorkloadPriorityClass", "high", 1000, 120, "v1beta1-workload-priority-class"
    ),
    classed(
        "v1beta2", "WorkloadPriorityClass", "high", 1000, 120, "v1beta2-workload-priority-class"
    ),
    classed(
        "v1beta1",
        "PriorityClass",
        "system-node-critical",
        2000001000,
        0,
        "v1beta1-pod-priority-class",
    ),
    classed(
        "v1beta2",
        "PriorityClass",
        "system-node-critical",
        2000001000,
        0,
        "v1beta2-pod-priority-class",
    ),
    pending("v1beta1"),
    pending("v1beta2"),
]


@pytest.mark.parametrize(("obj", "version", "view"), WORKLOADS)
def test_a_workload_reads_the_same_at_either_version(
    obj: dict[str, Any], version: str, view: WorkloadView
) -> None:
    accepted(obj, "workloads", version)
    assert kueue_versions.workload(obj, version) == view
    assert view.priority_class is None or view.priority_class.group in (
        "kueue.x-k8s.io",
        "scheduling.k8s.io",
    )


def test_a_workload_of_one_shape_loses_its_class_at_the_other_version() -> None:
    """The check above has teeth: each version's CRD prunes the other's priority fields."""
    for obj, directory, version in [
        (WORKLOADS[1].values[0], V014, "v1beta1"),
        (WORKLOADS[0].values[0], V019, "v1beta2"),
    ]:
        assert isinstance(obj, dict)
        kept, _ = schema.prune_default_validate(
            copy.deepcopy(obj), crd_schema(directory, "workloads", version)
        )
        assert {p for p in pruned_fields(obj, kept) if "riority" in p} in (
            {"spec.priorityClassRef"},
            {"spec.priorityClassName", "spec.priorityClassSource"},
        )


def local_queue(status: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": "team-a"},
        "spec": {"clusterQueue": "gpu-cq"},
        "status": {"pendingWorkloads": 1200, "reservingWorkloads": 2, "admittedWorkloads": 2}
        | status,
    }


USAGE = [{"name": "a100", "resources": [{"name": "nvidia.com/gpu", "total": "2"}]}]
LOCAL_QUEUE_VIEW = LocalQueueView(
    name="user-queue",
    namespace="team-a",
    cluster_queue="gpu-cq",
    pending=1200,
    reserving=2,
    admitted=2,
    usage={"a100": {"nvidia.com/gpu": "2"}},
)


@pytest.mark.parametrize(
    ("obj", "version"),
    [
        pytest.param(local_queue({"flavorUsage": USAGE}, "v1beta1"), "v1beta1", id="v1beta1"),
        pytest.param(local_queue({"flavorsUsage": USAGE}, "v1beta2"), "v1beta2", id="v1beta2"),
    ],
)
def test_a_local_queue_reads_the_same_at_either_version(obj: dict[str, Any], version: str) -> None:
    accepted(obj, "localqueues", version)
    assert kueue_versions.local_queue(obj, version) == LOCAL_QUEUE_VIEW


def cluster_queue(cohort: dict[str, Any], version: str) -> dict[str, Any]:
    quota = [{"name": "nvidia.com/gpu", "nominalQuota": 2}, {"name": "cpu", "nominalQuota": "8"}]
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "ClusterQueue",
        "metadata": {"name": "gpu-cq"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu", "cpu"],
                    "flavors": [{"name": "a100", "resources": quota}],
                }
            ],
            **cohort,
        },
        "status": {"pendingWorkloads": 1200, "admittedWorkloads": 2},
    }


CLUSTER_QUEUE_VIEW = ClusterQueueView(
    name="gpu-cq",
    cohort="ml-team",
    pending=1200,
    admitted=2,
    nominal_quota={"a100": {"nvidia.com/gpu": "2", "cpu": "8"}},
)


@pytest.mark.parametrize(
    ("obj", "version"),
    [
        pytest.param(cluster_queue({"cohort": "ml-team"}, "v1beta1"), "v1beta1", id="v1beta1"),
        pytest.param(cluster_queue({"cohortName": "ml-team"}, "v1beta2"), "v1beta2", id="v1beta2"),
    ],
)
def test_a_cluster_queue_reads_the_same_at_either_version(
    obj: dict[str, Any], version: str
) -> None:
    accepted(obj, "clusterqueues", version)
    assert kueue_versions.cluster_queue(obj, version) == CLUSTER_QUEUE_VIEW


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_a_workload_priority_class_is_the_same_at_either_version(version: str) -> None:
    wpc = {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": "default"},
        "value": 100,
        "description": "what Kueue 0.20 gives a Workload that names no class",
    }
    accepted(wpc, "workloadpriorityclasses", version)


def schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    found = set()
    for key, child in (node.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        found |= {path} | schema_paths(child, path)
    if "items" in node:
        found |= schema_paths(node["items"], prefix + "[]")
    return found


@pytest.mark.parametrize("plural", list(kueue_versions.SAME))
def test_the_fields_read_alike_exist_alike_in_every_crd(plural: str) -> None:
    for version, served in SCHEMAS.items():
        for directory, at in served:
            paths = schema_paths(crd_schema(directory, plural, at))
            missing = set(kueue_versions.SAME[plural]) - paths
            assert not missing, (plural, version, directory)


RENAMED_PLURALS = {
    "Workload": "workloads",
    "LocalQueue": "localqueues",
    "ClusterQueue": "clusterqueues",
}


@pytest.mark.parametrize("what", list(kueue_versions.RENAMED))
def test_each_renamed_field_is_at_its_place_in_its_version_only(what: str) -> None:
    plural = RENAMED_PLURALS[what.split()[0]]
    places = kueue_versions.RENAMED[what]
    for version, served in SCHEMAS.items():
        other = next(v for v in places if v != version)
        for directory, at in served:
            paths = schema_paths(crd_schema(directory, plural, at))
            mine = {p.split(" ")[0] for p in places[version].split(" + ")}
            theirs = {p.split(" ")[0] for p in places[other].split(" + ")}
            assert mine <= paths, (what, directory, at)
            assert not theirs & paths, (what, directory, at)


# -- discovery ------------------------------------------------------------------------------


def groups(**found: list[str]) -> dict[str, Any]:
    """An APIGroupList as `GET /apis` answers: `kueue=[...]`, `visibility=[...]` and apps."""
    names = {"kueue": "kueue.x-k8s.io", "visibility": "visibility.kueue.x-k8s.io"}
    listed = [("apps", ["v1"])] + [(names[key], versions) for key, versions in found.items()]
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": name,
                "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
                "preferredVersion": {
                    "groupVersion": f"{name}/{versions[0]}",
                    "version": versions[0],
                },
            }
            for name, versions in listed
        ],
    }


def discovered(kueue: list[str], visibility: list[str], chosen: Any, id: str) -> Any:
    """A case of discovery serving these versions of Kueue's two groups (none where empty)."""
    found = {k: v for k, v in (("kueue", kueue), ("visibility", visibility)) if v}
    return pytest.param(groups(**found), chosen, id=id)


V1, V2 = "v1beta1", "v1beta2"


@pytest.mark.parametrize(
    ("discovery", "chosen"),
    [
        discovered([V1], [V1], KueueVersions(V1, V1), "kueue-0.14"),
        discovered([V2, V1], [V2, V1], KueueVersions(V2, V2), "kueue-0.19"),
        discovered([V2], [V2], KueueVersions(V2, V2), "kueue-0.20"),
        discovered([V2, V1], [V1], KueueVersions(V2, V1), "objects-v1beta2-visibility-v1beta1"),
        discovered([V1], [V2], KueueVersions(V1, V2), "objects-v1beta1-visibility-v1beta2"),
        discovered([V2], [], KueueVersions(V2, None), "no-visibility-api"),
        discovered([V2], ["v1alpha1"], KueueVersions(V2, None), "visibility-v1alpha1-only"),
        discovered(["v1alpha1"], [], None, "kueue-v1alpha1-only"),
        discovered([], [], None, "no-kueue"),
        discovered([], [V2], None, "visibility-without-kueue"),
    ],
)
def test_discovery_chooses_v1beta2_where_served_else_v1beta1_for_each_api(
    discovery: dict[str, Any], chosen: KueueVersions | None
) -> None:
    assert kueue_versions.choose(kueue_versions.served(discovery)) == chosen


def test_a_cluster_without_kueue_is_told_which_releases_work_and_what_it_serves() -> None:
    assert kueue_versions.not_served(kueue_versions.served(groups())) == (
        "the cluster serves no Kueue API kernel-queue speaks (API discovery lists no "
        "kueue.x-k8s.io group); kernel-queue needs Kueue 0.13 or newer (0.13 and 0.14 serve "
        "kueue.x-k8s.io/v1beta1, 0.15 to 0.19 v1beta1 and v1beta2, 0.20 and later v1beta2): "
        "install Kueue (its CRDs and controller) or use backend 'local'"
    )
    old = kueue_versions.served(groups(kueue=["v1alpha1"], visibility=["v1alpha1"]))
    assert "(API discovery lists kueue.x-k8s.io v1alpha1; visibility.kueue.x-k8s.io v1alpha1)" in (
        kueue_versions.not_served(old)
    )


def test_the_versions_name_their_kinds_and_say_what_they_are() -> None:
    served = KueueVersions("v1beta1", "v1beta2")
    assert [k.api_version for k in (served.workloads, served.local_queues)] == [
        "kueue.x-k8s.io/v1beta1",
        "kueue.x-k8s.io/v1beta1",
    ]
    assert str(served) == "kueue.x-k8s.io/v1beta1, visibility v1beta2"
    assert str(KueueVersions("v1beta2")) == "kueue.x-k8s.io/v1beta2, no visibility API"
