"""The fake kubelet (and scheduler of its single node): pods run as local processes.

`FakeKubelet` has each ungated pod bound and prepared (`pod_startup`), runs its containers as
process groups, restarts them per policy, serves their logs and stops pods on graceful delete
(SIGTERM, SIGKILL after the grace); `pod_status` writes what it sees. It owns the
`ServiceNetwork`. Everything runs on the store's event loop; no threads of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import shutil
import signal
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from kernel_queue_fake_cluster.apiserver import pod_rules
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common import addresses, pods
from kernel_queue_fake_cluster.node import network, pod_startup, volumes
from kernel_queue_fake_cluster.node.pod_startup import PodStarter
from kernel_queue_fake_cluster.node.pod_status import ContainerRecord, PodRecord, StatusManager

log = logging.getLogger(__name__)

NODE_NAME = "fake-node"


class FakeKubelet:
    """One node (`fake-node`, host IP 127.0.0.1) running every pod of `store` on this machine.

    Processes: `command` + `args` (`$(VAR)` expanded, mountPaths rewritten; no `command` is a
    CreateContainerError), one session each, stdout+stderr appended to `pods/<uid>/logs/<name>.log`
    under `root_dir`; cwd is `workingDir` (rewritten; a path missing here becomes
    `pods/<uid>/rootfs/<path>`, the default is `pods/<uid>/rootfs`). Env, later wins: `base_env`
    (PATH: this interpreter's directory, then this process's PATH; or, for an image that
    `image_paths` maps, that directory, e.g. another virtualenv's bin, then a Debian image's
    system dirs and never this interpreter, so an empty one is an image without Python; HOME,
    LANG, HOSTNAME = pod name), one
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
        image_paths: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.root = store, Path(root_dir)
        self.pod_ips = addresses.AddressPool(pod_ip_pool)
        self.network = network.ServiceNetwork(
            store, pool=service_ip_pool, hold_seconds=service_hold_seconds
        )
        self.probe_floor, self.pull_backoff, self.node_name = probe_floor, pull_backoff, node_name
        self.status = StatusManager(store, node_name=node_name, probe_floor=probe_floor)
        self.startup = PodStarter(
            store,
            self.root,
            self.status,
            self.pod_ips,
            node_name=node_name,
            pull_backoff=pull_backoff,
            image_paths=image_paths,
        )
        # the fault API: `PodStarter` owns the faults, as the holds they cause
        self.unschedulable = self.startup.unschedulable
        self.fail_image = self.startup.fail_image
        self.clear_faults = self.startup.clear_faults
        self._pods: dict[str, PodRecord] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The directory that holds the files of claim `claim` in `namespace`."""
        return volumes.claim_dir(self.root, namespace, claim)

    def install(self) -> None:
        """Pod admission rules, pod/volume-source listeners, the graceful-delete hook, Services."""
        pod_rules.install(self.store)
        self.store.add_listener("", "pods", self._on_pod)
        for plural in ("secrets", "configmaps", "persistentvolumeclaims"):
            self.store.add_listener("", plural, lambda kind, obj: self.startup.notify())
        self.store.add_delete_hook("", "pods", self._on_delete)
        self.network.install()
        for pod in list(self.store.objects("", "pods")):
            self._on_pod("ADDED", copy.deepcopy(pod))

    async def aclose(self) -> None:
        """Kill every container process (and its session), stop probes and the Service network."""
        self.status.closed = True
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
        if self.status.closed:
            return
        self.startup.notify()
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
            self.status.mark_gated(pod)
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

    # -- lifecycle -------------------------------------------------------------------------

    async def _run(self, record: PodRecord) -> None:
        if await self.startup.schedule(record) and await self.startup.prepare(record):
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
        if record.gone or self.status.live(record) is None:  # deleted while it was starting
            record.terminating = True
            _killpg(container.process.pid)
            if record.gone:
                await container.process.wait()
                return False
        elif record.terminating:
            with contextlib.suppress(ProcessLookupError):
                container.process.send_signal(signal.SIGTERM)
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
            delay = min(self.probe_floor * 2**container.restarts, 2.0)
            why = f"back-off {delay:g}s restarting failed container={container.name}"
            container.waiting = ("CrashLoopBackOff", f"{why} pod={record.name}_{record.namespace}")
            self.status.publish(record)
            await asyncio.sleep(delay)
            if record.terminating or record.gone or not await self._exec(record, container):
                return
            self._spawn(record, self.status.probe(record, container))
            self.status.publish(record)

    async def _terminate(self, record: PodRecord, grace: int) -> None:
        """Graceful stop: SIGTERM, SIGKILL after `grace` s, final status, then delete with 0."""
        watchers = [c.watcher for c in record.containers.values() if c.running and c.watcher]
        for container in record.containers.values():
            if container.running and container.process is not None:
                self.status.event_for(
                    record, "Normal", "Killing", f"Stopping container {container.name}"
                )
                with contextlib.suppress(ProcessLookupError):
                    container.process.send_signal(signal.SIGTERM if grace else signal.SIGKILL)
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=grace)
            if pending:
                _kill_all(record)
                await asyncio.wait(pending, timeout=10)
        self.status.publish(record)
        if self.status.live(record, deleting=True) is not None:
            with contextlib.suppress(ApiError):
                self.store.delete("", "pods", record.namespace, record.name, grace_seconds=0)

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


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("fake kubelet task failed", exc_info=task.exception())
