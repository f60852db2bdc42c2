"""Golden dicts for a kernel's Secret, Service and pods, built from representative GroupSpecs."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue import spec as kernelspecs
from kernel_queue.kube import names
from kernel_queue.kube.objects import manifests, submission
from kernel_queue.model import CheckpointSettings
from tests.kube_pieces.specs import GROUP, KERNEL_ID, KEY, SPEC

OUR_LABELS = {
    "kernel-queue.dev/kernel-id": KERNEL_ID,
    "kernel-queue.dev/user": "alice",
    "app.kubernetes.io/managed-by": "kernel-queue",
    "app.kubernetes.io/component": "kernel",
}
OUR_ANNOTATIONS = {
    "kernel-queue.dev/user": "alice",
    "kernel-queue.dev/kernelspec": "python3-gpu-queued",
}
HEAD_ENV = [
    {"name": "KERNEL_QUEUE_LAUNCH_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {
        "name": "KERNEL_QUEUE_LAUNCH_KEY",
        "valueFrom": {
            "secretKeyRef": {"name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-key", "key": "key"}
        },
    },
    {"name": "KERNEL_QUEUE_LAUNCH_PORTS", "value": "50100,50101,50102,50103,50104"},
    {"name": "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT", "value": "25"},
    {"name": "KERNEL_QUEUE_LAUNCH_TERMINATION_LOG", "value": "/dev/termination-log"},
    {"name": "KERNEL_ID", "value": KERNEL_ID},
    {"name": "KERNEL_USERNAME", "value": "alice"},
]
HEAD_PORTS = [
    {"name": "shell", "containerPort": 50100, "protocol": "TCP"},
    {"name": "iopub", "containerPort": 50101, "protocol": "TCP"},
    {"name": "stdin", "containerPort": 50102, "protocol": "TCP"},
    {"name": "control", "containerPort": 50103, "protocol": "TCP"},
    {"name": "hb", "containerPort": 50104, "protocol": "TCP"},
]
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}
READINESS = {"tcpSocket": {"port": "shell"}, "periodSeconds": 1, "failureThreshold": 3}
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}

GOLDEN_GPU_HEAD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-head-0",
        "namespace": "team-a",
        "labels": {
            "kernel-queue.dev/kernel-id": KERNEL_ID,
            "kernel-queue.dev/role": "head",
            "kernel-queue.dev/user": "alice",
            "app.kubernetes.io/managed-by": "kernel-queue",
            "app.kubernetes.io/component": "kernel",
            "kueue.x-k8s.io/queue-name": "user-queue",
            "kueue.x-k8s.io/pod-group-name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d",
        },
        "annotations": {
            "kernel-queue.dev/user": "alice",
            "kernel-queue.dev/kernelspec": "python3-gpu-queued",
            "kueue.x-k8s.io/pod-group-total-count": "1",
        },
    },
    "spec": {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "kernel",
                "image": "registry.example/kernel:1.0",
                "command": ["python", "-m", "kernel_queue.launcher"],
                "args": ["--", "python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "env": [
                    {
                        "name": "KERNEL_QUEUE_LAUNCH_IP",
                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                    },
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "KERNEL_QUEUE_LAUNCH_KEY",
                        "valueFrom": {
                            "secretKeyRef": {
                                "name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-key",
                                "key": "key",
                            }
                        },
                    },
                    {"name": "KERNEL_QUEUE_LAUNCH_PORTS", "value": "50100,50101,50102,50103,50104"},
                    {"name": "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT", "value": "25"},
                    {
                        "name": "KERNEL_QUEUE_LAUNCH_TERMINATION_LOG",
                        "value": "/dev/termination-log",
                    },
                    {"name": "KERNEL_ID", "value": "1a2b3c4d-5e6f-4a0b-8c9d-0e1f2a3b4c5d"},
                    {"name": "KERNEL_USERNAME", "value": "alice"},
                ],
                "ports": [
                    {"name": "shell", "containerPort": 50100, "protocol": "TCP"},
                    {"name": "iopub", "containerPort": 50101, "protocol": "TCP"},
                    {"name": "stdin", "containerPort": 50102, "protocol": "TCP"},
                    {"name": "control", "containerPort": 50103, "protocol": "TCP"},
                    {"name": "hb", "containerPort": 50104, "protocol": "TCP"},
                ],
                "readinessProbe": {
                    "tcpSocket": {"port": "shell"},
                    "periodSeconds": 1,
                    "failureThreshold": 3,
                },
                "resources": {
                    "requests": {"nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": True,
                },
            }
        ],
    },
}


def test_a_one_gpu_single_pod_without_a_template() -> None:
    assert manifests.pods(SPEC, GROUP, 0) == [GOLDEN_GPU_HEAD]


def test_cpu_and_memory_are_requests_only() -> None:
    spec = replace(SPEC, gpus=0, cpu="4", memory="16Gi")

    [pod] = manifests.pods(spec, GROUP, 0)

    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"}}


def test_cpu_memory_and_gpus_together() -> None:
    spec = replace(SPEC, gpus=2, cpu="500m", memory="8Gi", gpu_resource="amd.com/gpu")

    [pod] = manifests.pods(spec, GROUP, 0)

    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "8Gi", "amd.com/gpu": "2"},
        "limits": {"amd.com/gpu": "2"},
    }


def test_no_resources_at_all() -> None:
    [pod] = manifests.pods(replace(SPEC, gpus=0), GROUP, 0)

    assert "resources" not in pod["spec"]["containers"][0]


def test_a_priority_class_adds_kueues_label() -> None:
    [pod] = manifests.pods(replace(SPEC, priority_class="interactive"), GROUP, 0)

    assert pod["metadata"]["labels"] == {
        **GOLDEN_GPU_HEAD["metadata"]["labels"],
        "kueue.x-k8s.io/priority-class": "interactive",
    }


PRIORITY = "kueue.x-k8s.io/priority-class"


def test_the_default_class_may_be_named_and_every_pod_of_every_round_carries_it() -> None:
    """Kueue 0.20 defaults a pod without the label from a class named `default`; a kernelspec
    naming `default` itself gets it written like any other class, on workers and replacements."""
    spec = replace(SPEC, priority_class="default", pod_group_size=2)
    assert names.is_queue_name("default")  # what the kernelspec check asks of a class name
    for attempt in (0, 1):
        assert [
            p["metadata"]["labels"][PRIORITY] for p in manifests.pods(spec, GROUP, attempt)
        ] == [
            "default",
            "default",
        ]


def test_the_kernelspecs_class_wins_over_a_templates_label() -> None:
    template = {"metadata": {"labels": {PRIORITY: "batch", "team": "ml"}}}
    spec = replace(SPEC, priority_class="interactive", pod_template=template)
    [pod] = manifests.pods(spec, GROUP, 0)
    assert pod["metadata"]["labels"][PRIORITY] == "interactive"
    assert pod["metadata"]["labels"]["team"] == "ml"


def test_without_a_class_no_label_is_written_so_kueue_decides() -> None:
    [pod] = manifests.pods(SPEC, GROUP, 0)
    assert PRIORITY not in pod["metadata"]["labels"]


async def test_replacement_pods_carry_the_class_kueue_gave_the_first_pods() -> None:
    """On Kueue 0.20 with a `default` class the webhook labels a pod created without a class;
    the group's replacement pods then carry that class explicitly, so the class vanishing
    meanwhile cannot take it away from them."""
    stored: list[dict[str, Any]] = []

    async def create(kind: Any, body: dict[str, Any]) -> dict[str, Any]:
        made = copy.deepcopy(body)
        if kind.plural == "pods":  # Kueue 0.20's webhook, with a class named `default`
            made["metadata"]["labels"].setdefault(PRIORITY, "default")
            made["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        if kind.plural == "services":
            made["spec"]["clusterIP"] = "10.96.0.10"
        stored.append(made)
        return made

    spec = replace(SPEC, pod_group_size=2)
    progress = submission.Progress()
    await submission.create_launch(spec, GROUP, 0, owner="", create=create, progress=progress)
    assert progress.priority_class == "default"
    again = manifests.pods(submission.pinned(spec, progress), GROUP, 1)
    assert [p["metadata"]["labels"][PRIORITY] for p in again] == ["default", "default"]
    assert submission.pinned(spec, submission.Progress()) == spec  # no class: still none
    named = replace(spec, priority_class="interactive")
    assert submission.pinned(named, submission.Progress()).priority_class == "interactive"


GROUP_SERVICE = "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-group"
HEAD_NAME = f"head.{GROUP_SERVICE}.team-a.svc"
WORKER_NAME = f"w1.{GROUP_SERVICE}.team-a.svc"


def group_env(rank: int) -> list[dict[str, str]]:
    """The variables of rank `rank` in the two-pod group of team-a."""
    return [
        {"name": "KERNEL_QUEUE_RANK", "value": str(rank)},
        {"name": "KERNEL_QUEUE_WORLD_SIZE", "value": "2"},
        {"name": "KERNEL_QUEUE_HEAD_ADDRESS", "value": HEAD_NAME},
        {"name": "KERNEL_QUEUE_ADDRESSES", "value": f"{HEAD_NAME},{WORKER_NAME}"},
        {"name": "MASTER_ADDR", "value": HEAD_NAME},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "RANK", "value": str(rank)},
        {"name": "WORLD_SIZE", "value": "2"},
        {"name": "LOCAL_RANK", "value": "0"},
    ]


def two_pod_group_member(name: str, role: str, container: dict[str, Any]) -> dict[str, Any]:
    """A pod of the two-pod group kq-…-1 (each asking for 2 CPUs and a GPU) running `container`,
    named in the group's headless Service by its hostname."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {
                **OUR_LABELS,
                "kernel-queue.dev/role": role,
                "kueue.x-k8s.io/queue-name": "user-queue",
                "kueue.x-k8s.io/pod-group-name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-1",
            },
            "annotations": {**OUR_ANNOTATIONS, "kueue.x-k8s.io/pod-group-total-count": "2"},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY,
            "hostname": "head" if role == "head" else "w1",
            "subdomain": GROUP_SERVICE,
            "containers": [
                {
                    **container,
                    "image": "registry.example/kernel:1.0",
                    "resources": {
                        "requests": {"cpu": "2", "nvidia.com/gpu": "1"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                    "securityContext": CONTAINER_SECURITY,
                }
            ],
        },
    }


def test_a_two_pod_group_is_a_head_and_a_worker() -> None:
    spec = replace(SPEC, pod_group_size=2, cpu="2")

    head, worker = manifests.pods(
        spec, "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-1", 0, kernel_env={"OMP_NUM_THREADS": "2"}
    )

    assert head == two_pod_group_member(
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-1-head-0",
        "head",
        {
            "name": "kernel",
            "command": ["python", "-m", "kernel_queue.launcher"],
            "args": ["--", "python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "env": [*HEAD_ENV, *group_env(0), {"name": "OMP_NUM_THREADS", "value": "2"}],
            "ports": HEAD_PORTS,
            "readinessProbe": READINESS,
        },
    )
    assert worker == two_pod_group_member(
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-1-w1-0",
        "worker",
        {
            "name": "worker",
            "command": ["python", "-m", "kernel_queue.launcher", "--worker"],
            "env": [
                *group_env(1),
                {"name": "KERNEL_ID", "value": KERNEL_ID},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "OMP_NUM_THREADS", "value": "2"},
            ],
        },
    )


def test_workers_are_numbered_and_run_the_worker_command_under_the_launcher() -> None:
    command = ("dask", "worker", "tcp://$(MASTER_ADDR):8786", "--name", "w$(RANK)", "$$5")
    spec = replace(SPEC, pod_group_size=4, namespace=None, worker_command=command)

    pods = manifests.pods(spec, GROUP, 2)

    assert [pod["metadata"]["name"] for pod in pods] == [
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-head-2",
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-w1-2",
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-w2-2",
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-w3-2",
    ]
    worker = pods[3]["spec"]["containers"][0]
    # the launcher's worker mode supervises it; Kubernetes expands $(VAR) (not escaped)
    assert worker["command"] == ["python", "-m", "kernel_queue.launcher", "--worker"]
    assert worker["args"] == ["--", *command]
    # the command's SIGKILL, 25 s after SIGTERM, comes before the kubelet's (30 s)
    assert {"name": "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT", "value": "25"} in worker["env"]
    assert pods[3]["spec"]["terminationGracePeriodSeconds"] == 30
    names = [
        f"{host}.kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-group" for host in ("head", "w1", "w2", "w3")
    ]
    assert worker["env"][:4] == [
        {"name": "KERNEL_QUEUE_RANK", "value": "3"},
        {"name": "KERNEL_QUEUE_WORLD_SIZE", "value": "4"},
        {"name": "KERNEL_QUEUE_HEAD_ADDRESS", "value": names[0]},  # no namespace given
        {"name": "KERNEL_QUEUE_ADDRESSES", "value": ",".join(names)},
    ]
    assert [p["spec"]["hostname"] for p in pods] == ["head", "w1", "w2", "w3"]
    assert {p["spec"]["subdomain"] for p in pods} == {"kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-group"}
    assert all("namespace" not in pod["metadata"] for pod in pods)


def test_the_group_service_names_every_pod_of_a_multi_pod_kernel() -> None:
    assert manifests.group_service(replace(SPEC, pod_group_size=2)) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": our_metadata(GROUP_SERVICE),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": {"kernel-queue.dev/kernel-id": KERNEL_ID},
            "publishNotReadyAddresses": True,
        },
    }
    assert manifests.member_addresses(replace(SPEC, pod_group_size=3)) == [
        HEAD_NAME,
        WORKER_NAME,
        f"w2.{GROUP_SERVICE}.team-a.svc",
    ]


def test_a_single_pod_has_no_group_name_and_no_group_variables() -> None:
    (pod,) = manifests.pods(SPEC, GROUP, 0)
    assert "hostname" not in pod["spec"] and "subdomain" not in pod["spec"]
    env = {item["name"] for item in pod["spec"]["containers"][0]["env"]}
    assert not env & {"KERNEL_QUEUE_RANK", "MASTER_ADDR", "RANK", "WORLD_SIZE"}


def test_the_kernelspec_may_choose_the_rendezvous_port_but_no_other_group_variable() -> None:
    spec = replace(SPEC, pod_group_size=2)
    chosen = {"MASTER_PORT": "12355", "RANK": "7", "KERNEL_QUEUE_ADDRESSES": "elsewhere"}
    for pod in manifests.pods(spec, GROUP, 0, kernel_env=chosen):
        env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
        assert env["MASTER_PORT"] == "12355"
        assert env["RANK"] == env["KERNEL_QUEUE_RANK"] in ("0", "1")
        assert env["KERNEL_QUEUE_ADDRESSES"] == f"{HEAD_NAME},{WORKER_NAME}"


TEMPLATE = {
    "metadata": {
        "name": "ignored",
        "labels": {"team": "ml", "kernel-queue.dev/role": "spoofed"},
        "annotations": {
            "example.com/owner": "ml-team",
            "kueue.x-k8s.io/retriable-in-group": "false",
        },
    },
    "spec": {
        "nodeSelector": {"cloud.example/accelerator": "a100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "runtimeClassName": "nvidia",
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsUser": 1000, "fsGroup": 100, "runAsNonRoot": False},
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "containers": [
            {
                "name": "log-shipper",
                "image": "registry.example/shipper:2",
                "args": ["--follow", "/var/log/kernel"],
            },
            {
                "name": "kernel",
                "image": "registry.example/ignored:0",
                "command": ["ignored"],
                "workingDir": "/home/jovyan",
                "env": [
                    {"name": "HF_HOME", "value": "/cache/hf"},
                    {"name": "KERNEL_ID", "value": "spoofed"},
                ],
                "envFrom": [{"configMapRef": {"name": "kernel-defaults"}}],
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                "resources": {
                    "requests": {"ephemeral-storage": "1Gi"},
                    "limits": {"memory": "32Gi"},
                },
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": True,
                },
            },
            {"name": "worker", "image": "registry.example/worker-only:1"},
        ],
    },
}


def test_the_pod_template_is_merged_under_our_fields() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, cpu="4", memory="16Gi")

    [pod] = manifests.pods(spec, GROUP, 0)

    assert (sorted(pod), pod["apiVersion"], pod["kind"]) == (
        ["apiVersion", "kind", "metadata", "spec"],
        "v1",
        "Pod",
    )
    assert pod == {
        **pod,
        "metadata": {
            "name": f"{GROUP}-head-0",
            "namespace": "team-a",
            "labels": {
                "team": "ml",
                **OUR_LABELS,
                "kernel-queue.dev/role": "head",
                "kueue.x-k8s.io/queue-name": "user-queue",
                "kueue.x-k8s.io/pod-group-name": GROUP,
            },
            "annotations": {
                "example.com/owner": "ml-team",
                **OUR_ANNOTATIONS,
                "kueue.x-k8s.io/pod-group-total-count": "1",
            },
        },
        "spec": {
            "nodeSelector": {"cloud.example/accelerator": "a100"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "runtimeClassName": "nvidia",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsUser": 1000,
                "fsGroup": 100,
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
            "containers": [
                {
                    "name": "kernel",
                    "image": "registry.example/kernel:1.0",
                    "command": ["python", "-m", "kernel_queue.launcher"],
                    "args": ["--", "python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "workingDir": "/home/jovyan",
                    "env": [*HEAD_ENV, {"name": "HF_HOME", "value": "/cache/hf"}],
                    "envFrom": [{"configMapRef": {"name": "kernel-defaults"}}],
                    "ports": HEAD_PORTS,
                    "readinessProbe": READINESS,
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                    "resources": {
                        "requests": {
                            "ephemeral-storage": "1Gi",
                            "cpu": "4",
                            "memory": "16Gi",
                            "nvidia.com/gpu": "1",
                        },
                        "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
                    },
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True,
                    },
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example/shipper:2",
                    "args": ["--follow", "/var/log/kernel"],
                    "securityContext": CONTAINER_SECURITY,  # hardened as ours are
                },
            ],
        },
    }


def test_worker_pods_merge_the_templates_worker_container_and_keep_its_sidecars() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, pod_group_size=2, image=None)

    head, worker = manifests.pods(spec, GROUP, 0)

    assert [c["name"] for c in head["spec"]["containers"]] == ["kernel", "log-shipper"]
    assert head["spec"]["containers"][0]["image"] == "registry.example/ignored:0"
    assert [c["name"] for c in worker["spec"]["containers"]] == ["worker", "log-shipper"]
    assert worker["spec"]["containers"][0]["image"] == "registry.example/worker-only:1"
    assert worker["spec"]["nodeSelector"] == {"cloud.example/accelerator": "a100"}


def test_workers_fall_back_to_the_kernel_containers_image() -> None:
    template = {"spec": {"containers": [{"name": "kernel", "image": "registry.example/k:2"}]}}
    spec = replace(SPEC, pod_template=template, pod_group_size=2, image=None)

    head, worker = manifests.pods(spec, GROUP, 0)

    assert head["spec"]["containers"][0]["image"] == "registry.example/k:2"
    assert worker["spec"]["containers"][0]["image"] == "registry.example/k:2"
    assert [c["name"] for c in worker["spec"]["containers"]] == ["worker"]


def test_the_template_is_neither_changed_nor_shared() -> None:
    before = copy.deepcopy(TEMPLATE)
    spec = replace(SPEC, pod_template=TEMPLATE)

    [pod] = manifests.pods(spec, GROUP, 0)
    pod["spec"]["nodeSelector"]["x"] = "y"
    pod["spec"]["containers"][1]["args"].append("z")

    assert before == TEMPLATE
    assert manifests.pods(spec, GROUP, 0)[0]["spec"]["nodeSelector"] == {
        "cloud.example/accelerator": "a100"
    }


def test_a_missing_image_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(errors.ConfigError, match="image") as raised:
        manifests.pods(replace(SPEC, image=None), GROUP, 0)

    assert "python3-gpu-queued" in str(raised.value)
    assert KERNEL_ID in str(raised.value)


def our_metadata(name: str) -> dict[str, Any]:
    """The metadata of the kernel's Secret and Service: our labels and annotations only."""
    return {
        "name": name,
        "namespace": "team-a",
        "labels": OUR_LABELS,
        "annotations": OUR_ANNOTATIONS,
    }


def test_the_secret() -> None:
    assert manifests.secret(SPEC) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": our_metadata("kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-key"),
        "type": "Opaque",
        "stringData": {"key": KEY},
    }


def test_the_service() -> None:
    assert manifests.service(SPEC) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": our_metadata("kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d"),
        "spec": {
            "type": "ClusterIP",
            "selector": {"kernel-queue.dev/kernel-id": KERNEL_ID, "kernel-queue.dev/role": "head"},
            "ports": [
                {"name": "shell", "port": 50100, "targetPort": 50100, "protocol": "TCP"},
                {"name": "iopub", "port": 50101, "targetPort": 50101, "protocol": "TCP"},
                {"name": "stdin", "port": 50102, "targetPort": 50102, "protocol": "TCP"},
                {"name": "control", "port": 50103, "targetPort": 50103, "protocol": "TCP"},
                {"name": "hb", "port": 50104, "targetPort": 50104, "protocol": "TCP"},
            ],
            "publishNotReadyAddresses": True,
        },
    }


def test_the_service_and_secret_do_not_change_between_launches() -> None:
    later = replace(
        SPEC,
        connection=replace(SPEC.connection, ip="x"),
    )

    assert manifests.service(later) == manifests.service(SPEC)
    assert manifests.secret(later) == manifests.secret(SPEC)


def test_the_same_spec_gives_the_same_dicts() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, pod_group_size=3, priority_class="interactive")
    env = {"A": "1", "B": "2"}

    first = manifests.pods(spec, GROUP, 0, kernel_env=env, checkpoint_claim="ckpt")
    second = manifests.pods(
        copy.deepcopy(spec), GROUP, 0, kernel_env=dict(env), checkpoint_claim="ckpt"
    )

    assert first == second
    assert json.dumps(first) == json.dumps(second)  # same key order too
    assert manifests.service(spec) == manifests.service(spec)
    assert manifests.secret(spec) == manifests.secret(spec)


def test_a_replacement_attempt_changes_only_the_pod_names() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, pod_group_size=2)
    first = manifests.pods(spec, GROUP, 0, checkpoint_claim="ckpt")
    again = manifests.pods(spec, GROUP, 1, checkpoint_claim="ckpt")

    assert [p["metadata"]["name"] for p in again] == [
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-head-1",
        "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-w1-1",
    ]
    for before, after in zip(first, again, strict=True):
        after["metadata"]["name"] = before["metadata"]["name"]
        assert after == before


def test_the_key_is_in_the_secret_and_nowhere_else() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, pod_group_size=2)
    pods = manifests.pods(spec, GROUP, 0, kernel_env={"KERNEL_QUEUE_LAUNCH_KEY": KEY})

    assert KEY not in json.dumps(pods)
    assert KEY not in json.dumps(manifests.service(spec))
    assert KEY in json.dumps(manifests.secret(spec))


def test_pods_never_carry_retriable_in_group() -> None:
    spec = replace(SPEC, pod_template=TEMPLATE, pod_group_size=2)

    assert "retriable-in-group" not in json.dumps(manifests.pods(spec, GROUP, 0))


def test_the_servers_environment_never_reaches_a_pod() -> None:
    dumped = json.dumps(manifests.pods(replace(SPEC, pod_group_size=2), GROUP, 0))

    assert "server-token" not in dumped
    assert "/server/bin" not in dumped


def test_what_production_passes_keeps_the_servers_environment_out_of_the_pods() -> None:
    """As ``pre_launch`` and the backend do it: the server's environment with the kernelspec's
    ``env`` stanza over it, cut by ``spec.with_env``, then passed as ``kernel_env``."""
    server = {
        "PATH": "/server/bin",
        "JUPYTER_TOKEN": "server-token",
        "KERNEL_QUEUE_LAUNCH_MODE": "worker",
    }
    stanza = {"OMP_NUM_THREADS": "2", "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": "/elsewhere"}
    kube = replace(SPEC, backend="kubernetes", pod_group_size=2, env={})
    spec = kernelspecs.with_env(kube, {**server, **stanza}, stanza)

    head, worker = manifests.pods(spec, GROUP, 0, kernel_env=spec.env)

    assert head["spec"]["containers"][0]["env"] == [
        *HEAD_ENV,
        *group_env(0),
        {"name": "OMP_NUM_THREADS", "value": "2"},
    ]
    assert worker["spec"]["containers"][0]["env"][-1] == {"name": "OMP_NUM_THREADS", "value": "2"}
    dumped = json.dumps([head, worker])
    for leaked in ("server-token", "/server/bin", "/elsewhere", "KERNEL_QUEUE_LAUNCH_MODE"):
        assert leaked not in dumped


def test_kernel_env_is_literal_and_cannot_override_ours() -> None:
    kernel_env = {
        "DATA": "$(HOME)/data and $$",
        "KERNEL_ID": "spoofed",
        "POD_IP": "1.2.3.4",
        "KERNEL_QUEUE_LAUNCH_KEY_FILE": "/tmp/key",
        "KERNEL_QUEUE_LAUNCH_PORTS": "1,2,3,4,5",
        "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": "/elsewhere",
        "KERNEL_QUEUE_LAUNCH_CHECKPOINT_KEEP": "1",
    }
    spec = replace(SPEC, argv=("python", "-c", "print('$(HOME)')"))

    [pod] = manifests.pods(spec, GROUP, 0, kernel_env=kernel_env)

    container = pod["spec"]["containers"][0]
    assert container["env"] == [*HEAD_ENV, {"name": "DATA", "value": "$$(HOME)/data and $$$$"}]
    assert container["args"] == ["--", "python", "-c", "print('$$(HOME)')"]


@pytest.mark.parametrize(
    ("grace", "period", "stop_timeout"),
    [
        pytest.param(30.0, 30, "25", id="default"),
        pytest.param(120.0, 120, "115", id="long"),
        pytest.param(30.9, 30, "25", id="fraction-dropped"),
        pytest.param(6.0, 6, "1", id="just-above-the-margin"),
        pytest.param(3.0, 3, "1", id="below-the-margin"),
        pytest.param(0.5, 1, "1", id="under-a-second"),
    ],
)
def test_grace_period_and_stop_timeout(grace: float, period: int, stop_timeout: str) -> None:
    [pod] = manifests.pods(replace(SPEC, grace_seconds=grace), GROUP, 0)

    assert pod["spec"]["terminationGracePeriodSeconds"] == period
    env = {item["name"]: item.get("value") for item in pod["spec"]["containers"][0]["env"]}
    assert env["KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT"] == stop_timeout


def test_a_checkpoint_claim_is_mounted_in_the_head_only() -> None:
    spec = replace(SPEC, pod_group_size=2, pod_template=TEMPLATE)

    head, worker = manifests.pods(spec, GROUP, 0, checkpoint_claim="kernel-checkpoints")

    assert head["spec"]["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "kernel-checkpoints"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    kernel = head["spec"]["containers"][0]
    # Only the kernel's own directory of the claim: it cannot list or plant another's.
    assert kernel["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": KERNEL_ID},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    assert kernel["env"][: len(HEAD_ENV) + 2] == [
        *HEAD_ENV[:5],
        {"name": "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR", "value": "/checkpoints"},
        {"name": "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE", "value": "22"},
        *HEAD_ENV[5:],
    ]
    assert worker["spec"]["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    assert "checkpoints" not in json.dumps(worker)


@pytest.mark.parametrize("kernel_id", ["../victim", "a/b", "..", ".", "", "Kernel-1"])
def test_a_kernel_id_that_is_no_path_segment_mounts_no_claim(kernel_id: str) -> None:
    spec = replace(SPEC, kernel_id=kernel_id)

    with pytest.raises(errors.ConfigError, match="is not a lowercase UUID"):
        manifests.pods(spec, GROUP, 0, checkpoint_claim="kernel-checkpoints")


def test_every_object_carries_the_owner_when_one_is_given() -> None:
    spec = replace(SPEC, pod_group_size=2)
    owned = {**OUR_LABELS, "kernel-queue.dev/owner": "server-a"}

    objects = [
        manifests.secret(spec, owner="server-a"),
        manifests.service(spec, owner="server-a"),
        *manifests.pods(spec, GROUP, 0, owner="server-a"),
    ]

    for obj in objects:
        assert owned.items() <= obj["metadata"]["labels"].items()
    assert "kernel-queue.dev/owner" not in manifests.secret(spec)["metadata"]["labels"]
    # An owner that is no label value is made one (as user names are).
    odd = manifests.secret(spec, owner="jupyter@host:8888")["metadata"]["labels"]
    assert (
        odd["kernel-queue.dev/owner"] == "jupyter-host-8888-" + odd["kernel-queue.dev/owner"][-8:]
    )


def test_no_checkpoint_claim_no_volume() -> None:
    [pod] = manifests.pods(SPEC, GROUP, 0)

    assert "volumes" not in pod["spec"]
    assert "volumeMounts" not in pod["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("service_account", "template_spec", "expected"),
    [
        pytest.param(None, {}, {"automountServiceAccountToken": False}, id="none"),
        pytest.param(
            "kernel-sa",
            {},
            {"automountServiceAccountToken": False, "serviceAccountName": "kernel-sa"},
            id="named",
        ),
        pytest.param(
            "kernel-sa",
            {"automountServiceAccountToken": True, "serviceAccountName": "other"},
            {"automountServiceAccountToken": True, "serviceAccountName": "kernel-sa"},
            id="template-opts-into-a-token",
        ),
    ],
)
def test_service_account(
    service_account: str | None, template_spec: dict[str, Any], expected: dict[str, Any]
) -> None:
    spec = replace(SPEC, service_account=service_account, pod_template={"spec": template_spec})

    [pod] = manifests.pods(spec, GROUP, 0)

    found = {
        key: pod["spec"][key]
        for key in ("automountServiceAccountToken", "serviceAccountName")
        if key in pod["spec"]
    }
    assert found == expected


def test_an_odd_user_name_is_a_valid_label_and_kept_raw_in_the_annotation() -> None:
    spec = replace(SPEC, user="Alice Smith@example.com")

    [pod] = manifests.pods(spec, GROUP, 0)

    assert pod["metadata"]["labels"]["kernel-queue.dev/user"] == "Alice-Smith-example.com-31cd9f1a"
    assert pod["metadata"]["annotations"]["kernel-queue.dev/user"] == "Alice Smith@example.com"


def test_no_user_and_no_kernelspec_leave_their_keys_out() -> None:
    spec = replace(SPEC, user="", kernelspec="")

    assert manifests.secret(spec)["metadata"] == {
        "name": "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d-key",
        "namespace": "team-a",
        "labels": {
            "kernel-queue.dev/kernel-id": KERNEL_ID,
            "app.kubernetes.io/managed-by": "kernel-queue",
            "app.kubernetes.io/component": "kernel",
        },
    }
    [pod] = manifests.pods(spec, GROUP, 0)
    assert pod["metadata"]["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "1"}


def test_sidecars_and_init_containers_of_the_template_are_hardened_too() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "securityContext": {}}],
            "containers": [
                {"name": "kernel"},
                {"name": "side", "image": "busybox", "securityContext": {"runAsUser": 1000}},
            ],
        }
    }

    [pod] = manifests.pods(replace(SPEC, pod_template=template), GROUP, 0)

    side = pod["spec"]["containers"][1]
    assert side["securityContext"] == {"runAsUser": 1000, **CONTAINER_SECURITY}
    assert pod["spec"]["initContainers"][0]["securityContext"] == CONTAINER_SECURITY


def test_continuous_checkpoints_turned_off_in_the_kernelspec_reach_the_launcher() -> None:
    off = replace(SPEC, checkpoint=CheckpointSettings(enabled=True, continuous=False))
    [head] = manifests.pods(off, GROUP, 0, checkpoint_claim="kernel-checkpoints")
    [on] = manifests.pods(SPEC, GROUP, 0, checkpoint_claim="kernel-checkpoints")

    env = {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}
    assert env["KERNEL_QUEUE_LAUNCH_CHECKPOINT_CONTINUOUS"] == "0"
    default = {e["name"] for e in on["spec"]["containers"][0]["env"]}
    assert "KERNEL_QUEUE_LAUNCH_CHECKPOINT_CONTINUOUS" not in default  # on unless said


def test_an_exception_the_admin_allows_is_kept_over_the_hardening() -> None:
    """A privileged sidecar or an added capability, allowed by the server's admin, reaches the
    pod (the hardening overwrote them: a privileged container with allowPrivilegeEscalation
    false, which the API server refuses in any namespace, and SYS_ADMIN silently dropped);
    not allowed, the hardening wins as ever."""
    side = {
        "name": "side",
        "image": "registry.example/side:1",
        "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
    }
    template = {"spec": {"containers": [{"name": "kernel"}, side]}}
    spec = replace(SPEC, pod_template=template, allowed_exceptions=("privileged", "capabilities"))
    [pod] = manifests.pods(spec, GROUP, 0)
    sidecar = pod["spec"]["containers"][1]["securityContext"]
    assert sidecar == {
        "privileged": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        "runAsNonRoot": True,
    }
    [strict] = manifests.pods(replace(spec, allowed_exceptions=()), GROUP, 0)
    assert strict["spec"]["containers"][1]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
