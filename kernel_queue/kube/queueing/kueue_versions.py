"""Which versions of Kueue's APIs a cluster serves, and the fields that differ between them.

Kueue serves ``kueue.x-k8s.io`` at v1beta1 in 0.13 and 0.14, at v1beta1 and v1beta2 from 0.15 to
0.19, at v1beta2 alone from 0.20, and its visibility API (``visibility.kueue.x-k8s.io``, an
APIService of its own) likewise but separately. `choose` reads the groups API discovery lists
and takes v1beta2 where served, else v1beta1, for each of the two; `KueueVersions` then names
the kinds and paths at those versions. The readers take a Workload, LocalQueue or ClusterQueue as
served at a version and return one shape whichever it is (`RENAMED` is the table of what
differs); the fields ``kueue`` reads (conditions, the admission's flavors, pending counts) are
the same at both (`SAME`). Pure: no I/O, and a missing field is never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kernel_queue.kube.kueue import KUEUE_GROUP, VISIBILITY_GROUP, Kind, dig

V1BETA1, V1BETA2 = "v1beta1", "v1beta2"
PREFERRED = (V1BETA2, V1BETA1)
"""The versions kernel-queue speaks, the one it prefers first (the storage version from 0.16)."""
SUPPORTED = (
    "kernel-queue needs Kueue 0.13 or newer (0.13 and 0.14 serve kueue.x-k8s.io/v1beta1, 0.15 "
    "to 0.19 v1beta1 and v1beta2, 0.20 and later v1beta2)"
)
"""The releases kernel-queue supports, as the error of a cluster serving none of them says."""
PRIORITY_CLASS_GROUPS = {"WorkloadPriorityClass": KUEUE_GROUP, "PriorityClass": "scheduling.k8s.io"}
# v1beta1's priorityClassSource values (apis/kueue/v1beta1/workload_types.go) and the kinds
# they name in v1beta2's priorityClassRef (apis/kueue/v1beta1/workload_conversion.go).
_SOURCES = {
    "kueue.x-k8s.io/workloadpriorityclass": "WorkloadPriorityClass",
    "scheduling.k8s.io/priorityclass": "PriorityClass",
}

RENAMED: Mapping[str, Mapping[str, str]] = {
    # what: {version: where it is at that version}  (Kueue's apis/kueue/v1beta1/*_conversion.go)
    "Workload priority class": {
        V1BETA1: "spec.priorityClassName + spec.priorityClassSource",
        V1BETA2: "spec.priorityClassRef {group, kind, name}",
    },
    "Workload past execution seconds": {
        V1BETA1: "status.accumulatedPastExexcutionTimeSeconds",  # sic, Kueue's spelling
        V1BETA2: "status.accumulatedPastExecutionTimeSeconds",
    },
    "LocalQueue usage": {V1BETA1: "status.flavorUsage", V1BETA2: "status.flavorsUsage"},
    "ClusterQueue cohort": {V1BETA1: "spec.cohort", V1BETA2: "spec.cohortName"},
}
"""The fields kernel-queue may read that moved between v1beta1 and v1beta2."""
SAME: Mapping[str, Sequence[str]] = {
    "workloads": (
        "spec.queueName",
        "spec.active",
        "spec.priority",
        "status.conditions",
        "status.admission.clusterQueue",
        "status.admission.podSetAssignments[].flavors",
    ),
    "localqueues": (
        "spec.clusterQueue",
        "status.pendingWorkloads",
        "status.reservingWorkloads",
        "status.admittedWorkloads",
        "status.conditions",
    ),
    "clusterqueues": (
        "spec.resourceGroups[].flavors[].resources[].nominalQuota",
        "spec.stopPolicy",
        "status.pendingWorkloads",
        "status.admittedWorkloads",
        "status.conditions",
    ),
    "workloadpriorityclasses": ("value",),
}
"""Fields read at either version alike (plural -> paths; ``[]`` steps into a list)."""


@dataclass(frozen=True)
class KueueVersions:
    """The versions one cluster serves that kernel-queue uses: of ``kueue.x-k8s.io`` and of the
    visibility API (None: not served, so queue positions fall back to a LocalQueue's count)."""

    kueue: str
    visibility: str | None = None

    @property
    def workloads(self) -> Kind:
        return Kind(KUEUE_GROUP, self.kueue, "workloads", namespaced=True)

    @property
    def local_queues(self) -> Kind:
        return Kind(KUEUE_GROUP, self.kueue, "localqueues", namespaced=True)

    @property
    def cluster_queues(self) -> Kind:
        return Kind(KUEUE_GROUP, self.kueue, "clusterqueues", namespaced=False)

    @property
    def workload_priority_classes(self) -> Kind:
        return Kind(KUEUE_GROUP, self.kueue, "workloadpriorityclasses", namespaced=False)

    def pending_workloads_path(self, namespace: str, local_queue: str) -> str | None:
        """The visibility API path of a LocalQueue's pending Workloads (Kueue's
        ``pkg/visibility/storage``; ``limit`` items, 1000 by default, from ``offset``), or None
        when the cluster serves no visibility API kernel-queue speaks."""
        if self.visibility is None:
            return None
        ns, lq = quote(namespace, safe=""), quote(local_queue, safe="")
        return (
            f"/apis/{VISIBILITY_GROUP}/{self.visibility}/namespaces/{ns}/localqueues/{lq}"
            "/pendingworkloads"
        )

    def __str__(self) -> str:
        seen = f"visibility {self.visibility}" if self.visibility else "no visibility API"
        return f"{KUEUE_GROUP}/{self.kueue}, {seen}"


# --- discovery --------------------------------------------------------------------------------


def served(discovery: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Group name -> the versions it serves, from an ``APIGroupList`` (``GET /apis``)."""
    found: dict[str, tuple[str, ...]] = {}
    for group in _items(discovery, "groups"):
        versions = [str(v.get("version") or "") for v in _items(group, "versions")]
        found[str(group.get("name") or "")] = tuple(v for v in versions if v)
    return found


def _pick(versions: Sequence[str]) -> str | None:
    return next((v for v in PREFERRED if v in versions), None)


def choose(groups: Mapping[str, Sequence[str]]) -> KueueVersions | None:
    """v1beta2 where served, else v1beta1, for Kueue's objects and, separately, for its
    visibility API; None when the cluster serves neither version of ``kueue.x-k8s.io``."""
    kueue = _pick(groups.get(KUEUE_GROUP, ()))
    if kueue is None:
        return None
    return KueueVersions(kueue, _pick(groups.get(VISIBILITY_GROUP, ())))


def shown(groups: Mapping[str, Sequence[str]]) -> str:
    """What discovery lists of Kueue's groups, for a sentence: "kueue.x-k8s.io v1alpha1", or
    "no kueue.x-k8s.io group"."""
    listed = [
        f"{name} {', '.join(groups[name]) or 'no version'}"
        for name in (KUEUE_GROUP, VISIBILITY_GROUP)
        if name in groups
    ]
    return "; ".join(listed) if listed else f"no {KUEUE_GROUP} group"


def not_served(groups: Mapping[str, Sequence[str]]) -> str:
    """Why `choose` found nothing, with the releases kernel-queue supports (no kernel named)."""
    return (
        f"the cluster serves no Kueue API kernel-queue speaks (API discovery lists "
        f"{shown(groups)}); {SUPPORTED}: install Kueue (its CRDs and controller) or use "
        "backend 'local'"
    )


# --- one shape of the fields that differ -------------------------------------------------------


@dataclass(frozen=True)
class PriorityClassRef:
    """A Workload's priority class: a ``WorkloadPriorityClass`` or a pod ``PriorityClass``."""

    kind: str
    name: str

    @property
    def group(self) -> str:
        return PRIORITY_CLASS_GROUPS.get(self.kind, "")


@dataclass(frozen=True)
class WorkloadView:
    """What kernel-queue reads of a Workload, whichever version served it."""

    name: str
    namespace: str
    queue: str
    priority: int | None
    priority_class: PriorityClassRef | None
    cluster_queue: str | None
    """The ClusterQueue of its current admission (quota reserved), else None."""
    past_execution_seconds: int


@dataclass(frozen=True)
class LocalQueueView:
    """What kernel-queue reads of a LocalQueue, whichever version served it."""

    name: str
    namespace: str
    cluster_queue: str
    pending: int
    reserving: int
    admitted: int
    usage: Mapping[str, Mapping[str, str]]
    """Flavor -> resource -> quantity its admitted Workloads use."""


@dataclass(frozen=True)
class ClusterQueueView:
    """What kernel-queue reads of a ClusterQueue, whichever version served it."""

    name: str
    cohort: str | None
    pending: int
    admitted: int
    nominal_quota: Mapping[str, Mapping[str, str]]
    """Flavor -> resource -> nominal quota."""


def workload(obj: Mapping[str, Any], version: str) -> WorkloadView:
    """A Workload as served at `version` (``v1beta1`` or ``v1beta2``), in one shape."""
    spec = dig(obj, "spec")
    if version == V1BETA1:
        # As Kueue converts it: a name without a source refers to nothing.
        name = str(dig(spec, "priorityClassName") or "")
        kind = _SOURCES.get(str(dig(spec, "priorityClassSource") or ""), "")
        ref = PriorityClassRef(kind, name) if name and kind else None
        past = dig(obj, "status", "accumulatedPastExexcutionTimeSeconds")
    else:
        found = dig(spec, "priorityClassRef")
        name = str(dig(found, "name") or "")
        ref = PriorityClassRef(str(dig(found, "kind") or ""), name) if name else None
        past = dig(obj, "status", "accumulatedPastExecutionTimeSeconds")
    return WorkloadView(
        name=str(dig(obj, "metadata", "name") or ""),
        namespace=str(dig(obj, "metadata", "namespace") or ""),
        queue=str(dig(spec, "queueName") or ""),
        priority=_int_or_none(dig(spec, "priority")),
        priority_class=ref,
        cluster_queue=str(dig(obj, "status", "admission", "clusterQueue") or "") or None,
        past_execution_seconds=_int_or_none(past) or 0,
    )


def local_queue(obj: Mapping[str, Any], version: str) -> LocalQueueView:
    """A LocalQueue as served at `version`, in one shape."""
    usage_key = "flavorUsage" if version == V1BETA1 else "flavorsUsage"
    return LocalQueueView(
        name=str(dig(obj, "metadata", "name") or ""),
        namespace=str(dig(obj, "metadata", "namespace") or ""),
        cluster_queue=str(dig(obj, "spec", "clusterQueue") or ""),
        pending=_int_or_none(dig(obj, "status", "pendingWorkloads")) or 0,
        reserving=_int_or_none(dig(obj, "status", "reservingWorkloads")) or 0,
        admitted=_int_or_none(dig(obj, "status", "admittedWorkloads")) or 0,
        usage=_per_flavor(_items(dig(obj, "status"), usage_key), "resources", "total"),
    )


def cluster_queue(obj: Mapping[str, Any], version: str) -> ClusterQueueView:
    """A ClusterQueue as served at `version`, in one shape."""
    cohort = dig(obj, "spec", "cohort" if version == V1BETA1 else "cohortName")
    quota: dict[str, dict[str, str]] = {}
    for group in _items(dig(obj, "spec"), "resourceGroups"):
        for flavor, resources in _per_flavor(
            _items(group, "flavors"), "resources", "nominalQuota"
        ).items():
            quota.setdefault(flavor, {}).update(resources)
    return ClusterQueueView(
        name=str(dig(obj, "metadata", "name") or ""),
        cohort=str(cohort) if cohort else None,
        pending=_int_or_none(dig(obj, "status", "pendingWorkloads")) or 0,
        admitted=_int_or_none(dig(obj, "status", "admittedWorkloads")) or 0,
        nominal_quota=quota,
    )


# --- plain dict access --------------------------------------------------------------------------


def _items(obj: Any, key: str) -> list[Mapping[str, Any]]:
    value = dig(obj, key)
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _per_flavor(
    flavors: Sequence[Mapping[str, Any]], key: str, field: str
) -> dict[str, dict[str, str]]:
    """``[{name, <key>: [{name, <field>}]}]`` -> flavor -> resource -> str(field)."""
    return {
        str(flavor.get("name") or ""): {
            str(resource.get("name") or ""): str(resource.get(field))
            for resource in _items(flavor, key)
            if resource.get(field) is not None
        }
        for flavor in flavors
    }
