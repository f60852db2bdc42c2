"""The Kueue releases the fake cluster emulates: what each serves and stores, and how it speaks.

| rel. | kueue.x-k8s.io (storage)  | visibility      | QuotaReserved False  | PodsReady | WPC     |
|------|---------------------------|-----------------|----------------------|-----------|---------|
| 0.14 | v1beta1 (v1beta1)         | v1beta1         | Pending/Inadmissible | no        | label   |
| 0.19 | v1beta2,v1beta1 (v1beta2) | v1beta2,v1beta1 | Pending/Inadmissible | yes       | label   |
| 0.20 | v1beta2 (v1beta2)         | v1beta2         | WaitingForQuota,...  | yes       | default |

From Kueue's CRDs and feature gates at each tag (`pkg/features/kube_features.go`): 0.13 and 0.14
serve v1beta1 only; 0.15 adds v1beta2; 0.16 to 0.19 store v1beta2; 0.20 stops serving v1beta1
(Kueue #14558), turns on `UnadmittedWorkloadsObservability` (granular reasons, #13063) and
`WorkloadPriorityClassDefaulting` (#13719). waitForPodsReady is on by default from 0.19 (the
PodsReady condition). `serve` checks that the CRDs given are the release's and keeps only the
versions it serves (0.20 has no CRDs of its own here: main's, with v1beta1 no longer served).
WPC "default": a pod without the priority-class label gets `default` where a
WorkloadPriorityClass of that name exists. Pure: data and functions over `ResourceType`s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from kernel_queue_fake_cluster.apiserver.kinds import ResourceType
from kernel_queue_fake_cluster.kueue import constants as k

# Why a Workload is not admitted, each written with a reason of its release (`Release.reason`).
QUOTA = "quota"  # short of unused quota (preemption may help or not)
EXCEEDS = "exceeds"  # asks for more than the ClusterQueue can ever give
NO_FLAVOR = "no-flavor"  # a resource no flavor of the ClusterQueue covers
PREEMPTING = "preempting"  # waits for the Workloads it preempted
MISSING = "missing"  # its LocalQueue or ClusterQueue is missing (the workload controller)
STOPPED = "stopped"  # its LocalQueue or ClusterQueue is stopped (the workload controller)
INACTIVE = "inactive"  # its ClusterQueue is inactive (the scheduler)
NAMESPACE = "namespace"  # its namespace does not match the ClusterQueue's selector
EVICTED = "evicted"  # back in the queue after an eviction
PODS_READY = "pods-ready"  # waitForPodsReady.blockAdmission: admitted pods not ready yet

GRANULAR: Mapping[str, str] = {
    # pkg/scheduler/scheduler.go, pkg/controller/core/workload_controller.go on main (0.20)
    QUOTA: "WaitingForQuota",
    EXCEEDS: "ExceedsMaxQuota",
    NO_FLAVOR: "NoMatchingFlavor",
    PREEMPTING: "WaitingForPreemptedWorkloads",
    MISSING: "Misconfigured",
    NAMESPACE: "Misconfigured",
    STOPPED: "Suspended",
    INACTIVE: "Suspended",
    EVICTED: "PendingEvaluation",
    PODS_READY: "WaitingForPodsReady",
}
"""`UnadmittedWorkloadsObservability` on: the reason for each case."""
LEGACY: Mapping[str, str] = {
    MISSING: k.INADMISSIBLE,
    STOPPED: k.INADMISSIBLE,
    PODS_READY: "Waiting",
}
"""The gate off: these reasons, and `Pending` for every other case."""
CHECKED = ("Workload", "LocalQueue", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass")
"""The kinds whose CRDs must be the release's."""


class CrdsMismatch(ValueError):
    """The CRDs given serve other versions than the release does: the message names both."""


@dataclasses.dataclass(frozen=True)
class Release:
    """One Kueue release as the fake emulates it."""

    name: str
    served: tuple[str, ...]
    """The `kueue.x-k8s.io` versions served, the preferred one first."""
    storage: str
    visibility: tuple[str, ...]
    """The `visibility.kueue.x-k8s.io` versions installed, the preferred one first."""
    granular_reasons: bool
    """`UnadmittedWorkloadsObservability`: QuotaReserved=False says WaitingForQuota,
    ExceedsMaxQuota, Misconfigured, ... instead of Pending and Inadmissible."""
    priority_class_defaulting: bool
    """`WorkloadPriorityClassDefaulting`: the pod webhook labels a pod that names no priority
    class with `default` when a WorkloadPriorityClass of that name exists."""
    pods_ready: bool
    """waitForPodsReady on by default: Workloads carry the PodsReady condition."""
    namespace_mismatch: str
    """The scheduler's message for a namespace the ClusterQueue's selector does not match."""
    crds: str
    """Which CRDs the release needs, for the error when others are given."""

    def reason(self, why: str) -> str:
        """The QuotaReserved=False reason this release writes for `why` (QUOTA, MISSING, ...)."""
        if self.granular_reasons:
            return GRANULAR[why]
        return LEGACY.get(why, k.PENDING)


_MISMATCH = (
    "workload namespace doesn't match ClusterQueue selector"  # workload.ErrNamespaceMismatch
)
RELEASES: Mapping[str, Release] = {
    "0.14": Release(
        "0.14",
        served=("v1beta1",),
        storage="v1beta1",
        visibility=("v1beta1",),
        granular_reasons=False,
        priority_class_defaulting=False,
        pods_ready=False,
        namespace_mismatch="Workload namespace doesn't match ClusterQueue selector",
        crds="Kueue 0.13's or 0.14's CRDs (such as the v0.14 release's manifests.yaml)",
    ),
    "0.19": Release(
        "0.19",
        served=("v1beta2", "v1beta1"),
        storage="v1beta2",
        visibility=("v1beta2", "v1beta1"),
        granular_reasons=False,
        priority_class_defaulting=False,
        pods_ready=True,
        namespace_mismatch=_MISMATCH,
        crds="the CRDs of a Kueue from 0.16 to 0.19 (such as the v0.19 release's manifests.yaml)",
    ),
    "0.20": Release(
        "0.20",
        served=("v1beta2",),
        storage="v1beta2",
        visibility=("v1beta2",),
        granular_reasons=True,
        priority_class_defaulting=True,
        pods_ready=True,
        namespace_mismatch=_MISMATCH,
        crds="CRDs that serve and store v1beta2 (Kueue 0.16 or newer; v1beta1 is not served)",
    ),
}
DEFAULT = "0.19"


def named(kueue: bool | str, types: Iterable[ResourceType] = ()) -> Release | None:
    """The release `kueue` names ("0.14", "v0.19.2", ...); False: none; True: the default, or
    0.14 where the Workload CRD among `types` serves v1beta1 only (a 0.13 or 0.14 one)."""
    if kueue is False:
        return None
    if kueue is True:
        workload = [t for t in types if (t.group, t.kind) == (k.KUEUE_GROUP, "Workload")]
        if workload and workload[0].versions == ("v1beta1",):
            return RELEASES["0.14"]
        return RELEASES[DEFAULT]
    major_minor = ".".join(kueue.removeprefix("v").split(".")[:2])
    if major_minor not in RELEASES:
        raise ValueError(
            f"The fake cluster does not emulate Kueue {kueue!r}: choose one of "
            f"{', '.join(RELEASES)} (the default {DEFAULT})"
        )
    return RELEASES[major_minor]


def serve(release: Release, types: Iterable[ResourceType], where: str) -> list[ResourceType]:
    """`types` (from the CRDs at `where`) as `release` serves them: Kueue's kinds at the
    release's versions only; `CrdsMismatch` when a kind's CRD does not serve every one of them or
    stores another."""
    found = []
    for rtype in types:
        if rtype.group != k.KUEUE_GROUP:
            found.append(rtype)
            continue
        if rtype.kind in CHECKED and (
            not set(release.served) <= set(rtype.versions)
            or rtype.storage_version != release.storage
        ):
            raise CrdsMismatch(
                f"The Kueue CRDs at {where} serve {rtype.kind} at {_versions(rtype.versions)} "
                f"(storage {rtype.storage_version}), but Kueue {release.name} serves "
                f"{_versions(release.served)} (storage {release.storage}): give {release.crds} "
                "with crds=PATH, --crds PATH or $KERNEL_QUEUE_FAKE_CLUSTER_CRDS."
            )
        versions = tuple(v for v in rtype.versions if v in release.served)
        if versions:  # a kind of other versions only (v1alpha1) stays as its CRD says
            schemas = {v: s for v, s in rtype.schemas.items() if v in versions}
            rtype = dataclasses.replace(rtype, versions=versions, schemas=schemas)
        found.append(rtype)
    return found


def _versions(versions: Iterable[str]) -> str:
    ordered = sorted(versions)
    return ordered[0] + " only" if len(ordered) == 1 else " and ".join(ordered)
