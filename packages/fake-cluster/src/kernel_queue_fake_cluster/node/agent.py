"""The node agent: one Kubernetes node whose pods run as local processes, driven only through the
Kubernetes HTTP API, so the same agent serves the fake API server and a real one.

`NodeAgent` registers its Node (and renews its Lease where the API serves Leases), watches pods,
Secrets, ConfigMaps, claims, volumes and Services (`informer.py`), provisions volumes for
unbound claims where PersistentVolumes are served (`provisioner.py`), binds ungated pods itself
when there is no scheduler (`bind`) or runs those a scheduler bound to it, prepares them
(`pod_startup`), runs their containers as process groups, restarts them per policy, patches
their status (`pod_status`), serves their logs (in-process, and over HTTPS at the kubelet
endpoint when asked: `logs.py`) and stops them on graceful deletion: SIGTERM, SIGKILL after the
grace period, the final status, then a DELETE with grace 0. It owns the `ServiceNetwork`
(kube-proxy's job) and the cluster's DNS names (`dns.py`, CoreDNS's). Everything runs on one
event loop; no threads of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from kernel_queue_fake_cluster.common import addresses, pods
from kernel_queue_fake_cluster.common.objects import Obj, now_rfc3339
from kernel_queue_fake_cluster.node import dns, pod_startup, registration, volumes
from kernel_queue_fake_cluster.node.client import (
    STRATEGIC_MERGE_PATCH,
    ApiError,
    Client,
    ClientConfig,
    path,
)
from kernel_queue_fake_cluster.node.informer import Informer
from kernel_queue_fake_cluster.node.network import ServiceNetwork
from kernel_queue_fake_cluster.node.pod_startup import Caches, PodStarter
from kernel_queue_fake_cluster.node.pod_status import ContainerRecord, PodRecord, StatusManager
from kernel_queue_fake_cluster.node.provisioner import Provisioner
from kernel_queue_fake_cluster.node.registration import Capacity, Heartbeat

log = logging.getLogger(__name__)

NODE_NAME = "fake-node"
WATCHED = (
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "persistentvolumes",
    "services",
    "pods",
)
"""The kinds the agent keeps caches of (pods last: their handlers read the others)."""
UNKNOWN_AT_TERMINATION = "The container could not be located when the pod was terminated"


class NodeAgent:
    """Node `node_name` (host IP 127.0.0.1) of the API server `config` names, running its pods
    on this machine.

    Which pods: with `bind` (a plane without a scheduler, as the fake's) every ungated pod not
    bound elsewhere, which the agent binds through `pods/{name}/binding` (held as Unschedulable
    while an `unschedulable` fault matches or a claim is missing or unbound); without, the pods
    whose `spec.nodeName` is `node_name`. The Node offers `capacity`.
    Processes: `command` + `args` (`$(VAR)` expanded, mountPaths rewritten; no `command` is a
    CreateContainerError), one session each, stdout+stderr appended to `pods/<uid>/logs/<name>.log`
    under `root_dir`; cwd is `workingDir` (rewritten; a path missing here becomes
    `pods/<uid>/rootfs/<path>`, the default is `pods/<uid>/rootfs`). Env, later wins: `base_env`
    (PATH: this interpreter's directory, then this process's PATH; or, for an image that
    `image_paths` maps, that directory, e.g. another virtualenv's bin, then a Debian image's
    system dirs and never this interpreter, so an empty one is an image without Python; HOME,
    LANG, HOSTNAME = `spec.hostname` or the pod name), cluster DNS (`LD_PRELOAD` of
    libnss_wrapper and `NSS_WRAPPER_HOSTS`, its namespace's hosts file: `dns.py`; none where
    `nss_wrapper` is False or the library is missing), one
    `KUBE_FAKE_MOUNT_<PATH>` per volumeMount, `envFrom`, `env`. Nothing else of this process.
    Volumes: `pvc/<namespace>/<claim>` (kept; the claim must exist, else Unschedulable; where
    PersistentVolumes are served, `provisioner.py` makes one there for each unbound claim and
    deletes it, and the folder, once the claim is gone),
    `pods/<uid>/volumes/<name>` for emptyDir, Secret, ConfigMap, downwardAPI, projected (files
    0600 unless a mode is given; removed with the pod); hostPath as is. Each pod gets its own
    loopback IP from `pod_ip_pool`.
    Not simulated: images and image pulls (see `fail_image`), init containers, liveness and
    startup probes, exec/grpc readiness probes (pass; httpGet is a TCP connect), preStop hooks,
    resource limits (no OOMKilled), activeDeadlineSeconds, Service env links, updates of mounted
    Secrets, other nodes (pods bound elsewhere are left alone).

    Readiness probes run as a kubelet runs them: as the container starts, then every
    periodSeconds (`StatusManager.probe`). `restart_backoff`: the base of the restart backoff
    (Always/OnFailure; a kubelet's is 10 s). `pull_backoff`: ErrImagePull to
    ImagePullBackOff. `logs_port`: serve `/containerLogs/...` over HTTPS on 127.0.0.1 at this
    port (0: any free one), the Node's kubelet endpoint, for a real API server's `kubectl logs`;
    None: no such server (the fake API server asks `logs()` in-process). `lease_interval`:
    seconds between Lease renewals. `await start()` on the running loop; `await aclose()` at the
    end (every pod process group killed, the pods' directories removed, claims kept).
    """

    def __init__(
        self,
        config: ClientConfig | str,
        root_dir: str | os.PathLike[str],
        *,
        node_name: str = NODE_NAME,
        bind: bool = False,
        capacity: Capacity | None = None,
        image_paths: Mapping[str, str] | None = None,
        pod_ip_pool: str = "127.10.0.0/16",
        restart_backoff: float = 0.05,
        pull_backoff: float = 0.5,
        service_hold_seconds: float = 30.0,
        logs_port: int | None = None,
        lease_interval: float = 10.0,
        nss_wrapper: bool = True,
    ) -> None:
        self.config = ClientConfig(config) if isinstance(config, str) else config
        self.client = Client(self.config)
        self.root, self.node_name, self.bind = Path(root_dir), node_name, bind
        self.capacity, self.logs_port = capacity or Capacity(), logs_port
        self.restart_backoff, self.pull_backoff = restart_backoff, pull_backoff
        self.pod_ips = addresses.AddressPool(pod_ip_pool)
        self.informers = {plural: Informer(self.client, plural) for plural in WATCHED}
        self.pods = self.informers["pods"]
        self.network = ServiceNetwork(
            self.informers["services"], self.pods, hold_seconds=service_hold_seconds
        )
        library = dns.find_library() if nss_wrapper else None
        self.dns = dns.ClusterDns(
            self.informers["services"],
            self.pods,
            self.root,
            lambda pod: (
                self.pod_ips.address(pod["metadata"]["uid"])
                or (pod.get("status") or {}).get("podIP")
            ),
            library=library,
        )
        self.status = StatusManager(self.client, self.pods.get, node_name=node_name, bind=bind)
        self.startup = PodStarter(
            self.client,
            Caches(self.informers),
            self.root,
            self.status,
            self.pod_ips,
            node_name=node_name,
            pull_backoff=pull_backoff,
            image_paths=image_paths,
            dns=self.dns,
        )
        self.heartbeat = Heartbeat(self.client, node_name, interval=lease_interval)
        self.provisioner = Provisioner(
            self.client,
            self.informers["persistentvolumeclaims"],
            self.informers["persistentvolumes"],
            self.root,
            node_name,
        )
        self.node: Obj | None = None
        """The Node as registered."""
        # the fault API: `PodStarter` owns the faults, as the holds they cause
        self.unschedulable = self.startup.unschedulable
        self.fail_image = self.startup.fail_image
        self.clear_faults = self.startup.clear_faults
        self._logs: Any = None  # the HTTPS log server (`logs.LogServer`) while serving
        self._pods: dict[str, PodRecord] = {}
        self._released: set[str] = set()  # pods it deleted without having run them
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def kubelet_port(self) -> int:
        """The port of the HTTPS log endpoint (0 when it serves none)."""
        return int(self._logs.port) if self._logs is not None else 0

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The directory that holds the files of claim `claim` in `namespace`."""
        return volumes.claim_dir(self.root, namespace, claim)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, within: float = 60.0) -> NodeAgent:
        """Register the Node, fill the caches, then take pods; return once it runs them."""
        self.startup.start()
        self.root.mkdir(parents=True, exist_ok=True)
        port = 0
        if self.logs_port is not None:
            from kernel_queue_fake_cluster.node import logs

            self._logs = logs.LogServer(self, self.root / "tls")
            port = await self._logs.start(self.logs_port)
        self.node = await registration.register(
            self.client, self.node_name, self.capacity, port=port
        )
        for plural, informer in self.informers.items():
            if plural in ("persistentvolumeclaims", "persistentvolumes"):
                informer.add_handler(self.provisioner.notify)
            if plural == "services":
                informer.add_handler(self.network.on_service)
                informer.add_handler(self.dns.on_service)
            elif plural not in ("pods", "persistentvolumes"):
                informer.add_handler(lambda kind, obj: self.startup.notify())
        self.pods.add_handler(self._on_pod)
        self.pods.add_handler(self.network.on_pod)
        self.pods.add_handler(self.dns.on_pod)
        async with asyncio.timeout(within):
            for plural in WATCHED[:-1]:
                self.informers[plural].start()
            for plural in WATCHED[:-1]:
                await self.informers[plural].synced.wait()
            self.pods.start()
            await self.pods.synced.wait()
        self._spawn(None, self.heartbeat.run())
        self._spawn(None, self.provisioner.run())
        return self

    async def aclose(self) -> None:
        """Kill every container process (and its session), stop probes, watches, the Service
        network and the log server; remove the pods' directories (claims stay)."""
        self._closed = True
        await self.status.aclose()
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
            shutil.rmtree(record.dir, ignore_errors=True)
        self._pods.clear()
        for key in self.pod_ips.holders():
            self.pod_ips.release(key)
        for informer in self.informers.values():
            await informer.stop()
        await self.network.aclose()
        self.dns.close()
        if self._logs is not None:
            await self._logs.stop()
            self._logs = None
        await self.client.close()
        with contextlib.suppress(OSError):
            (self.root / "pods").rmdir()  # empty now, unless something else is there

    # -- logs --------------------------------------------------------------------------------

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path:
        """The file a container's stdout and stderr go to; errors as the API server's."""
        pod = self.pods.get(namespace, name)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
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

    def running(self, namespace: str, name: str, container: str) -> bool:
        """Whether the container of that pod runs now (a followed log goes on)."""
        pod = self.pods.get(namespace, name)
        record = self._pods.get(pod["metadata"]["uid"]) if pod else None
        found = record.containers.get(container) if record else None
        return found is not None and found.running

    # -- pods --------------------------------------------------------------------------------

    def _on_pod(self, kind: str, pod: Obj) -> None:
        if self._closed:
            return
        self.startup.notify()
        meta, spec = pod["metadata"], pod.get("spec") or {}
        record = self._pods.get(meta["uid"])
        if kind == "DELETED":
            self._released.discard(meta["uid"])
            self._forget(meta["uid"])
        elif record is not None:
            if meta.get("deletionTimestamp"):
                grace = int(meta.get("deletionGracePeriodSeconds") or 0)
                if not record.terminating:
                    record.terminating = True
                    self._spawn(record, self._terminate(record, grace))
                elif grace == 0 and any(c.running for c in record.containers.values()):
                    _kill_all(record)  # a forced delete cuts the grace period short
        elif meta.get("deletionTimestamp"):
            if spec.get("nodeName") == self.node_name and meta["uid"] not in self._released:
                self._released.add(meta["uid"])
                self._spawn(None, self._release(pod))
        elif pods.terminal(pod) or spec.get("nodeName") not in (None, "", self.node_name):
            return
        elif not spec.get("nodeName") and not self.bind:
            return  # the scheduler's to place
        elif pods.gates(pod):
            self.status.mark_gated(pod)
        else:
            record = self._record(pod)
            self._pods[record.uid] = record
            record.runner = self._spawn(record, self._run(record))

    def _record(self, pod: Obj) -> PodRecord:
        meta, spec = pod["metadata"], pod["spec"]
        folder = self.root / "pods" / meta["uid"]
        containers = {
            c["name"]: ContainerRecord(c["name"], c, folder / "logs" / f"{c['name']}.log")
            for c in spec["containers"]
        }
        policy = spec.get("restartPolicy", "Always")
        return PodRecord(meta["uid"], meta["namespace"], meta["name"], folder, policy, containers)

    def _forget(self, uid: str) -> None:
        record = self._pods.pop(uid, None)
        if record is None:
            return
        record.gone = True
        _kill_all(record)
        for task in record.tasks:
            task.cancel()
        self._spawn(None, self._cleanup(record))

    async def _cleanup(self, record: PodRecord) -> None:
        await _reap(record)
        shutil.rmtree(record.dir, ignore_errors=True)  # emptyDir, Secret files, logs
        self.pod_ips.release(record.uid)

    async def _release(self, pod: Obj) -> None:
        """A pod bound here and being deleted that the agent never ran: Failed (as a kubelet's
        TerminatePod says), then the final DELETE."""
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
            if not pods.terminal(pod):
                body = {"metadata": {"uid": uid}, "status": {"phase": "Failed"}}
                target = path("pods", namespace, name, "status")
                await self.client.patch(target, body, STRATEGIC_MERGE_PATCH)
            await self.client.delete(path("pods", namespace, name), grace=0, uid=uid)

    # -- lifecycle of one pod ----------------------------------------------------------------

    async def _run(self, record: PodRecord) -> None:
        pod = self.status.live(record)
        if pod is None:
            return
        if pod["spec"].get("nodeName") == self.node_name:
            self.startup.take(record)  # bound already (by a scheduler, or before a restart)
        elif not await self.startup.schedule(record):
            return
        if await self.startup.prepare(record):
            await self._start(record)

    async def _start(self, record: PodRecord) -> None:
        for container in record.containers.values():
            if record.terminating or record.gone:
                container.exit_code, container.exit_reason = 137, "ContainerStatusUnknown"
                container.waiting = None
                continue
            if await self._exec(record, container):
                self._watch(record, container)
        self.status.publish(record)

    async def _exec(self, record: PodRecord, container: ContainerRecord) -> bool:
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
            container.message = pod_startup.start_error(
                container.argv[0] if container.argv else "", exc
            )
            self.status.event_for(record, "Warning", "Failed", f"Error: {container.message}")
            return False
        finally:
            os.close(output)
        if record.gone:  # the pod went (or the agent closes) while it was starting
            _killpg(container.process.pid)
            await container.process.wait()
            return False
        self.status.event_for(record, "Normal", "Started", f"Started container {container.name}")
        return True

    def _watch(self, record: PodRecord, container: ContainerRecord) -> None:
        container.watcher = self._spawn(record, self._supervise(record, container))
        self._spawn(record, self.status.probe(record, container))

    async def _supervise(self, record: PodRecord, container: ContainerRecord) -> None:
        """Wait for the process; record its exit (128+signal if killed); restart per policy."""
        while container.process is not None:
            code = await container.process.wait()
            _killpg(container.process.pid)  # the container's other processes go with it
            container.exit_code = 128 - code if code < 0 else code
            container.exit_reason = "Completed" if code == 0 else "Error"
            container.message = pod_startup.termination_message(container)
            container.finished_at, container.ready = now_rfc3339(), False
            self.status.publish(record)
            policy = record.restart_policy
            if record.terminating or policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            container.last_state = {"terminated": container.terminated()}
            container.restarts += 1
            delay = min(self.restart_backoff * 2**container.restarts, 2.0)
            why = f"back-off {delay:g}s restarting failed container={container.name}"
            container.waiting = ("CrashLoopBackOff", f"{why} pod={record.name}_{record.namespace}")
            self.status.publish(record)
            await asyncio.sleep(delay)
            if record.terminating or record.gone or not await self._exec(record, container):
                return
            self._spawn(record, self.status.probe(record, container))
            self.status.publish(record)

    async def _terminate(self, record: PodRecord, grace: int) -> None:
        """Graceful stop: SIGTERM, SIGKILL after `grace` s, the final status, then the DELETE
        with grace 0 (the object goes once no finalizer holds it)."""
        self.startup.notify()  # holds (scheduling, image pulls) see the deletion and give up
        runner = record.runner
        if runner is not None and not runner.done():
            await asyncio.wait((runner,))
        if not record.bound:
            return  # never bound here: the API server deleted it at once, finalizers aside
        running = [c for c in record.containers.values() if c.running and c.process]
        watchers = [c.watcher for c in running if c.watcher is not None]
        for container in running:
            self.status.event_for(
                record, "Normal", "Killing", f"Stopping container {container.name}"
            )
            assert container.process is not None
            with contextlib.suppress(ProcessLookupError):
                container.process.send_signal(signal.SIGTERM if grace else signal.SIGKILL)
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=grace)
            if pending:
                _kill_all(record)
                await asyncio.wait(pending, timeout=10)
        for container in record.containers.values():
            if container.exit_code is None and not container.running:  # never started
                container.exit_code, container.exit_reason = 137, "ContainerStatusUnknown"
                container.message = UNKNOWN_AT_TERMINATION
            container.waiting = None
        self.status.publish(record)
        await self.status.flush(record)
        pod = self.status.live(record, deleting=True)
        if pod is not None:
            with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
                target = path("pods", record.namespace, record.name)
                await self.client.delete(target, grace=0, uid=record.uid)

    def _spawn(
        self, record: PodRecord | None, work: Coroutine[Any, Any, None]
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        owner = record.tasks if record is not None else self._tasks
        owner.add(task)
        task.add_done_callback(owner.discard)
        task.add_done_callback(_log_failure)
        return task


def _open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _killpg(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill_all(record: PodRecord) -> None:
    for container in record.containers.values():
        if container.process is not None:
            _killpg(container.process.pid)


async def _reap(record: PodRecord) -> None:
    """Wait for each container's process, then (bounded) for the rest of its process group."""
    for container in record.containers.values():
        if container.process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await container.process.wait()
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


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("node agent task failed", exc_info=task.exception())
