"""Frozen values passed between the provisioner, the lifecycle and the backends.

No behaviour beyond conversion to and from plain dicts (for `get_provisioner_info`) and the
short texts users read. Nothing here performs I/O or knows a particular backend.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class ConnectionInfo:
    """Where a kernel listens and the key that signs its messages."""

    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    transport: str = "tcp"
    signature_scheme: str = "hmac-sha256"

    @property
    def ports(self) -> tuple[int, int, int, int, int]:
        """The five ports in the launcher's order: shell, iopub, stdin, control, hb."""
        return (self.shell_port, self.iopub_port, self.stdin_port, self.control_port, self.hb_port)

    def with_ports(self, ports: tuple[int, ...]) -> ConnectionInfo:
        """The same connection on `ports`, in the launcher's order (see `ports`)."""
        shell, iopub, stdin, control, hb = ports
        return replace(
            self,
            shell_port=shell,
            iopub_port=iopub,
            stdin_port=stdin,
            control_port=control,
            hb_port=hb,
        )

    def to_dict(self) -> dict[str, Any]:
        """jupyter_client's connection-info dict (`KernelConnectionInfo`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConnectionInfo:
        """Inverse of `to_dict`; a bytes key is decoded."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if isinstance(values.get("key"), bytes):
            values["key"] = values["key"].decode()
        return cls(**values)


@dataclass(frozen=True)
class CheckpointSettings:
    """The kernelspec's `checkpoint` key: where a preempted kernel saves its variables."""

    enabled: bool = False
    path: str | None = None  # local backend: a directory (default under Jupyter's data dir)
    claim: str | None = None  # kubernetes backend: a PVC mounted in the head pod
    keep: bool = False  # keep checkpoints after a final shutdown
    continuous: bool = True  # with checkpoints on: save what changed after each cell


@dataclass(frozen=True)
class GroupSpec:
    """Everything a backend needs to queue and run one kernel; built by the provisioner."""

    kernel_id: str
    queue: str
    argv: tuple[str, ...]
    connection: ConnectionInfo
    kernelspec: str = ""
    gpus: int = 0
    cpu: str | None = None
    memory: str | None = None
    priority_class: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    user: str = ""
    grace_seconds: float = 30.0
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    namespace: str | None = None
    image: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    pod_group_size: int = 1
    worker_command: tuple[str, ...] = ()
    """What each worker pod runs under the launcher's worker mode (kernelspec `worker_command`);
    empty: the workers only wait for SIGTERM."""
    pod_template: Mapping[str, Any] = field(default_factory=dict)
    service_account: str | None = None
    connect: str = "service"  # kubernetes: reach the kernel through its Service or the pod IP
    backend: str = "local"
    park_after: float = 0.0  # seconds idle before the kernel is parked; 0 = never
    allowed_exceptions: tuple[str, ...] = ()
    """The pod_template rules the server's admin allows (c.PodTemplatePolicy.allowed_exceptions):
    where the template sets such a field, the pods keep it over the hardening."""

    @property
    def name(self) -> str:
        """The group's name, the same in every backend: `group_name` of the whole kernel id."""
        return group_name(self.kernel_id)

    @property
    def total_gpus(self) -> int:
        """The GPUs the whole kernel holds once admitted: `gpus` on each of its
        `pod_group_size` pods."""
        return self.gpus * self.pod_group_size

    def needs(self) -> str:
        """What the kernel asks for, as users read it: "1 GPU", "2 GPUs, 4 CPU, 8Gi memory";
        a group of several pods counts the whole group: "2 GPUs: 2 pods of 1 GPU", and without
        GPUs "2 pods of 4 CPU" ("2 pods, no GPU" asking for nothing)."""
        each = _asks(self.gpus, self.cpu, self.memory)
        size = self.pod_group_size
        if size <= 1:
            return each
        if not self.gpus:
            return f"{size} pods of {each}" if self.cpu or self.memory else f"{size} pods, no GPU"
        total = self.total_gpus
        return f"{total} GPU{'' if total == 1 else 's'}: {size} pods of {each}"


def _asks(gpus: int, cpu: str | None, memory: str | None) -> str:
    parts = [f"{gpus} GPU" + ("" if gpus == 1 else "s")] if gpus else []
    if cpu:
        parts.append(f"{cpu} CPU")
    if memory:
        parts.append(f"{memory} memory")
    return ", ".join(parts) or "no GPU"


@dataclass(frozen=True)
class GroupRef:
    """What identifies a submitted group; JSON-safe so a restarted server can reattach."""

    backend: str
    name: str
    kernel_id: str
    connection: ConnectionInfo
    namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict for `get_provisioner_info`."""
        return {
            "backend": self.backend,
            "name": self.name,
            "kernel_id": self.kernel_id,
            "namespace": self.namespace,
            "connection": self.connection.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupRef:
        """Inverse of `to_dict`."""
        return cls(
            backend=data["backend"],
            name=data["name"],
            kernel_id=data["kernel_id"],
            namespace=data.get("namespace"),
            connection=ConnectionInfo.from_dict(data["connection"]),
        )


class GroupPhase(enum.StrEnum):
    """Where a group stands, in Kueue's words, as a backend observes it."""

    PENDING = "pending"  # submitted, not yet in a queue
    QUEUED = "queued"  # waiting for quota (Kueue: gated pods, Workload not admitted)
    ADMITTED = "admitted"  # quota reserved, the kernel process is starting
    RUNNING = "running"  # the kernel process runs and can be reached
    EVICTED = "evicted"  # preempted: stopping, then back to the queue
    PARKING = "parking"  # stopping to park: saving its variables, still holding its admission
    PARKED = "parked"  # parked: stopped, admission given back, kept ready to resume
    FINISHED = "finished"  # the kernel process ended; `exit_code` says how
    FAILED = "failed"  # the group cannot run; `message` says why


class StopCause(enum.StrEnum):
    """Why the provisioner stops a group; backends act differently on each."""

    SHUTDOWN = "shutdown"  # the user shut the kernel down
    RESTART = "restart"  # restart the kernel process in place, keep the admission
    KILL = "kill"  # stop at once (jupyter_client's kill)


@dataclass(frozen=True)
class QueuePlace:
    """A waiting group's place: 1-based position among `length` waiting in `queue` (0 when
    only the count is known)."""

    queue: str
    position: int
    length: int


@dataclass(frozen=True)
class Waiting:
    """Why a waiting group waits, as its queue manager says it, and for how long it may."""

    why: str = ""  # "waiting for 1 more nvidia.com/gpu to free up in ClusterQueue 'gpu-cq'"
    answered: bool = True  # False: the queue manager (Kueue) has not answered at all
    estimate: float | None = None  # seconds until admission at the recent rate, if known


@dataclass(frozen=True)
class GroupStatus:
    """One observation of a group, published by a backend's `watch`."""

    phase: GroupPhase
    message: str = ""
    place: QueuePlace | None = None
    flavor: str | None = None
    devices: tuple[str, ...] = ()
    exit_code: int | None = None
    generation: int = 0  # kernel processes started so far in this admission, minus one
    kernel_alive: bool = False  # a kernel process of `generation` is up
    address: str = ""  # where to reach the kernel when it differs from the ref's (pod IPs)
    waiting: Waiting | None = None  # while queued: why, and the estimate of the wait
    never_fits: bool = False  # FAILED because the queue could never admit what it asks for
    # never_fits: what the queue could ever give of what does not fit ({"gpus": 2})
    has: dict[str, int | str] | None = field(default=None, hash=False)
    interrupted: str = ""  # QUEUED again because the kernel stopped without warning (its
    # launcher or its pod lost, not a preemption): why, in words ("its launcher was killed …")

    def evolve(self, **changes: Any) -> GroupStatus:
        """A copy with `changes` applied."""
        return replace(self, **changes)


def short_id(kernel_id: str) -> str:
    """The first eight hex digits of a kernel id, for messages people read; never a name or a
    key (two ids may share them)."""
    return kernel_id.replace("-", "")[:8].lower()


def group_name(kernel_id: str) -> str:
    """The group's name, from the whole id: `kq-` and the id's 32 hex digits for a UUID
    (`ids.check`), else 32 hex digits of its sha256. A DNS-1123 label of 35 characters, so a
    Kubernetes name may append a suffix of up to 28."""
    digits = kernel_id.replace("-", "")
    if len(digits) != 32 or digits.strip("0123456789abcdef"):
        digits = hashlib.sha256(kernel_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"kq-{digits}"


@dataclass(frozen=True)
class Noted:
    """What the user reads of a kernel that its group's status does not carry. Front ends that
    persist their kernels keep it (`get_provisioner_info`, EG's process info), so a kernel
    reattached after a restart reads as before: its queue, GPUs (the whole group's, as the
    parked sentence and the status event count them) and needs, whether it saves checkpoints,
    and why and since when it is parked."""

    kernel_id: str
    queue: str
    gpus: int = 0
    needs: str = ""
    checkpoints: bool = False
    parked_why: str = ""
    parked_since: str | None = None  # ISO 8601

    @classmethod
    def of(cls, group: GroupSpec) -> Noted:
        """What `group` says (not parked)."""
        return cls(
            group.kernel_id,
            group.queue,
            gpus=group.total_gpus,
            needs=group.needs(),
            checkpoints=group.checkpoint.enabled,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Noted | None:
        """Read back what `to_dict` wrote; None for anything else (an older front end's)."""
        if not isinstance(data, dict):
            return None
        try:
            noted = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError:
            return None
        text = (noted.kernel_id, noted.queue, noted.needs, noted.parked_why)
        if not all(isinstance(t, str) for t in text) or not isinstance(noted.gpus, int):
            return None
        return noted
