"""Kueue's conversion webhook for the fake: its kinds between `v1beta1` and `v1beta2`.

The fields that differ, as `apis/kueue/v1beta1/*_conversion.go` maps them (v1beta2 is the hub):
Workload `spec.priorityClassSource` + `spec.priorityClassName` ↔ `spec.priorityClassRef {group,
kind, name}` and `status.accumulatedPastExexcutionTimeSeconds` (sic) ↔
`status.accumulatedPastExecutionTimeSeconds`; ClusterQueue `spec.cohort` ↔ `spec.cohortName`,
v1beta1's `spec.admissionChecks` → `spec.admissionChecksStrategy` and its fungibility values
`Borrow`/`Preempt` → `MayStopSearch`; LocalQueue `status.flavorUsage` ↔ `status.flavorsUsage`.
A field the other version lacks is dropped, as Kueue's generated conversion drops it. Not
converted: TAS topology assignments (`domains` ↔ `levels` + `slices`), which the fake never
writes. `convert` is a `versions.Converter`: pure, a new object each call.
"""

from __future__ import annotations

import copy
from typing import Any

from kernel_queue_fake_cluster.kueue import constants as k

Obj = dict[str, Any]
V1BETA1, V1BETA2 = "v1beta1", "v1beta2"
HUB = V1BETA2
"""The version the fake Kueue's own code reads and writes, whatever the cluster stores."""
PLURALS = (
    "workloads",
    "clusterqueues",
    "localqueues",
    "cohorts",
    "resourceflavors",
    "workloadpriorityclasses",
)
"""The kinds converted here (the last three differ in apiVersion only)."""
POD_PRIORITY_GROUP = "scheduling.k8s.io"
SOURCES = {
    # v1beta1 priorityClassSource -> v1beta2 priorityClassRef (group, kind)
    "kueue.x-k8s.io/workloadpriorityclass": (k.KUEUE_GROUP, "WorkloadPriorityClass"),
    "scheduling.k8s.io/priorityclass": (POD_PRIORITY_GROUP, "PriorityClass"),
}
_MAY_STOP_SEARCH = {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"}


def convert(obj: Obj, api_version: str) -> Obj:
    """A new object: `obj` (a Kueue object at its apiVersion) at `api_version`."""
    found = copy.deepcopy(obj)
    source = str(obj.get("apiVersion", "")).rpartition("/")[2]
    found["apiVersion"] = api_version
    target = api_version.rpartition("/")[2]
    if source != target:
        kind = str(obj.get("kind", ""))
        (_UP if target == V1BETA2 else _DOWN).get(kind, _same)(found)
    return found


def _same(obj: Obj) -> None:
    """Kinds whose versions differ in apiVersion only (ResourceFlavor, WorkloadPriorityClass)."""


def _rename(parent: Obj | None, old: str, new: str) -> None:
    if parent is not None and old in parent:
        parent[new] = parent.pop(old)


def _drop(parent: Obj | None, *keys: str) -> None:
    for key in keys:
        if parent is not None:
            parent.pop(key, None)


def _part(obj: Obj, name: str) -> Obj | None:
    found = obj.get(name)
    return found if isinstance(found, dict) else None


def _workload_up(wl: Obj) -> None:
    spec = _part(wl, "spec")
    if spec is not None:
        source = spec.pop("priorityClassSource", "")
        name = spec.pop("priorityClassName", "")
        if name and source in SOURCES:
            group, kind = SOURCES[source]
            spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
    _rename(
        _part(wl, "status"),
        "accumulatedPastExexcutionTimeSeconds",
        "accumulatedPastExecutionTimeSeconds",
    )


def _workload_down(wl: Obj) -> None:
    spec = _part(wl, "spec")
    if spec is not None:
        ref = spec.pop("priorityClassRef", None) or {}
        for source, (group, kind) in SOURCES.items():
            if (ref.get("group"), ref.get("kind")) == (group, kind):
                spec["priorityClassSource"], spec["priorityClassName"] = source, ref.get("name")
        _drop(spec, "preemptionGates")
        for pod_set in spec.get("podSets") or []:
            _drop(_part(pod_set, "topologyRequest"), "podsetSliceRequiredTopologyConstraints")
    status = _part(wl, "status")
    _drop(status, "preemptionGates")
    _rename(status, "accumulatedPastExecutionTimeSeconds", "accumulatedPastExexcutionTimeSeconds")


def _cluster_queue_up(cq: Obj) -> None:
    spec = _part(cq, "spec")
    if spec is not None:
        cohort = spec.pop("cohort", "")
        if cohort:
            spec["cohortName"] = cohort
        checks = spec.pop("admissionChecks", None)
        if checks:
            rules = [{"name": name} for name in checks]
            spec["admissionChecksStrategy"] = {"admissionChecks": rules}
        fungibility = _part(spec, "flavorFungibility") or {}
        for field, old in _MAY_STOP_SEARCH.items():
            if fungibility.get(field) == old:
                fungibility[field] = "MayStopSearch"
    status = _part(cq, "status")
    _drop(status, "pendingWorkloadsStatus")
    _drop(_part(status or {}, "fairSharing"), "admissionFairSharingStatus")


def _cluster_queue_down(cq: Obj) -> None:
    spec = _part(cq, "spec")
    _rename(spec, "cohortName", "cohort")
    _drop(spec, "concurrentAdmissionPolicy")


def _local_queue_up(lq: Obj) -> None:
    status = _part(lq, "status")
    _rename(status, "flavorUsage", "flavorsUsage")
    _drop(status, "flavors")


def _local_queue_down(lq: Obj) -> None:
    _rename(_part(lq, "status"), "flavorsUsage", "flavorUsage")


def _cohort_up(cohort: Obj) -> None:
    _drop(_part(_part(cohort, "status") or {}, "fairSharing"), "admissionFairSharingStatus")


_UP = {
    "Workload": _workload_up,
    "ClusterQueue": _cluster_queue_up,
    "LocalQueue": _local_queue_up,
    "Cohort": _cohort_up,
}
_DOWN = {
    "Workload": _workload_down,
    "ClusterQueue": _cluster_queue_down,
    "LocalQueue": _local_queue_down,
}
