"""The cleanup pod that deletes a parked kernel's checkpoints when it ends, built from its last
head pod (pure): outside Kueue, no GPU, the claim mounted whole, the kernel's directory named."""

from __future__ import annotations

import copy
from typing import Any

from kernel_queue.kube.deletion import janitor

HEAD: dict[str, Any] = {
    "metadata": {
        "name": "kq-1a2b-head-1",
        "labels": {
            "kernel-queue.dev/kernel-id": "1a2b",
            "kernel-queue.dev/role": "head",
            "kernel-queue.dev/owner": "server-1",
            "app.kubernetes.io/managed-by": "kernel-queue",
            "kueue.x-k8s.io/queue-name": "user-queue",
            "kueue.x-k8s.io/pod-group-name": "kq-1a2b",
            "kueue.x-k8s.io/managed": "true",
        },
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": "1"},
    },
    "spec": {
        "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
        "serviceAccountName": "kernels",
        "securityContext": {"runAsNonRoot": True},
        "containers": [
            {
                "name": "kernel",
                "image": "registry.example/kernel:1",
                "env": [{"name": "KERNEL_QUEUE_LAUNCH_CHECKPOINT_KEEP", "value": ""}],
                "volumeMounts": [
                    {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": "1a2b"},
                    {"name": "launcher", "mountPath": "/opt/kernel-queue"},
                ],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
        "volumes": [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}},
            {"name": "launcher", "configMap": {"name": "kernel-queue-launcher"}},
        ],
    },
}


def test_the_cleanup_pod_runs_outside_kueue_and_removes_only_the_kernels_directory() -> None:
    assert janitor.manifest(HEAD) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kq-1a2b-cleanup",
            "labels": {
                "kernel-queue.dev/kernel-id": "1a2b",
                "kernel-queue.dev/role": "checkpoint-cleanup",
                "kernel-queue.dev/owner": "server-1",
                "app.kubernetes.io/managed-by": "kernel-queue",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": "cleanup",
                    "image": "registry.example/kernel:1",
                    "command": ["python", "-c", janitor.CODE, "/claim/1a2b"],
                    "volumeMounts": [{"name": "checkpoints", "mountPath": "/claim"}],
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"cpu": "50m", "memory": "64Mi"},
                    },
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ],
            "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            "securityContext": {"runAsNonRoot": True},
            "serviceAccountName": "kernels",
        },
    }


def test_no_cleanup_pod_for_kept_checkpoints_or_a_kernel_without_a_claim() -> None:
    kept = copy.deepcopy(HEAD)
    kept["spec"]["containers"][0]["env"][0]["value"] = "1"
    assert janitor.manifest(kept) is None
    unclaimed = copy.deepcopy(HEAD)
    unclaimed["spec"]["containers"][0]["volumeMounts"] = []
    assert janitor.manifest(unclaimed) is None
