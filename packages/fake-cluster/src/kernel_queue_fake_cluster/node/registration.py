"""The Node object of the fake cluster's one node, as its kubelet registers it.

`register` creates (or refreshes) `Node` `<name>`: capacity and allocatable of this machine's
CPUs and memory, 110 pods and `GPUS` GPUs, the Ready condition a healthy kubelet posts, the
address 127.0.0.1 and the node's system info. The fake kubelet (`node/`) runs pods whatever the
Node says; the Node is there for kubectl and clients that read nodes. Pure data and one store
write; no HTTP, no heartbeats.
"""

from __future__ import annotations

import os
import platform

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store

GPUS = 8
"""`nvidia.com/gpu` the node reports: the fake kubelet has no devices to hand out and starts
any pod's GPU request (Kueue's quota decides), so the Node says what a common GPU node has."""
ADDRESS = "127.0.0.1"
KUBELET_VERSION = "v1.32.0-fake"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


def node(name: str, *, gpus: int = GPUS, now: str = "") -> Obj:
    """The Node `name`, with this machine's CPUs and memory."""
    now = now or now_rfc3339()
    arch = _ARCHITECTURES.get(platform.machine(), platform.machine())
    resources = {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{_memory_kib()}Ki",
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "nvidia.com/gpu": str(gpus),
    }

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": ADDRESS},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": arch,
                "operatingSystem": "linux",
                "osImage": "fake cluster node",
                "kernelVersion": platform.release(),
                "containerRuntimeVersion": "fake://local-processes",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def register(store: Store, name: str, *, gpus: int = GPUS) -> Obj:
    """Create Node `name` in `store`, or write its status anew when it exists."""
    obj = node(name, gpus=gpus)
    try:
        return store.create("", "nodes", None, obj)
    except ApiError as exc:
        if exc.code != 409:
            raise
    current = store.get("", "nodes", None, name)
    current["status"] = obj["status"]
    return store.replace("", "nodes", None, name, current, subresource="status")


def _memory_kib() -> int:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 * 1024 * 1024
    return max(1, pages * size // 1024)
