"""The fake kubelet (and scheduler of its single node): pods run as local processes.

It binds each ungated pod to `fake-node`, gives it a loopback IP, maps its volumes to directories
(`pods.py`), runs each container's `command` + `args` with only the env the spec gives (plus
`BASE_ENV_KEYS`), derives readiness from probes, writes the pod's status, serves logs, and stops
pods on graceful delete: SIGTERM, SIGKILL after the grace, phase from the exit codes. It owns the
`ServiceNetwork`. Everything runs on the store's event loop; no threads of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fnmatch
import logging
import os
import shutil
import signal
import sys
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_queue.testing import network, pods, selectors
from kernel_queue.testing.store import ApiError, Obj, Store, now_rfc3339

log = logging.getLogger(__name__)

NODE_NAME = "fake-node"
HOST_IP = "127.0.0.1"
BASE_ENV_KEYS = ("HOME", "LANG")  # copied from this process; PATH gets the venv's bin first
NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
PULL_FAILED = (
    'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
    'unpack image "{image}": not found'
)
_OURS = ("Initialized", "Ready", "ContainersReady", "PodScheduled")


def base_env(pod_name: str) -> dict[str, str]:
    """What every container starts with before its spec's env: PATH (this interpreter's bin
    first, so `python` is the virtualenv's), HOME and LANG from this process, HOSTNAME."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
    env = {"PATH": path, "HOSTNAME": pod_name}
    env.update({key: os.environ[key] for key in BASE_ENV_KEYS if key in os.environ})
    return env


@dataclass
class Fault:
    """A simulated failure for the pods it matches; `clear()` ends it (held pods then go on)."""

    kind: str  # "unschedulable" or "image"
    message: str
    pod: str | None = None
    namespace: str | None = None
    selector: str = ""
    image: str | None = None  # fnmatch pattern; image faults fail only matching containers
    owner: FakeKubelet | None = field(default=None, repr=False)

    def matches(self, pod: Obj) -> bool:
        meta = pod["metadata"]
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        if self.pod and meta.get("name") != self.pod:
            return False
        if self.selector and not selectors.labels(self.selector)(pod):
            return False
        return any(self.fails(c) for c in pod["spec"]["containers"])

    def fails(self, container: Obj) -> bool:
        return self.image is None or fnmatch.fnmatch(container.get("image", ""), self.image)

    def clear(self) -> None:
        if self.owner is not None:
            self.owner.clear_faults(self)


@dataclass
class _Container:
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
        return {
            "exitCode": self.exit_code,
            "reason": self.exit_reason,
            "startedAt": self.started_at or None,
            "finishedAt": self.finished_at,
        }


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    dir: Path
    restart_policy: str
    containers: dict[str, _Container]
    ip: str = ""
    bound: bool = False
    start_time: str = ""
    unschedulable: str = ""
    terminating: bool = False
    gone: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class FakeKubelet:
    """One node (`fake-node`, host IP 127.0.0.1) running every pod of `store` on this machine.

    Processes: `command` + `args` (`$(VAR)` expanded, mountPaths rewritten; no `command` is a
    CreateContainerError), one session each, stdout+stderr appended to `pods/<uid>/logs/<name>.log`
    under `root_dir`; cwd is `workingDir` (rewritten; a path missing here becomes
    `pods/<uid>/rootfs/<path>`, the default is `pods/<uid>/rootfs`). Env, later wins: `base_env`
    (PATH with this interpreter's directory first, HOME, LANG, HOSTNAME = pod name), one
    `KUBE_FAKE_MOUNT_<PATH>` per volumeMount, `envFrom`, `env`. Nothing else of this process.
    Volumes: `pvc/<namespace>/<claim>` (kept; the claim must exist, else Unschedulable),
    `pods/<uid>/volumes/<name>` for emptyDir, Secret, ConfigMap, downwardAPI, projected (files
    0600 unless a mode is given; removed with the pod); hostPath as is.
    Not simulated: images and image pulls (see `fail_image`), init containers, liveness and
    startup probes, exec/grpc readiness probes (pass; httpGet is a TCP connect), preStop hooks,
    resource limits (no OOMKilled), activeDeadlineSeconds, Service env links, updates of mounted
    Secrets, other nodes (pods bound elsewhere are left alone).

    `probe_floor`: seconds between readiness checks until the first success (then periodSeconds),
    and the base of the restart backoff (Always/OnFailure). `pull_backoff`: ErrImagePull to
    ImagePullBackOff. Call `install()` once, on the running loop; `await aclose()` at the end.
    """

    def __init__(
        self,
        store: Store,
        root_dir: str | os.PathLike[str],
        *,
        pod_ip_pool: str = "127.10.0.0/16",
        service_ip_pool: str = "127.20.0.0/16",
        probe_floor: float = 0.05,
        pull_backoff: float = 0.5,
        service_hold_seconds: float = 30.0,
        node_name: str = NODE_NAME,
    ) -> None:
        self.store, self.root = store, Path(root_dir)
        self.pod_ips = network.AddressPool(pod_ip_pool)
        self.network = network.ServiceNetwork(
            store, pool=service_ip_pool, hold_seconds=service_hold_seconds
        )
        self.probe_floor, self.pull_backoff, self.node_name = probe_floor, pull_backoff, node_name
        self._pods: dict[str, _Pod] = {}
        self._faults: list[Fault] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._closed = False

    def install(self) -> None:
        """Pod admission rules, pod/volume-source listeners, the graceful-delete hook, Services."""
        pods.install(self.store)
        self.store.add_listener("", "pods", self._on_pod)
        for plural in ("secrets", "configmaps", "persistentvolumeclaims"):
            self.store.add_listener("", plural, lambda kind, obj: self._notify())
        self.store.add_delete_hook("", "pods", self._on_delete)
        self.network.install()
        for pod in list(self.store.objects("", "pods")):
            self._on_pod("ADDED", copy.deepcopy(pod))

    async def aclose(self) -> None:
        """Kill every container process (and its session), stop probes and the Service network."""
        self._closed = True
        records = list(self._pods.values())
        for record in records:
            record.gone = True
            _kill_all(record)
        tasks = [t for r in records for t in r.tasks] + list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for record in records:
            await _reap(record)
        self._pods.clear()
        for key in self.pod_ips.holders():
            self.pod_ips.release(key)
        await self.network.aclose()

    # -- faults ----------------------------------------------------------------------------

    def unschedulable(
        self,
        pod: str | None = None,
        *,
        namespace: str | None = None,
        selector: str = "",
        message: str = NO_GPU,
    ) -> Fault:
        """Keep matching pods (by name and/or label selector; all if neither) unscheduled:
        PodScheduled=False, reason Unschedulable, a FailedScheduling event. Bound pods are kept."""
        return self._add(Fault("unschedulable", message, pod, namespace, selector))

    def fail_image(
        self,
        pod: str | None = None,
        *,
        namespace: str | None = None,
        selector: str = "",
        image: str | None = None,
        message: str = PULL_FAILED,
    ) -> Fault:
        """Fail the image pull of matching containers (image fnmatch pattern; all if None):
        waiting ErrImagePull, then ImagePullBackOff after `pull_backoff`. `{image}` is filled in."""
        return self._add(Fault("image", message, pod, namespace, selector, image))

    def clear_faults(self, *faults: Fault) -> None:
        """End the given faults, or all of them."""
        self._faults = [f for f in self._faults if faults and f not in faults]
        self._notify()

    def _add(self, fault: Fault) -> Fault:
        fault.owner = self
        self._faults.append(fault)
        return fault

    # -- logs ------------------------------------------------------------------------------

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path:
        """The file a container's stdout and stderr go to; errors as the API server's."""
        pod = self.store.get("", "pods", namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container is None and len(names) != 1:
            choices = " ".join(names)
            message = (
                f"a container name must be specified for pod {name}, choose one of: [{choices}]"
            )
            raise ApiError(400, "BadRequest", message)
        container = container or names[0]
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        record = self._pods.get(pod["metadata"]["uid"])
        found = record.containers[container] if record else None
        if found is None or not found.log_path.exists():
            reason = found.waiting[0] if found and found.waiting else "ContainerCreating"
            message = f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            raise ApiError(400, "BadRequest", message)
        return found.log_path

    def logs(
        self, namespace: str, name: str, container: str | None = None, tail_lines: int | None = None
    ) -> str:
        """`GET .../pods/{name}/log`: the container's output, the last `tail_lines` lines."""
        text = self.log_path(namespace, name, container).read_text(errors="replace")
        if tail_lines is None:
            return text
        return "".join(text.splitlines(keepends=True)[-tail_lines:]) if tail_lines > 0 else ""

    # -- store hooks -----------------------------------------------------------------------

    def _on_pod(self, kind: str, pod: Obj) -> None:
        if self._closed:
            return
        self._notify()
        meta = pod["metadata"]
        record = self._pods.get(meta["uid"])
        if kind == "DELETED":
            self._forget(meta["uid"])
        elif record is not None:
            force = meta.get("deletionTimestamp") and not meta.get("deletionGracePeriodSeconds")
            if (
                force
                and not record.terminating
                and any(c.running for c in record.containers.values())
            ):
                record.terminating = True
                self._spawn(record, self._terminate(record, 0))
        elif not self._runnable(pod):
            return
        elif pods.gates(pod):
            self._mark_gated(pod)
        else:
            record = self._record(pod)
            self._pods[record.uid] = record
            self._spawn(record, self._run(record))

    def _runnable(self, pod: Obj) -> bool:
        """Not being deleted, not finished, and not bound to another node."""
        if pod["metadata"].get("deletionTimestamp"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        return (pod.get("spec") or {}).get("nodeName") in (None, "", self.node_name)

    def _on_delete(self, pod: Obj, grace: int) -> bool:
        record = self._pods.get(pod["metadata"]["uid"])
        if record is None or not any(c.running for c in record.containers.values()):
            return False  # never started, or finished: the store removes it at once
        if not record.terminating:
            record.terminating = True
            self._spawn(record, self._terminate(record, grace))
        return True

    def _mark_gated(self, pod: Obj) -> None:
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

    def _record(self, pod: Obj) -> _Pod:
        meta, spec = pod["metadata"], pod["spec"]
        folder = self.root / "pods" / meta["uid"]
        containers = {
            c["name"]: _Container(c["name"], c, folder / "logs" / f"{c['name']}.log")
            for c in spec["containers"]
        }
        policy = spec.get("restartPolicy", "Always")
        return _Pod(meta["uid"], meta["namespace"], meta["name"], folder, policy, containers)

    def _forget(self, uid: str) -> None:
        record = self._pods.pop(uid, None)
        if record is None:
            return
        record.gone = True
        _kill_all(record)
        for task in record.tasks:
            task.cancel()
        self._spawn(None, self._cleanup(record))

    async def _cleanup(self, record: _Pod) -> None:
        await _reap(record)
        shutil.rmtree(record.dir, ignore_errors=True)  # emptyDir, Secret files, logs
        self.pod_ips.release(record.uid)

    # -- lifecycle -------------------------------------------------------------------------

    async def _run(self, record: _Pod) -> None:
        if await self._schedule(record) and await self._prepare(record):
            await self._start(record)

    async def _schedule(self, record: _Pod) -> bool:
        while True:
            changed = self._changed
            pod = self._live(record)
            if pod is None:
                return False
            message = next(
                (f.message for f in self._faults if f.kind == "unschedulable" and f.matches(pod)),
                "",
            )
            for claim in pods.missing_claims(self.store, pod)[:1]:
                message = f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found.'
            if not message:
                break
            if message != record.unschedulable:
                record.unschedulable = message
                self._publish(record)
                self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            await _wait(changed, 1.0)
        record.unschedulable = ""
        pod["spec"]["nodeName"] = self.node_name
        try:
            self.store.replace("", "pods", record.namespace, record.name, pod)
        except ApiError as exc:
            log.warning("cannot bind pod %s/%s: %s", record.namespace, record.name, exc)
            return False
        record.ip, record.bound = self.pod_ips.allocate(record.uid), True
        record.start_time = now_rfc3339()
        where = f"Successfully assigned {record.namespace}/{record.name} to {self.node_name}"
        self._event(pod, "Normal", "Scheduled", where, "default-scheduler")
        self._publish(record)
        return True

    async def _prepare(self, record: _Pod) -> bool:
        """Mount volumes, pull images (faults), resolve env: retry until every container can
        start, showing why not in its waiting state (and one event per new reason)."""
        pulled_at: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            changed = self._changed
            pod = self._live(record)
            if pod is None:
                return False
            faults = [f for f in self._faults if f.kind == "image" and f.matches(pod)]
            blocked, wait = False, 1.0
            try:
                dirs = pods.prepare_volumes(self.store, pod, self.root, record.dir)
            except pods.ConfigError as exc:  # FailedMount: one event, on the first container
                dirs, blocked = {}, True
                for i, container in enumerate(record.containers.values()):
                    event = ("Warning", exc.reason, exc.message) if i == 0 else None
                    self._wait_on(pod, container, ("ContainerCreating", ""), event)
            for container in record.containers.values() if not blocked else ():
                fault = next((f for f in faults if f.fails(container.spec)), None)
                if fault is not None:
                    blocked, image = True, container.spec.get("image", "")
                    since = pulled_at.setdefault(container.name, loop.time())
                    if loop.time() - since < self.pull_backoff:
                        message = fault.message.format(image=image)
                        event = ("Warning", "Failed", message)
                        self._wait_on(pod, container, ("ErrImagePull", message), event)
                        wait = self.pull_backoff
                    else:
                        message = f'Back-off pulling image "{image}"'
                        event = ("Normal", "BackOff", message)
                        self._wait_on(pod, container, ("ImagePullBackOff", message), event)
                    continue
                pulled_at.pop(container.name, None)
                try:
                    self._plan(record, container, pod, dirs)
                except pods.ConfigError as exc:
                    blocked, event = True, ("Warning", "Failed", f"Error: {exc.message}")
                    self._wait_on(pod, container, (exc.reason, exc.message), event)
            if not blocked:
                return True
            self._publish(record)
            await _wait(changed, wait)

    def _wait_on(
        self,
        pod: Obj,
        container: _Container,
        waiting: tuple[str, str],
        event: tuple[str, str, str] | None,
    ) -> None:
        """Show `waiting` on the container; post `event` (type, reason, message) once."""
        container.waiting = waiting
        if event is not None and container.last_event != event:
            container.last_event = event
            self._event(pod, *event)

    def _plan(self, record: _Pod, container: _Container, pod: Obj, dirs: dict[str, Path]) -> None:
        """Resolve argv, env and working directory (mountPaths rewritten to directories)."""
        spec = container.spec
        mounts = pods.Mounts.of(spec, dirs)
        container.env, raw = pods.container_env(
            self.store, pod, spec, mounts, base_env(record.name)
        )
        command = [str(a) for a in (spec.get("command") or [])]
        if not command:
            message = "the fake kubelet runs no images: the container needs a `command`"
            raise pods.ConfigError("CreateContainerError", message)
        args = command + [str(a) for a in (spec.get("args") or [])]
        container.argv = [mounts.rewrite(pods.expand(a, raw)) for a in args]
        workdir = mounts.rewrite(spec.get("workingDir") or "")
        if not workdir or not os.path.isdir(workdir):  # missing: a fresh dir under the pod root
            scratch = record.dir / "rootfs" / workdir.lstrip("/")
            scratch.mkdir(parents=True, exist_ok=True)
            workdir = str(scratch)
        container.cwd = workdir

    async def _start(self, record: _Pod) -> None:
        for container in record.containers.values():
            if record.terminating or record.gone:
                container.exit_code, container.exit_reason = 137, "ContainerStatusUnknown"
                container.waiting = None
                continue
            if await self._exec(record, container):
                self._watch(record, container)
        self._publish(record)

    async def _exec(self, record: _Pod, container: _Container) -> bool:
        """Start the container's process; a failed exec is a terminated StartError (128)."""
        container.log_path.parent.mkdir(parents=True, exist_ok=True)
        output = _open_log(container.log_path)
        container.waiting, container.exit_code = None, None
        container.started_at = now_rfc3339()
        try:
            container.process = await asyncio.create_subprocess_exec(
                *container.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                env=container.env,
                cwd=container.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            container.exit_code, container.exit_reason = 128, "StartError"
            container.finished_at, container.process = now_rfc3339(), None
            self._event_for(record, "Warning", "Failed", f"Error: exec: {exc}")
            return False
        finally:
            os.close(output)
        if record.gone or self._live(record) is None:  # deleted while it was starting
            record.terminating = True
            _killpg(container.process.pid)
            if record.gone:
                await container.process.wait()
                return False
        elif record.terminating:
            with contextlib.suppress(ProcessLookupError):
                container.process.send_signal(signal.SIGTERM)
        self._event_for(record, "Normal", "Started", f"Started container {container.name}")
        return True

    def _watch(self, record: _Pod, container: _Container) -> None:
        container.watcher = self._spawn(record, self._supervise(record, container))
        self._spawn(record, self._probe(record, container))

    async def _supervise(self, record: _Pod, container: _Container) -> None:
        """Wait for the process; record its exit (128+signal if killed); restart per policy."""
        while container.process is not None:
            code = await container.process.wait()
            _killpg(container.process.pid)  # the container's other processes go with it
            container.exit_code = 128 - code if code < 0 else code
            container.exit_reason = "Completed" if code == 0 else "Error"
            container.finished_at, container.ready = now_rfc3339(), False
            self._publish(record)
            policy = record.restart_policy
            if record.terminating or policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            container.last_state = {"terminated": container.terminated()}
            container.restarts += 1
            delay = min(self.probe_floor * 2**container.restarts, 2.0)
            why = f"back-off {delay:g}s restarting failed container={container.name}"
            container.waiting = ("CrashLoopBackOff", f"{why} pod={record.name}_{record.namespace}")
            self._publish(record)
            await asyncio.sleep(delay)
            if record.terminating or record.gone or not await self._exec(record, container):
                return
            self._spawn(record, self._probe(record, container))
            self._publish(record)

    async def _terminate(self, record: _Pod, grace: int) -> None:
        """Graceful stop: SIGTERM, SIGKILL after `grace` s, final status, then delete with 0."""
        watchers = [c.watcher for c in record.containers.values() if c.running and c.watcher]
        for container in record.containers.values():
            if container.running and container.process is not None:
                self._event_for(record, "Normal", "Killing", f"Stopping container {container.name}")
                with contextlib.suppress(ProcessLookupError):
                    container.process.send_signal(signal.SIGTERM if grace else signal.SIGKILL)
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=grace)
            if pending:
                _kill_all(record)
                await asyncio.wait(pending, timeout=10)
        self._publish(record)
        if self._live(record, deleting=True) is not None:
            with contextlib.suppress(ApiError):
                self.store.delete("", "pods", record.namespace, record.name, grace_seconds=0)

    # -- readiness -------------------------------------------------------------------------

    async def _probe(self, record: _Pod, container: _Container) -> None:
        """Readiness: initialDelaySeconds, then every `probe_floor` s until the first success,
        then every periodSeconds; failureThreshold failures make the container unready."""
        process, probe = container.process, container.spec.get("readinessProbe")

        def alive() -> bool:
            return container.process is process and container.running

        if not probe:
            container.ready = True
            self._publish(record)
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
                self._publish(record)
            await asyncio.sleep(period if container.ready else self.probe_floor)

    async def _check(self, record: _Pod, container: _Container, probe: Obj) -> bool:
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

    # -- status ----------------------------------------------------------------------------

    def _publish(self, record: _Pod) -> None:
        """Write the record's view of the pod into `.status`, keeping foreign conditions."""
        pod = self._live(record, deleting=True)
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

    # -- helpers ---------------------------------------------------------------------------

    def _live(self, record: _Pod, *, deleting: bool = False) -> Obj | None:
        """The pod as stored now, or None if it is gone (or being deleted, unless `deleting`)."""
        if record.gone or self._closed:
            return None
        try:
            pod = self.store.get("", "pods", record.namespace, record.name)
        except ApiError:
            return None
        if pod["metadata"]["uid"] != record.uid:
            return None
        return pod if deleting or not pod["metadata"].get("deletionTimestamp") else None

    def _event(
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

    def _event_for(self, record: _Pod, kind: str, reason: str, message: str) -> None:
        meta = {"namespace": record.namespace, "name": record.name, "uid": record.uid}
        self._event({"metadata": meta}, kind, reason, message)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, record: _Pod | None, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        owner = record.tasks if record is not None else self._tasks
        owner.add(task)
        task.add_done_callback(owner.discard)
        task.add_done_callback(_log_failure)
        return task


def _phase(record: _Pod) -> str:
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


def _conditions(record: _Pod, phase: str, now: str) -> list[Obj]:
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


def _open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _port(container: Obj, port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for found in container.get("ports") or []:
        if found.get("name") == port:
            return int(found["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def _killpg(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill_all(record: _Pod) -> None:
    for container in record.containers.values():
        if container.process is not None:
            _killpg(container.process.pid)


async def _reap(record: _Pod) -> None:
    """Wait for each container's process, then (bounded) for the rest of its process group."""
    for container in record.containers.values():
        if container.process is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(container.process.wait(), 10)
            for _ in range(200):
                if not _group_alive(container.process.pid):
                    break
                _killpg(container.process.pid)
                await asyncio.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is in group `pgid` (Linux /proc; else False)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[2]) == pgid:
                    return True
    return False


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("fake kubelet task failed", exc_info=task.exception())
