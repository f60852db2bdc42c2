"""The pod status the fake kubelet reports, and the records it derives it from.

`ContainerRecord` and `PodRecord` hold what the kubelet knows of a pod it runs. `StatusManager`
reads the live pod, probes readiness, writes `.status` (phase, conditions and containerStatuses,
keeping foreign conditions; the SchedulingGated condition) and posts the pod's Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common import pods

HOST_IP = "127.0.0.1"
_OURS = ("Initialized", "Ready", "ContainersReady", "PodScheduled")


@dataclass
class ContainerRecord:
    """One container of a pod the kubelet runs: its resolved argv/env/cwd, process and state."""

    name: str
    spec: Obj
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    process: asyncio.subprocess.Process | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    exit_reason: str = ""
    termination_file: Path | None = None  # where terminationMessagePath points on this machine
    message: str = ""  # the termination message, read when the process ended
    ready: bool = False
    restarts: int = 0
    last_state: Obj = field(default_factory=dict)
    last_event: tuple[str, str, str] | None = None
    watcher: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def status(self) -> Obj:
        state: Obj
        if self.waiting is not None:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        elif self.exit_code is None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {"terminated": self.terminated()}
        found: Obj = {"name": self.name, "image": self.spec.get("image", ""), "imageID": ""}
        if self.process is not None:
            found["containerID"] = f"fake://{self.process.pid}"
        found.update(ready=self.ready, started=self.running, restartCount=self.restarts)
        return {**found, "state": state, "lastState": self.last_state}

    def terminated(self) -> Obj:
        found: Obj = {
            "exitCode": self.exit_code,
            "reason": self.exit_reason,
            "startedAt": self.started_at or None,
            "finishedAt": self.finished_at,
        }
        if self.message:
            found["message"] = self.message
        return found


@dataclass
class PodRecord:
    """What the kubelet knows of one pod it runs (by uid), and the tasks working on it."""

    uid: str
    namespace: str
    name: str
    dir: Path
    restart_policy: str
    containers: dict[str, ContainerRecord]
    ip: str = ""
    bound: bool = False
    start_time: str = ""
    unschedulable: str = ""
    terminating: bool = False
    gone: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class StatusManager:
    """The kubelet's reads and writes of its pods in `store`: the live object, `.status`,
    readiness from probes (`probe_floor` as in `FakeKubelet`) and Events (from `node_name`)."""

    def __init__(self, store: Store, *, node_name: str, probe_floor: float) -> None:
        self.store, self.node_name, self.probe_floor = store, node_name, probe_floor
        self.closed = False  # set by `FakeKubelet.aclose`: every pod reads as gone

    def live(self, record: PodRecord, *, deleting: bool = False) -> Obj | None:
        """The pod as stored now, or None if it is gone (or being deleted, unless `deleting`)."""
        if record.gone or self.closed:
            return None
        try:
            pod = self.store.get("", "pods", record.namespace, record.name)
        except ApiError:
            return None
        if pod["metadata"]["uid"] != record.uid:
            return None
        return pod if deleting or not pod["metadata"].get("deletionTimestamp") else None

    def publish(self, record: PodRecord) -> None:
        """Write the record's view of the pod into `.status`, keeping foreign conditions."""
        pod = self.live(record, deleting=True)
        if pod is None:
            return
        old = pod.get("status") or {}
        status, now = dict(old), now_rfc3339()
        status["phase"] = _phase(record)
        if record.bound:
            ip = record.ip
            status.update(hostIP=HOST_IP, hostIPs=[{"ip": HOST_IP}], podIP=ip, podIPs=[{"ip": ip}])
            status["startTime"] = record.start_time
            status["containerStatuses"] = [c.status() for c in record.containers.values()]
        ours = _conditions(record, status["phase"], now)
        before = {c.get("type"): c for c in old.get("conditions") or []}
        for found in ours:
            previous = before.get(found["type"])
            if previous is not None and previous.get("status") == found["status"]:
                found["lastTransitionTime"] = previous.get("lastTransitionTime", now)
        others = [c for c in old.get("conditions") or [] if c.get("type") not in _OURS]
        status["conditions"] = ours + others
        if status != old:
            pod["status"] = status
            with contextlib.suppress(ApiError):
                self.store.replace(
                    "", "pods", record.namespace, record.name, pod, subresource="status"
                )

    def mark_gated(self, pod: Obj) -> None:
        """The scheduler's SchedulingGated condition, in case a webhook gated the pod late."""
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("reason") == "SchedulingGated" for c in conditions):
            return
        status = pod.setdefault("status", {"phase": "Pending"})
        others = [c for c in conditions if c.get("type") != "PodScheduled"]
        status["conditions"] = [*others, pods.scheduling_gated(now_rfc3339())]
        with contextlib.suppress(ApiError):
            meta = pod["metadata"]
            self.store.replace(
                "", "pods", meta["namespace"], meta["name"], pod, subresource="status"
            )

    def event(
        self, pod: Obj, kind: str, reason: str, message: str, source: str = "kubelet"
    ) -> None:
        if ("", "events") not in self.store.types:
            return
        meta, now = pod["metadata"], now_rfc3339()
        body = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": source, "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": source,
            "reportingInstance": self.node_name,
        }
        with contextlib.suppress(ApiError):
            self.store.create("", "events", meta["namespace"], body)

    def event_for(self, record: PodRecord, kind: str, reason: str, message: str) -> None:
        meta = {"namespace": record.namespace, "name": record.name, "uid": record.uid}
        self.event({"metadata": meta}, kind, reason, message)

    # -- readiness -------------------------------------------------------------------------

    async def probe(self, record: PodRecord, container: ContainerRecord) -> None:
        """Readiness: initialDelaySeconds, then every `probe_floor` s until the first success,
        then every periodSeconds; failureThreshold failures make the container unready."""
        process, probe = container.process, container.spec.get("readinessProbe")

        def alive() -> bool:
            return container.process is process and container.running

        if not probe:
            container.ready = True
            self.publish(record)
            return
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        period = max(float(probe.get("periodSeconds") or 10), self.probe_floor)
        threshold, failures = int(probe.get("failureThreshold") or 3), 0
        while alive() and not record.gone:
            ok = await self._check(record, container, probe)
            if not alive():
                return
            failures = 0 if ok else failures + 1
            if ok != container.ready and (ok or failures >= threshold):
                container.ready = ok
                self.publish(record)
            await asyncio.sleep(period if container.ready else self.probe_floor)

    async def _check(self, record: PodRecord, container: ContainerRecord, probe: Obj) -> bool:
        """One TCP connect within timeoutSeconds (httpGet probes are reduced to this; exec and
        grpc probes are not simulated and pass)."""
        action = probe.get("tcpSocket") or probe.get("httpGet")
        if action is None:
            return True
        try:
            async with asyncio.timeout(float(probe.get("timeoutSeconds") or 1)):
                port = _port(container.spec, action.get("port"))
                _, writer = await asyncio.open_connection(action.get("host") or record.ip, port)
        except (OSError, TimeoutError, ValueError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


def _phase(record: PodRecord) -> str:
    """Pending until every container started; then Running; terminal once all have exited and
    none will restart (a deleted pod: Succeeded if all exit codes are 0, else Failed)."""
    containers = list(record.containers.values())
    if not record.bound or any(c.process is None and c.exit_code is None for c in containers):
        return "Pending"
    codes = [c.exit_code for c in containers]
    policy, clean = record.restart_policy, all(code == 0 for code in codes)
    ends = record.terminating or policy == "Never" or (policy == "OnFailure" and clean)
    if ends and all(code is not None for code in codes):
        return "Succeeded" if clean else "Failed"
    return "Running"


def _conditions(record: PodRecord, phase: str, now: str) -> list[Obj]:
    if not record.bound:
        return [pods.condition("PodScheduled", False, now, "Unschedulable", record.unschedulable)]
    unready = [c.name for c in record.containers.values() if not c.ready]
    why: tuple[str, str] = ("", "")
    if phase in ("Succeeded", "Failed"):
        why = ("PodCompleted", "")
    elif unready:
        why = ("ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]")
    return [
        pods.condition("Initialized", True, now),
        pods.condition("Ready", not unready, now, *why),
        pods.condition("ContainersReady", not unready, now, *why),
        pods.condition("PodScheduled", True, now),
    ]


def _port(container: Obj, port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for found in container.get("ports") or []:
        if found.get("name") == port:
            return int(found["containerPort"])
    raise ValueError(f"no container port named {port!r}")
