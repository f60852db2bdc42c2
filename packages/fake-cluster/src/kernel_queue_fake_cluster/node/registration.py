"""The agent's Node object and its heartbeat, over the API: what a kubelet registers.

`Capacity` is what the node offers (this machine's CPUs and memory unless given, 110 pods,
`GPUS` GPUs); `node` the Node object: capacity and allocatable, the Ready condition a healthy
kubelet posts, the address 127.0.0.1, the kubelet endpoint's port and the node's system info.
`register` creates it, or writes its status anew when it exists. `Heartbeat` renews the Node's
Lease in `kube-node-lease` every few seconds, where the API serves coordination.k8s.io (the fake
API server does not: then it does nothing). The agent runs pods whatever the Node says; the
real scheduler reads the Node to place pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
from dataclasses import dataclass

import aiohttp

from kernel_queue_fake_cluster.common.objects import Obj, now_micro, now_rfc3339
from kernel_queue_fake_cluster.node.client import STRATEGIC_MERGE_PATCH, ApiError, Client, path

log = logging.getLogger(__name__)

GPUS = 8
"""`nvidia.com/gpu` the node reports by default: the agent has no devices to hand out and starts
any pod's GPU request (Kueue's quota or the scheduler decides), so the Node says what a common
GPU node has."""
ADDRESS = "127.0.0.1"
KUBELET_VERSION = "v1.32.0-fake"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_GROUP = "coordination.k8s.io"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


@dataclass(frozen=True)
class Capacity:
    """What the node offers; None: this machine's CPUs or memory."""

    cpu: str | None = None
    memory: str | None = None
    pods: int = 110
    gpus: int = GPUS
    ephemeral_storage: str = "100Gi"

    def resources(self) -> dict[str, str]:
        return {
            "cpu": self.cpu or str(os.cpu_count() or 1),
            "memory": self.memory or f"{_memory_kib()}Ki",
            "pods": str(self.pods),
            "ephemeral-storage": self.ephemeral_storage,
            "nvidia.com/gpu": str(self.gpus),
        }


def node(name: str, capacity: Capacity | None = None, *, port: int = 0, now: str = "") -> Obj:
    """The Node `name`; `port`: the kubelet endpoint (where the agent serves container logs)."""
    now = now or now_rfc3339()
    arch = _ARCHITECTURES.get(platform.machine(), platform.machine())
    resources = (capacity or Capacity()).resources()

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
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
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


async def register(
    client: Client, name: str, capacity: Capacity | None = None, *, port: int = 0
) -> Obj:
    """Create Node `name`, or write its labels anew when it exists; then its status (through
    `nodes/{name}/status`, whatever a create kept of it)."""
    obj = node(name, capacity, port=port)
    try:
        await client.create(path("nodes"), obj)
    except ApiError as exc:
        if exc.code != 409:
            raise
        labels = {"metadata": {"labels": obj["metadata"]["labels"]}}
        await client.patch(path("nodes", None, name), labels, STRATEGIC_MERGE_PATCH)
    status = {"status": obj["status"]}
    return await client.patch(path("nodes", None, name, "status"), status, STRATEGIC_MERGE_PATCH)


class Heartbeat:
    """Renews Lease `<node>` in `kube-node-lease` every `interval` seconds (leaseDurationSeconds
    40, as the kubelet's), owned by the Node; quietly nothing where the API serves no Leases."""

    def __init__(self, client: Client, node_name: str, *, interval: float = 10.0) -> None:
        self.client, self.node_name, self.interval = client, node_name, interval
        self.renewals = 0
        self.served: bool | None = None
        """Whether the API serves coordination.k8s.io/v1 (None: not asked yet)."""

    async def run(self) -> None:
        """Renew until cancelled."""
        try:
            await self.client.get(f"/apis/{LEASE_GROUP}/v1")
        except ApiError as exc:
            if exc.code == 404:
                self.served = False
                return
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass
        self.served = True
        while True:
            with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
                await self.renew()
            await asyncio.sleep(self.interval)

    async def renew(self) -> Obj:
        """Create the Lease, or set its renewTime to now."""
        target = path("leases", LEASE_NAMESPACE, self.node_name, group=LEASE_GROUP)
        spec = {"holderIdentity": self.node_name, "renewTime": now_micro()}
        try:
            found = await self.client.patch(target, {"spec": spec}, STRATEGIC_MERGE_PATCH)
        except ApiError as exc:
            if exc.code != 404:
                raise
            found = await self.client.create(
                path("leases", LEASE_NAMESPACE, group=LEASE_GROUP), await self._lease(spec)
            )
        self.renewals += 1
        return found

    async def _lease(self, spec: Obj) -> Obj:
        meta: Obj = {"name": self.node_name, "namespace": LEASE_NAMESPACE}
        with contextlib.suppress(ApiError):
            owner = await self.client.get(path("nodes", None, self.node_name))
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node_name,
                    "uid": owner["metadata"]["uid"],
                }
            ]
        body = {"apiVersion": f"{LEASE_GROUP}/v1", "kind": "Lease", "metadata": meta}
        return {**body, "spec": {**spec, "leaseDurationSeconds": 40}}


def _memory_kib() -> int:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 * 1024 * 1024
    return max(1, pages * size // 1024)
