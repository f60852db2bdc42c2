"""The pod status the node agent reports, and the records it derives it from.

`ContainerRecord` and `PodRecord` hold what the agent knows of a pod it runs. `StatusManager`
reads the live pod from the agent's pod cache, probes readiness, writes `.status` as a strategic
merge patch of `pods/{name}/status` (phase, IPs, containerStatuses and the agent's own
conditions, merged by type, so the conditions of other writers stay: Kueue's TerminationTarget,
the scheduler's PodScheduled), one write at a time per pod with the latest state, and posts the
pod's Events in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kernel_queue_fake_cluster.common import pods
from kernel_queue_fake_cluster.common.objects import Obj, now_rfc3339
from kernel_queue_fake_cluster.node.client import STRATEGIC_MERGE_PATCH, ApiError, Client, path

log = logging.getLogger(__name__)

HOST_IP = "127.0.0.1"


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
    """What the agent knows of one pod it runs (by uid), and the tasks working on it."""

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
    runner: asyncio.Task[None] | None = None  # scheduling, preparing and starting it
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Condition type -> (status, lastTransitionTime) as last written by the agent."""
    wanted: Obj | None = None  # the status patch to write next
    written: Obj | None = None  # the last status patch the API server took
    writer: asyncio.Task[None] | None = None

    def view(self, pod: Obj, node_name: str) -> Obj:
        """`pod` as the agent sees it once it took it: bound to the node, with its IPs (for the
        downward API, before the API server has them)."""
        seen = {**pod, "spec": {**pod.get("spec", {})}, "status": {**pod.get("status", {})}}
        if self.bound:
            seen["spec"]["nodeName"] = node_name
            seen["status"].update(
                hostIP=HOST_IP, hostIPs=[{"ip": HOST_IP}], podIP=self.ip, podIPs=[{"ip": self.ip}]
            )
        return seen


class StatusManager:
    """The agent's reads and writes of its pods' status: the live object from `live_pod`
    (the pod cache), `.status` patches, readiness from probes (`probe`) and Events (from
    `node_name`). `bind`: the agent is also the scheduler (it writes PodScheduled while a pod
    cannot be bound, and SchedulingGated)."""

    def __init__(
        self,
        client: Client,
        live_pod: Callable[[str, str], Obj | None],
        *,
        node_name: str,
        bind: bool,
    ) -> None:
        self.client, self.live_pod, self.node_name = client, live_pod, node_name
        self.bind = bind
        self.closed = False  # set by `NodeAgent.aclose`: every pod reads as gone
        self._events: asyncio.Queue[tuple[str, Obj]] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._events_served = True
        self._tasks: set[asyncio.Task[None]] = set()

    def live(self, record: PodRecord, *, deleting: bool = False) -> Obj | None:
        """The pod as last seen, or None if it is gone (or being deleted, unless `deleting`)."""
        if record.gone or self.closed:
            return None
        pod = self.live_pod(record.namespace, record.name)
        if pod is None or pod["metadata"]["uid"] != record.uid:
            return None
        return pod if deleting or not pod["metadata"].get("deletionTimestamp") else None

    # -- status ------------------------------------------------------------------------------

    def publish(self, record: PodRecord) -> None:
        """Write the record's view of the pod into `.status` (soon: one write at a time per
        pod, always the latest state; nothing when it did not change)."""
        if record.gone or self.closed:
            return
        status = self._status(record)
        if status == (record.written or {}).get("status"):
            record.wanted = None
            return
        record.wanted = {"metadata": {"uid": record.uid}, "status": status}
        if record.writer is None or record.writer.done():
            record.writer = asyncio.get_running_loop().create_task(self._write(record))
            record.tasks.add(record.writer)
            record.writer.add_done_callback(record.tasks.discard)

    async def flush(self, record: PodRecord) -> None:
        """Wait until what `publish` was told is written (or given up)."""
        while record.writer is not None and not record.writer.done():
            await asyncio.wait((record.writer,))

    async def _write(self, record: PodRecord) -> None:
        target = path("pods", record.namespace, record.name, "status")
        failures = 0
        while record.wanted is not None and not self.closed and not record.gone:
            body, record.wanted = record.wanted, None
            try:
                await self.client.patch(target, body, STRATEGIC_MERGE_PATCH)
            except ApiError as exc:
                if exc.code in (404, 409, 422):  # gone, or another pod of that name
                    return
                log.warning("status of pod %s/%s: %s", record.namespace, record.name, exc)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning("status of pod %s/%s: %s", record.namespace, record.name, exc)
            else:
                record.written, failures = body, 0
                continue
            failures += 1
            if failures > 20:
                return
            record.wanted = record.wanted or body
            await asyncio.sleep(min(0.05 * 2**failures, 2.0))

    def _status(self, record: PodRecord) -> Obj:
        now = now_rfc3339()
        status: Obj = {"phase": _phase(record)}
        if record.bound:
            ip = record.ip
            status.update(hostIP=HOST_IP, hostIPs=[{"ip": HOST_IP}], podIP=ip, podIPs=[{"ip": ip}])
            status["startTime"] = record.start_time
            status["containerStatuses"] = [c.status() for c in record.containers.values()]
        conditions = _conditions(record, status["phase"], now)
        for found in conditions:
            previous = record.transitions.get(found["type"])
            if previous is not None and previous[0] == found["status"]:
                found["lastTransitionTime"] = previous[1]
            record.transitions[found["type"]] = (found["status"], found["lastTransitionTime"])
            for key in ("reason", "message"):
                found.setdefault(key, None)  # a patch: null removes what an earlier one set
        if conditions:
            status["conditions"] = conditions
        return status

    def mark_gated(self, pod: Obj) -> None:
        """The scheduler's SchedulingGated condition, in case a webhook gated the pod late
        (the agent plays the scheduler only when it binds)."""
        found = pods.find_condition(pod, "PodScheduled") or {}
        if not self.bind or self.closed or found.get("reason") == "SchedulingGated":
            return
        meta = pod["metadata"]
        body = {
            "metadata": {"uid": meta["uid"]},
            "status": {"conditions": [pods.scheduling_gated(now_rfc3339())]},
        }
        target = path("pods", meta["namespace"], meta["name"], "status")
        self._later(self.client.patch(target, body, STRATEGIC_MERGE_PATCH))

    # -- events ------------------------------------------------------------------------------

    def event(
        self, pod: Obj, kind: str, reason: str, message: str, source: str = "kubelet"
    ) -> None:
        """Post an Event about `pod` (soon, after the ones posted before it)."""
        if self.closed or not self._events_served:
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
        self._events.put_nowait((meta["namespace"], body))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_events())

    def event_for(self, record: PodRecord, kind: str, reason: str, message: str) -> None:
        meta = {"namespace": record.namespace, "name": record.name, "uid": record.uid}
        self.event({"metadata": meta}, kind, reason, message)

    async def _send_events(self) -> None:
        while not self._events.empty() and not self.closed:
            namespace, body = self._events.get_nowait()
            try:
                await self.client.create(path("events", namespace), body)
            except ApiError as exc:
                if exc.code == 404 and 'namespaces "' not in exc.message:
                    self._events_served = False  # the API serves no Events
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.debug("event %s: %s", body["reason"], exc)

    async def drain(self) -> None:
        """Wait for the Events posted so far to be sent."""
        if self._sender is not None and not self._sender.done():
            await asyncio.wait((self._sender,))

    def _later(self, work: Any) -> None:
        async def quietly() -> None:
            with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
                await work

        task = asyncio.get_running_loop().create_task(quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop writing; give the Events already posted a moment to go out."""
        if self._sender is not None and not self._sender.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._sender)
            self._sender.cancel()
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- readiness -------------------------------------------------------------------------

    async def probe(self, record: PodRecord, container: ContainerRecord) -> None:
        """Readiness as a kubelet probes it: once as the container starts (a kubelet triggers a
        probe on the status update that says so) or after initialDelaySeconds, then every
        periodSeconds, before and after the first success, so a container is Ready up to one
        period after it listens; failureThreshold failures make it unready."""
        process, probe = container.process, container.spec.get("readinessProbe")

        def alive() -> bool:
            return container.process is process and container.running

        if not probe:
            container.ready = True
            self.publish(record)
            return
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        period = float(probe.get("periodSeconds") or 10)
        threshold, failures = int(probe.get("failureThreshold") or 3), 0
        while alive() and not record.gone:
            ok = await self._check(record, container, probe)
            if not alive():
                return
            failures = 0 if ok else failures + 1
            if ok != container.ready and (ok or failures >= threshold):
                container.ready = ok
                self.publish(record)
            await asyncio.sleep(period)

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
    ]


def _port(container: Obj, port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for found in container.get("ports") or []:
        if found.get("name") == port:
            return int(found["containerPort"])
    raise ValueError(f"no container port named {port!r}")
