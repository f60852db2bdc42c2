"""Every label, annotation, gate, condition and API coordinate we use, Kueue's and ours.

Kueue's keys carry the values Kueue's own sources declare (kubernetes-sigs/kueue:
``pkg/controller/jobs/pod/constants/constants.go``, ``pkg/controller/constants/constants.go``,
``apis/kueue/v1beta2/workload_types.go``), the same at every API version Kueue serves (those
are chosen per cluster, in ``kueue_versions``); ours share the ``kernel-queue.dev/``
prefix and are declared nowhere else. The readers take plain API dicts (a pod, a Workload) and
return plain values; they do no I/O and never raise on a missing field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

# --- Kueue: pod labels and annotations (Kueue's pkg/controller/jobs/pod/constants) ---
KUEUE_PREFIX = "kueue.x-k8s.io/"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
"""Set to ``"false"`` only at deliberate shutdown, never at creation: with it, a group whose pods
all ended is Finished, so a preemption would end the kernel instead of requeuing it."""
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
PODSET_LABEL = "kueue.x-k8s.io/podset"
LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"

# --- Kueue: Workload condition types and the reasons we read (workload_types.go) ---
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
REQUEUED = "Requeued"
WAITING_FOR_REPLACEMENT_PODS = "WaitingForReplacementPods"
REASON_PODS_FAILED = "PodsFailed"
"""WaitingForReplacementPods' reason when a group's pod failed with no eviction (a crash):
Kueue waits for a replacement all the same (`pod_controller.go`, `WorkloadPodsFailed`)."""
FINISHED = "Finished"
REASON_SUCCEEDED = "Succeeded"
REASON_DEACTIVATED = "Deactivated"
"""The Evicted (and Requeued=False) reason of a Workload someone set `spec.active: false` on;
Kueue's own deactivations read `DeactivatedDueTo<cause>` (`pkg/workload/evict/evict.go`)."""

# --- Kubernetes pod conditions and reasons we read ---
POD_READY = "Ready"
TERMINATION_TARGET = "TerminationTarget"
"""The pod condition Kueue sets on each pod it stops for an eviction."""
POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
"""Waiting reasons of a container that is simply starting, which ``waiting_reason`` skips."""

# --- Ours: one DNS-subdomain prefix, declared only here ---
KERNEL_ID_LABEL = "kernel-queue.dev/kernel-id"
"""The full kernel id (as a label value); on every object of the kernel, so leaks are findable."""
OWNER_LABEL = "kernel-queue.dev/owner"
"""The owning server's id (``KubernetesBackend.owner_id``) on every object we create: a 409 is
ours only with our kernel id and owner, and the reaper deletes only its own server's objects."""
ROLE_LABEL = "kernel-queue.dev/role"
ROLE_HEAD, ROLE_WORKER = "head", "worker"
USER_LABEL = "kernel-queue.dev/user"
"""The user name made a valid label value (``names.label_value``)."""
USER_ANNOTATION = "kernel-queue.dev/user"
"""The raw user name."""
KERNELSPEC_ANNOTATION = "kernel-queue.dev/kernelspec"
PARKED_ANNOTATION = "kernel-queue.dev/parked"
"""``"true"`` on a Workload this server deactivated to park it (set with ``spec.active: false``
in one patch): a Workload someone else deactivated (``kubectl kueue stop workload``, or Kueue's
own ``DeactivatedDueTo…``) is not parked, only waiting until it is active again."""
SAVED_ANNOTATION = "kernel-queue.dev/saved"
"""On a replacement head pod: what the checkpoint of the pod it replaces saved ("saved 12
variables, 1.2 GB"), so a restarted server still says it of a parked kernel once that pod is
gone."""
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "kernel-queue"
COMPONENT_LABEL, COMPONENT = "app.kubernetes.io/component", "kernel"
LAUNCHER_COMPONENT = "launcher"
"""The component label of the ConfigMaps carrying the launcher archive (one per namespace and
archive, shared by every kernel there, so without a kernel id or owner)."""
LAUNCHER_DIGEST_ANNOTATION = "kernel-queue.dev/launcher-digest"
LAUNCHER_VERSION_ANNOTATION = "kernel-queue.dev/launcher-version"


@dataclass(frozen=True)
class Kind:
    """Where a kind is served: API group (``""`` for core), version, plural, namespaced or not."""

    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of its objects: ``v1`` or ``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods``, ``workloads.kueue.x-k8s.io``: the name the API server's messages use."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str = "", subresource: str = "") -> str:
        """The REST path of the collection (no ``name``), of one object, or of its subresource.

        A namespaced kind with no namespace is the all-namespaces collection; naming one object
        of a namespaced kind without a namespace is a ValueError."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            root += f"/namespaces/{quote(namespace, safe='')}"
        elif self.namespaced and name:
            raise ValueError(f"{self.qualified} {name!r} needs a namespace")
        parts = [root, self.plural, quote(name, safe="") if name else "", subresource]
        return "/".join(part for part in parts if part)


KUEUE_GROUP = "kueue.x-k8s.io"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
"""Kueue's two API groups; the versions a cluster serves of each are negotiated per connection
(`kueue_versions`), so their kinds and paths live there."""
PODS = Kind("", "v1", "pods", namespaced=True)
SECRETS = Kind("", "v1", "secrets", namespaced=True)
SERVICES = Kind("", "v1", "services", namespaced=True)
CLAIMS = Kind("", "v1", "persistentvolumeclaims", namespaced=True)
CONFIGMAPS = Kind("", "v1", "configmaps", namespaced=True)


# --- Readers: plain dict in, plain value out ---


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]…``, or None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _items(obj: Any, *keys: str) -> list[Mapping[str, Any]]:
    """The dicts in the list at ``keys`` (missing or null → empty)."""
    value = dig(obj, *keys)
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def is_gated(pod: Mapping[str, Any]) -> bool:
    """True while any Kueue scheduling gate (``kueue.x-k8s.io/*``) holds the pod."""
    return any(
        str(gate.get("name", "")).startswith(KUEUE_PREFIX)
        for gate in _items(pod, "spec", "schedulingGates")
    )


def is_managed(pod: Mapping[str, Any]) -> bool:
    """True when Kueue's webhook took the pod in (label ``kueue.x-k8s.io/managed: "true"``);
    it stays after admission removed the gates."""
    return bool(dig(pod, "metadata", "labels", MANAGED_LABEL) == "true")


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The ``status.conditions`` entry of ``type_``, or None."""
    for entry in _items(obj, "status", "conditions"):
        if entry.get("type") == type_:
            return entry
    return None


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    """True when the condition ``type_`` exists with status ``"True"``."""
    entry = condition(obj, type_)
    return entry is not None and entry.get("status") == "True"


def _reason_message(obj: Mapping[str, Any], type_: str) -> tuple[str, str] | None:
    if not is_true(obj, type_):
        return None
    entry = condition(obj, type_) or {}
    return str(entry.get("reason") or ""), str(entry.get("message") or "")


def stopped_by_kueue(pod: Mapping[str, Any]) -> bool:
    """True when Kueue stopped the pod for its Workload's eviction (a preemption, a
    deactivation: a park): its ``TerminationTarget`` condition, set before the DELETE."""
    return is_true(pod, TERMINATION_TARGET)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """True when the pod's ``Ready`` condition is True (its readiness probe passes)."""
    return is_true(pod, POD_READY)


def container_exit_code(pod: Mapping[str, Any], container: str) -> int | None:
    """The exit code of ``container`` once it has terminated, else None."""
    for status in _items(pod, "status", "containerStatuses"):
        if status.get("name") == container:
            code = dig(status, "state", "terminated", "exitCode")
            return code if isinstance(code, int) and not isinstance(code, bool) else None
    return None


def termination_message(pod: Mapping[str, Any], container: str) -> str:
    """What the container left in its termination-message file when it ended, or ""."""
    for status in _items(pod, "status", "containerStatuses"):
        if status.get("name") == container:
            return str(dig(status, "state", "terminated", "message") or "").strip()
    return ""


def waiting_reason(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the pod does not start: a container's waiting reason and message, or Unschedulable.

    Covers ``ImagePullBackOff``, ``ErrImagePull``, ``CreateContainerConfigError``,
    ``CrashLoopBackOff`` and the like, init containers first; the normal start-up reasons
    (``STARTING_REASONS``) are skipped. Then ``PodScheduled=False`` with reason Unschedulable.
    """
    for key in ("initContainerStatuses", "containerStatuses"):
        for status in _items(pod, "status", key):
            reason = dig(status, "state", "waiting", "reason")
            if reason and reason not in STARTING_REASONS:
                message = dig(status, "state", "waiting", "message")
                return str(reason), str(message or "")
    scheduled = condition(pod, POD_SCHEDULED)
    if (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == UNSCHEDULABLE
    ):
        return UNSCHEDULABLE, str(scheduled.get("message") or "")
    return None


def workload_admitted(wl: Mapping[str, Any]) -> bool:
    """True when the Workload is admitted and neither being evicted nor finished.

    An evicted Workload keeps ``Admitted=True`` until its pods are gone (Kueue releases the quota
    only once no pod runs), and a finished one may still read True; neither counts as admitted.
    """
    return is_true(wl, ADMITTED) and not is_true(wl, EVICTED) and not is_true(wl, FINISHED)


def workload_active(wl: Mapping[str, Any]) -> bool:
    """False once ``spec.active`` is false (parked: Kueue evicts it and keeps it out of its
    queue); a Workload without the field is active (Kueue's default), at either API version."""
    return dig(wl, "spec", "active") is not False


def parked(wl: Mapping[str, Any]) -> bool:
    """True when this server parked the Workload: inactive, with ``PARKED_ANNOTATION``, and not
    deactivated by Kueue itself since (``DeactivatedDueTo…``, say after someone else woke it)."""
    if workload_active(wl) or dig(wl, "metadata", "annotations", PARKED_ANNOTATION) != "true":
        return False
    evicted = workload_evicted(wl)
    return evicted is None or not evicted[0].startswith(REASON_DEACTIVATED + "DueTo")


def holds_quota(wl: Mapping[str, Any]) -> bool:
    """True while ``QuotaReserved`` is True: Kueue has not yet dropped the admission (after an
    eviction it does once no pod of the group runs)."""
    return is_true(wl, QUOTA_RESERVED)


def workload_evicted(wl: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(reason, message)`` of a True ``Evicted`` condition (``Preempted``, …), or None."""
    return _reason_message(wl, EVICTED)


def workload_finished(wl: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(reason, message)`` of a True ``Finished`` condition, or None."""
    return _reason_message(wl, FINISHED)


def flavors(wl: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceFlavors of the Workload's current admission, sorted, each once."""
    found: set[str] = set()
    for assignment in _items(wl, "status", "admission", "podSetAssignments"):
        chosen = assignment.get("flavors")
        if isinstance(chosen, Mapping):
            found.update(str(flavor) for flavor in chosen.values())
    return tuple(sorted(found))
