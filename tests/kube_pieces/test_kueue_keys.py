"""Kueue's keys and ours, API coordinates, and the pure readers of pods and Workloads."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from kernel_queue.kube import kueue
from kernel_queue.kube.queueing.kueue_versions import KueueVersions


def test_kueue_keys_have_kueues_values() -> None:
    assert {
        "queue": kueue.QUEUE_NAME_LABEL,
        "group": kueue.POD_GROUP_NAME_LABEL,
        "count": kueue.POD_GROUP_TOTAL_COUNT_ANNOTATION,
        "priority": kueue.PRIORITY_CLASS_LABEL,
        "managed": kueue.MANAGED_LABEL,
        "retriable": kueue.RETRIABLE_IN_GROUP_ANNOTATION,
        "role-hash": kueue.ROLE_HASH_ANNOTATION,
    } == {
        "queue": "kueue.x-k8s.io/queue-name",
        "group": "kueue.x-k8s.io/pod-group-name",
        "count": "kueue.x-k8s.io/pod-group-total-count",
        "priority": "kueue.x-k8s.io/priority-class",
        "managed": "kueue.x-k8s.io/managed",
        "retriable": "kueue.x-k8s.io/retriable-in-group",
        "role-hash": "kueue.x-k8s.io/role-hash",
    }


def test_condition_types_and_reasons() -> None:
    assert [kueue.ADMITTED, kueue.EVICTED, kueue.REQUEUED] == ["Admitted", "Evicted", "Requeued"]
    assert [kueue.WAITING_FOR_REPLACEMENT_PODS, kueue.FINISHED] == [
        "WaitingForReplacementPods",
        "Finished",
    ]


def test_our_keys_share_one_prefix() -> None:
    assert [
        kueue.KERNEL_ID_LABEL,
        kueue.ROLE_LABEL,
        kueue.USER_LABEL,
        kueue.USER_ANNOTATION,
        kueue.KERNELSPEC_ANNOTATION,
    ] == [
        "kernel-queue.dev/kernel-id",
        "kernel-queue.dev/role",
        "kernel-queue.dev/user",
        "kernel-queue.dev/user",
        "kernel-queue.dev/kernelspec",
    ]
    assert (kueue.MANAGED_BY_LABEL, kueue.MANAGED_BY) == (
        "app.kubernetes.io/managed-by",
        "kernel-queue",
    )
    assert (kueue.COMPONENT_LABEL, kueue.COMPONENT) == ("app.kubernetes.io/component", "kernel")
    assert (kueue.ROLE_HEAD, kueue.ROLE_WORKER) == ("head", "worker")


KQ1, KQ2 = "/apis/kueue.x-k8s.io/v1beta1", "/apis/kueue.x-k8s.io/v1beta2"
V1, V2 = KueueVersions("v1beta1"), KueueVersions("v1beta2")


def namespaced(kind: kueue.Kind, root: str, plural: str, id: str) -> Any:
    """A case of `kind`, served at `root`: its API version, and its collection in namespace ns."""
    version = root.removeprefix("/api/").removeprefix("/apis/")
    return pytest.param(kind, version, f"{root}/namespaces/ns/{plural}", id=id)


@pytest.mark.parametrize(
    ("kind", "api_version", "collection"),
    [
        namespaced(kueue.PODS, "/api/v1", "pods", "pods"),
        namespaced(kueue.SECRETS, "/api/v1", "secrets", "secrets"),
        namespaced(kueue.SERVICES, "/api/v1", "services", "services"),
        namespaced(V2.workloads, KQ2, "workloads", "workloads"),
        namespaced(V1.workloads, KQ1, "workloads", "workloads-v1beta1"),
        namespaced(V2.local_queues, KQ2, "localqueues", "localqueues"),
        namespaced(V1.local_queues, KQ1, "localqueues", "localqueues-v1beta1"),
    ],
)
def test_namespaced_kinds(kind: kueue.Kind, api_version: str, collection: str) -> None:
    assert kind.namespaced
    assert kind.api_version == api_version
    assert kind.path("ns") == collection
    assert kind.path("ns", "p") == collection + "/p"
    assert kind.path() == collection.replace("/namespaces/ns", "")  # across all namespaces
    with pytest.raises(ValueError, match="needs a namespace"):
        kind.path(None, "p")


@pytest.mark.parametrize(
    ("kind", "collection"),
    [
        pytest.param(
            V2.workload_priority_classes,
            f"{KQ2}/workloadpriorityclasses",
            id="workloadpriorityclasses",
        ),
        pytest.param(
            V1.workload_priority_classes,
            f"{KQ1}/workloadpriorityclasses",
            id="workloadpriorityclasses-v1beta1",
        ),
        pytest.param(V1.cluster_queues, f"{KQ1}/clusterqueues", id="clusterqueues-v1beta1"),
    ],
)
def test_cluster_scoped_kinds(kind: kueue.Kind, collection: str) -> None:
    assert not kind.namespaced
    assert kind.path() == collection
    assert kind.path(name="x") == collection + "/x"


def test_kind_is_a_frozen_value() -> None:
    workloads = KueueVersions("v1beta2").workloads
    assert kueue.Kind("kueue.x-k8s.io", "v1beta2", "workloads", True) == workloads
    with pytest.raises(AttributeError):
        workloads.plural = "pods"  # type: ignore[misc]


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_pending_workloads_path_follows_the_visibility_version(version: str) -> None:
    assert KueueVersions("v1beta2", version).pending_workloads_path("team-a", "user-queue") == (
        f"/apis/visibility.kueue.x-k8s.io/{version}/namespaces/team-a/localqueues/user-queue"
        "/pendingworkloads"
    )


def test_no_pending_workloads_path_without_a_visibility_api() -> None:
    assert KueueVersions("v1beta1").pending_workloads_path("team-a", "user-queue") is None


def pod(
    gates: list[str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {}, "status": {}}
    if gates is not None:
        obj["spec"]["schedulingGates"] = [{"name": name} for name in gates]
    if conditions is not None:
        obj["status"]["conditions"] = conditions
    if statuses is not None:
        obj["status"]["containerStatuses"] = statuses
    if init_statuses is not None:
        obj["status"]["initContainerStatuses"] = init_statuses
    return obj


def cond(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("obj", "gated"),
    [
        pytest.param(pod(["kueue.x-k8s.io/admission"]), True, id="admission-gate"),
        pytest.param(pod(["kueue.x-k8s.io/topology"]), True, id="topology-gate"),
        pytest.param(pod(["example.com/other", "kueue.x-k8s.io/x"]), True, id="any-kueue-gate"),
        pytest.param(pod(["example.com/other"]), False, id="foreign-gate"),
        pytest.param(pod([]), False, id="no-gates"),
        pytest.param(pod(), False, id="no-field"),
        pytest.param({}, False, id="empty-dict"),
        pytest.param({"spec": {"schedulingGates": None}}, False, id="null"),
    ],
)
def test_is_gated(obj: dict[str, Any], gated: bool) -> None:
    assert kueue.is_gated(obj) is gated


READY = {status: cond("Ready", status) for status in ("True", "False", "Unknown")}


@pytest.mark.parametrize(
    ("obj", "type_", "found", "true"),
    [
        pytest.param(pod(conditions=[READY["True"]]), "Ready", READY["True"], True, id="true"),
        pytest.param(pod(conditions=[READY["False"]]), "Ready", READY["False"], False, id="false"),
        pytest.param(
            pod(conditions=[READY["Unknown"]]), "Ready", READY["Unknown"], False, id="unknown"
        ),
        pytest.param(pod(conditions=[READY["True"]]), "Other", None, False, id="absent"),
        pytest.param({}, "Ready", None, False, id="no-status"),
        pytest.param({"status": {"conditions": None}}, "Ready", None, False, id="null-list"),
    ],
)
def test_condition_and_is_true(
    obj: dict[str, Any], type_: str, found: dict[str, Any] | None, true: bool
) -> None:
    assert kueue.condition(obj, type_) == found
    assert kueue.is_true(obj, type_) is true


@pytest.mark.parametrize(
    ("obj", "ready"),
    [
        pytest.param(pod(conditions=[cond("Ready", "True")]), True, id="ready"),
        pytest.param(pod(conditions=[cond("Ready", "False")]), False, id="not-ready"),
        pytest.param(pod(conditions=[cond("ContainersReady", "True")]), False, id="other-type"),
        pytest.param(pod(), False, id="no-conditions"),
    ],
)
def test_pod_ready(obj: dict[str, Any], ready: bool) -> None:
    assert kueue.pod_ready(obj) is ready


def terminated(name: str, code: int) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": "Error"}}}


def waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


@pytest.mark.parametrize(
    ("obj", "container", "code"),
    [
        pytest.param(pod(statuses=[terminated("kernel", 143)]), "kernel", 143, id="143"),
        pytest.param(pod(statuses=[terminated("kernel", 0)]), "kernel", 0, id="0"),
        pytest.param(
            pod(statuses=[terminated("sidecar", 1), terminated("kernel", 2)]),
            "kernel",
            2,
            id="by-name",
        ),
        pytest.param(
            pod(statuses=[{"name": "kernel", "state": {"running": {}}}]),
            "kernel",
            None,
            id="running",
        ),
        pytest.param(pod(statuses=[terminated("kernel", 1)]), "worker", None, id="other-name"),
        pytest.param(pod(), "kernel", None, id="no-statuses"),
    ],
)
def test_container_exit_code(obj: dict[str, Any], container: str, code: int | None) -> None:
    assert kueue.container_exit_code(obj, container) == code


def kernel_waits(reason: str, message: str = "") -> dict[str, Any]:
    return pod(statuses=[waiting("kernel", reason, message)])


def unscheduled(reason: str, message: str = "") -> dict[str, Any]:
    return pod(conditions=[cond("PodScheduled", "False", reason, message)])


BACK_OFF = ("ImagePullBackOff", "Back-off pulling image")
NO_SECRET = ("CreateContainerConfigError", 'secret "s" not found')
INIT_FAILS = pod(
    statuses=[waiting("kernel", "ContainerCreating")],
    init_statuses=[waiting("init", "ErrImagePull", "init image")],
)


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        pytest.param(kernel_waits(*BACK_OFF), BACK_OFF, id="image-pull-backoff"),
        pytest.param(kernel_waits("ErrImagePull"), ("ErrImagePull", ""), id="err-image-pull"),
        pytest.param(kernel_waits(*NO_SECRET), NO_SECRET, id="config-error"),
        pytest.param(INIT_FAILS, ("ErrImagePull", "init image"), id="init-container-first"),
        pytest.param(kernel_waits("ContainerCreating"), None, id="starting-skipped"),
        pytest.param(
            unscheduled("Unschedulable", "0/3 nodes"),
            ("Unschedulable", "0/3 nodes"),
            id="unschedulable",
        ),
        pytest.param(
            unscheduled("SchedulingGated", "gated"), None, id="scheduling-gated-is-not-a-problem"
        ),
        pytest.param(
            pod(
                statuses=[waiting("kernel", "ImagePullBackOff")],
                conditions=[cond("PodScheduled", "False", "Unschedulable")],
            ),
            ("ImagePullBackOff", ""),
            id="container-before-scheduling",
        ),
        pytest.param(pod(conditions=[cond("PodScheduled", "True")]), None, id="scheduled"),
        pytest.param(pod(), None, id="nothing"),
    ],
)
def test_waiting_reason(obj: dict[str, Any], reason: tuple[str, str] | None) -> None:
    assert kueue.waiting_reason(obj) == reason


def workload(*conditions: dict[str, Any], admission: Any = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission is not None:
        status["admission"] = admission
    return {"metadata": {"name": "kq-1a2b3c4d"}, "spec": {}, "status": status}


PREEMPTED_MESSAGE = "Preempted to accommodate a workload (UID: u, JobUID: UNKNOWN) due to ..."


def reads(
    wl: dict[str, Any],
    *,
    admitted: bool = False,
    evicted: tuple[str, str] | None = None,
    finished: tuple[str, str] | None = None,
    id: str,
) -> Any:
    """A case of a Workload and what the readers say of it (not admitted, evicted nor finished
    where not said)."""
    return pytest.param(wl, admitted, evicted, finished, id=id)


@pytest.mark.parametrize(
    ("wl", "admitted", "evicted", "finished"),
    [
        reads(workload(cond("QuotaReserved", "False", "Pending", "waiting")), id="pending"),
        reads(
            workload(
                cond("QuotaReserved", "True", "QuotaReserved"),
                cond("Admitted", "True", "Admitted", "The workload is admitted"),
            ),
            admitted=True,
            id="admitted",
        ),
        reads(
            workload(
                cond("Admitted", "True", "Admitted"),
                cond("Evicted", "True", "Preempted", PREEMPTED_MESSAGE),
            ),
            evicted=("Preempted", PREEMPTED_MESSAGE),
            id="evicted-while-still-admitted",
        ),
        reads(
            workload(
                cond("Admitted", "False", "NoReservation"),
                cond("Evicted", "False", "QuotaReserved", "Previously: Preempted"),
            ),
            id="readmission-pending-evicted-false",
        ),
        reads(
            workload(
                cond("Admitted", "True", "Admitted"),
                cond("Finished", "True", "Succeeded", "Pods succeeded: 1/1."),
            ),
            finished=("Succeeded", "Pods succeeded: 1/1."),
            id="finished",
        ),
        reads(workload(), id="fresh"),
        reads({}, id="empty"),
    ],
)
def test_workload_readers(
    wl: dict[str, Any],
    admitted: bool,
    evicted: tuple[str, str] | None,
    finished: tuple[str, str] | None,
) -> None:
    assert kueue.workload_admitted(wl) is admitted
    assert kueue.workload_evicted(wl) == evicted
    assert kueue.workload_finished(wl) == finished


@pytest.mark.parametrize(
    ("wl", "expected"),
    [
        pytest.param(
            workload(
                admission={
                    "clusterQueue": "gpu-cq",
                    "podSetAssignments": [
                        {
                            "name": "3c9d1f0a",
                            "flavors": {
                                "cpu": "a100-nodes",
                                "memory": "a100-nodes",
                                "nvidia.com/gpu": "a100-nodes",
                            },
                        }
                    ],
                }
            ),
            ("a100-nodes",),
            id="one-flavor",
        ),
        pytest.param(
            workload(
                admission={
                    "podSetAssignments": [
                        {"name": "a", "flavors": {"nvidia.com/gpu": "h100", "cpu": "cpu-pool"}},
                        {"name": "b", "flavors": {"nvidia.com/gpu": "a100"}},
                    ]
                }
            ),
            ("a100", "cpu-pool", "h100"),
            id="several-sorted",
        ),
        pytest.param(workload(), (), id="not-admitted"),
        pytest.param({"status": {"admission": None}}, (), id="admission-null"),
        pytest.param(
            workload(admission={"podSetAssignments": [{"name": "a"}]}), (), id="no-flavors"
        ),
    ],
)
def test_flavors(wl: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert kueue.flavors(wl) == expected


def test_the_kube_vocabulary_imports_no_kubernetes_client() -> None:
    code = (
        "import sys\n"
        "import kernel_queue.kube.kueue, kernel_queue.kube.names\n"
        "import kernel_queue.kube.objects.manifests\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('kubernetes', 'aiohttp')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"
