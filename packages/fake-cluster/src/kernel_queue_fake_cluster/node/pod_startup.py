"""Getting a pod to where its containers can start, and the simulated faults that hold it there.

`PodStarter` binds each pod to the node through `pods/{name}/binding` when the agent plays the
scheduler (held while an `unschedulable` `Fault` matches or a claim is missing or unbound), or
takes a pod the scheduler bound to it; then mounts its volumes, "pulls" its images (held by
`fail_image` faults: ErrImagePull, then ImagePullBackOff) and resolves each container's argv,
env and working dir from what the agent's caches say of Secrets, ConfigMaps and claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kernel_queue_fake_cluster.common import addresses, selectors
from kernel_queue_fake_cluster.common.objects import Obj, now_rfc3339
from kernel_queue_fake_cluster.node import dns as cluster_dns
from kernel_queue_fake_cluster.node import pod_env, registration, volumes
from kernel_queue_fake_cluster.node.client import ApiError, Client, path
from kernel_queue_fake_cluster.node.informer import Informer
from kernel_queue_fake_cluster.node.pod_status import ContainerRecord, PodRecord, StatusManager

log = logging.getLogger(__name__)

BASE_ENV_KEYS = ("HOME", "LANG")  # copied from this process; PATH gets the venv's bin first
IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The rest of PATH in a container whose image `image_paths` maps: a Debian image's, never this
process's (whose `python` would stand in for one the image lacks)."""
NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
NO_MATCH = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
UNBOUND_CLAIMS = (
    "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: "
    "0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)
"""The scheduler's words for a pod whose claim has no volume bound (a claim Pending)."""
PULL_FAILED = (
    'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and '
    'unpack image "{image}": not found'
)


def base_env(hostname: str, bin_dir: str | None = None) -> dict[str, str]:
    """What every container starts with before its spec's env: PATH (`bin_dir` then
    `IMAGE_PATH`; else this interpreter's bin, then this process's PATH: so `python` is that
    virtualenv's), HOME and LANG from this process, HOSTNAME (the pod's `hostname`)."""
    if bin_dir is not None:
        path = os.pathsep.join([bin_dir, IMAGE_PATH])
    else:
        first = os.path.dirname(sys.executable)
        path = os.pathsep.join([first, os.environ.get("PATH", os.defpath)])
    env = {"PATH": path, "HOSTNAME": hostname}
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
    owner: PodStarter | None = field(default=None, repr=False)

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


class Caches:
    """The `pod_env.Objects` the agent's informers hold (Secrets, ConfigMaps, claims)."""

    def __init__(self, informers: Mapping[str, Informer]) -> None:
        self.informers = informers

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        informer = self.informers.get(plural)
        return informer.get(namespace, name) if informer is not None else None

    def served(self, plural: str) -> bool:
        informer = self.informers.get(plural)
        return informer is not None and informer.served

    async def fetch(self, pod: Obj) -> None:
        """Bring the objects `pod` refers to into the caches if the watches have not yet."""
        namespace, wanted = pod["metadata"]["namespace"], references(pod)
        await asyncio.gather(
            *(
                self.informers[plural].fetch(namespace, name)
                for plural, name in wanted
                if plural in self.informers and self.get(plural, namespace, name) is None
            )
        )


def references(pod: Obj) -> set[tuple[str, str]]:
    """(plural, name) of each Secret, ConfigMap and claim the pod's volumes and env name."""
    found: set[tuple[str, str]] = set()
    spec = pod.get("spec") or {}
    for volume in spec.get("volumes") or []:
        for source in (volume.get("projected") or {}).get("sources") or [volume]:
            if "secret" in source:
                found.add(("secrets", source["secret"].get("secretName") or ""))
            if "configMap" in source:
                found.add(("configmaps", source["configMap"].get("name") or ""))
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            found.add(("persistentvolumeclaims", claim))
    for container in spec.get("containers") or []:
        for source in container.get("envFrom") or []:
            for kind, plural in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
                if kind in source:
                    found.add((plural, source[kind].get("name") or ""))
        for item in container.get("env") or []:
            ref = item.get("valueFrom") or {}
            for kind, plural in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
                if kind in ref:
                    found.add((plural, ref[kind].get("name") or ""))
    return {(plural, name) for plural, name in found if name}


class PodStarter:
    """Schedules (or takes) and prepares the agent's pods (`schedule`, then `prepare`); owns
    the faults.

    Both re-check whenever `notify()` says something changed (a pod, Secret, ConfigMap or claim,
    a cleared fault), and at least every second. The fault API is `NodeAgent`'s."""

    def __init__(
        self,
        client: Client,
        caches: Caches,
        root: Path,
        status: StatusManager,
        pod_ips: addresses.AddressPool,
        *,
        node_name: str,
        pull_backoff: float,
        image_paths: Mapping[str, str] | None = None,
        dns: cluster_dns.ClusterDns | None = None,
    ) -> None:
        self.client, self.caches, self.root = client, caches, root
        self.dns = dns
        self.status, self.pod_ips = status, pod_ips
        self.node_name, self.pull_backoff = node_name, pull_backoff
        self.image_paths = dict(image_paths or {})
        self._node_labels = registration.node(node_name)["metadata"]["labels"]
        self._faults: list[Fault] = []
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

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
        self.notify()

    def _add(self, fault: Fault) -> Fault:
        fault.owner = self
        self._faults.append(fault)
        return fault

    def notify(self) -> None:
        """Wake the holds to re-check: something they wait on may have changed. Safe to call
        from another thread (a test's) once the agent started."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self.notify)
                return
        self._changed.set()
        self._changed = asyncio.Event()

    def start(self) -> None:
        """Remember the running loop (for `notify` from other threads)."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    # -- scheduling and preparation --------------------------------------------------------

    async def schedule(self, record: PodRecord) -> bool:
        """Bind the pod to this node (the agent as the scheduler), held while a fault or its
        claims keep it unschedulable; False if it went away or another node took it."""
        while True:
            changed = self._changed
            pod = self.status.live(record)
            if pod is None:
                return False
            await self.caches.fetch(pod)
            message = next(
                (f.message for f in self._faults if f.kind == "unschedulable" and f.matches(pod)),
                "",
            )
            wanted = (pod.get("spec") or {}).get("nodeSelector") or {}
            if any(self._node_labels.get(k) != v for k, v in wanted.items()):
                message = NO_MATCH  # (nodeSelector only: nothing of ours sets node affinity)
            if volumes.unbound_claims(self.caches, pod):
                message = UNBOUND_CLAIMS
            for claim in volumes.missing_claims(self.caches, pod)[:1]:
                message = f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found.'
            if (pod.get("spec") or {}).get("nodeName"):  # bound meanwhile, by someone else
                return self._taken_elsewhere(record, pod)
            if not message:
                bound = await self._bind(record, pod)
                if bound is not None:
                    break  # else the API failed: wait, and try again
            elif message != record.unschedulable:
                record.unschedulable = message
                self.status.publish(record)
                self.status.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            await _wait(changed, 1.0)
        if not bound:
            return False
        record.unschedulable = ""
        where = f"Successfully assigned {record.namespace}/{record.name} to {self.node_name}"
        self.status.event(pod, "Normal", "Scheduled", where, "default-scheduler")
        self.take(record)
        return True

    async def _bind(self, record: PodRecord, pod: Obj) -> bool | None:
        """POST the binding: True when bound here, False when it cannot be (bound elsewhere,
        gone), None when the API failed (try again)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": record.name, "namespace": record.namespace, "uid": record.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            await self.client.create(path("pods", record.namespace, record.name, "binding"), body)
            return True
        except ApiError as exc:
            if exc.code not in (404, 409):
                log.warning("cannot bind pod %s/%s: %s", record.namespace, record.name, exc)
                return None
            failure = exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("cannot bind pod %s/%s: %s", record.namespace, record.name, exc)
            return None
        try:  # a 409: taken already? (this agent's earlier try whose answer was lost)
            now = await self.client.get(path("pods", record.namespace, record.name))
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError):
            return False
        mine = bool(
            now["metadata"]["uid"] == record.uid and now["spec"].get("nodeName") == self.node_name
        )
        if not mine:
            log.info("pod %s/%s not bound: %s", record.namespace, record.name, failure.message)
        return mine

    def _taken_elsewhere(self, record: PodRecord, pod: Obj) -> bool:
        if pod["spec"]["nodeName"] != self.node_name:
            return False
        record.unschedulable = ""
        self.take(record)
        return True

    def take(self, record: PodRecord) -> None:
        """The pod is this node's now (bound by the agent or by a scheduler): its IP and start
        time, in the status."""
        record.ip, record.bound = self.pod_ips.allocate(record.uid), True
        record.start_time = now_rfc3339()
        self.status.publish(record)

    async def prepare(self, record: PodRecord) -> bool:
        """Mount volumes, pull images (faults), resolve env: retry until every container can
        start, showing why not in its waiting state (and one event per new reason)."""
        pulled_at: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            changed = self._changed
            pod = self.status.live(record)
            if pod is None:
                return False
            faults = [f for f in self._faults if f.kind == "image" and f.matches(pod)]
            blocked, wait = False, 1.0
            await self.caches.fetch(pod)
            pod = record.view(pod, self.node_name)
            try:
                dirs = volumes.prepare_volumes(self.caches, pod, self.root, record.dir)
            except pod_env.ConfigError as exc:  # FailedMount: one event, on the first container
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
                except pod_env.ConfigError as exc:
                    blocked, event = True, ("Warning", "Failed", f"Error: {exc.message}")
                    self._wait_on(pod, container, (exc.reason, exc.message), event)
            if not blocked:
                return True
            self.status.publish(record)
            await _wait(changed, wait)

    def _wait_on(
        self,
        pod: Obj,
        container: ContainerRecord,
        waiting: tuple[str, str],
        event: tuple[str, str, str] | None,
    ) -> None:
        """Show `waiting` on the container; post `event` (type, reason, message) once."""
        container.waiting = waiting
        if event is not None and container.last_event != event:
            container.last_event = event
            self.status.event(pod, *event)

    def _bin_dir(self, container: Obj) -> str | None:
        """The directory `image_paths` maps the container's image to (fnmatch patterns)."""
        image = str(container.get("image", ""))
        return next((d for p, d in self.image_paths.items() if fnmatch.fnmatch(image, p)), None)

    def _plan(
        self, record: PodRecord, container: ContainerRecord, pod: Obj, dirs: dict[str, Path]
    ) -> None:
        """Resolve argv, env and working directory (mountPaths rewritten to directories)."""
        spec = container.spec
        mounts = volumes.Mounts.of(spec, dirs)
        base = base_env(hostname(pod), self._bin_dir(spec))
        if self.dns is not None:  # names of the cluster, for every program of the pod
            base.update(self.dns.env(record.namespace))
        container.env, raw = pod_env.container_env(self.caches, pod, spec, mounts, base)
        command = [str(a) for a in (spec.get("command") or [])]
        if not command:
            message = "the fake kubelet runs no images: the container needs a `command`"
            raise pod_env.ConfigError("CreateContainerError", message)
        args = command + [str(a) for a in (spec.get("args") or [])]
        container.argv = [mounts.rewrite(pod_env.expand(a, raw)) for a in args]
        # terminationMessagePath: the kubelet mounts a file there; here it is a file of the pod's
        # directory, and values naming the path are pointed at it, as mountPaths are.
        path = str(spec.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH)
        local = record.dir / f"termination-{container.name}"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.touch(mode=0o600)
        container.termination_file = local
        container.argv = [str(local) if a == path else a for a in container.argv]
        container.env = {k: str(local) if v == path else v for k, v in container.env.items()}
        workdir = mounts.rewrite(spec.get("workingDir") or "")
        if not workdir or not os.path.isdir(workdir):  # missing: a fresh dir under the pod root
            scratch = record.dir / "rootfs" / workdir.lstrip("/")
            scratch.mkdir(parents=True, exist_ok=True)
            workdir = str(scratch)
        container.cwd = workdir


def hostname(pod: Obj) -> str:
    """The pod's host name, as the kubelet sets it: `spec.hostname`, else its name (cut to 63
    characters)."""
    return str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"][:63])


TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The kubelet keeps at most this much of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096


def termination_message(container: ContainerRecord) -> str:
    """What the container wrote to its termination-message file (truncated as the kubelet does)."""
    if container.termination_file is None:
        return ""
    try:
        data = container.termination_file.read_bytes()[:TERMINATION_MESSAGE_LIMIT]
    except OSError:
        return ""
    return data.decode(errors="replace").strip()


def start_error(executable: str, exc: OSError) -> str:
    """The message containerd and runc give a container whose command cannot be executed."""
    if isinstance(exc, FileNotFoundError) and "/" not in executable:
        why = "executable file not found in $PATH"
    elif isinstance(exc, FileNotFoundError):
        why = "no such file or directory"
    elif isinstance(exc, PermissionError):
        why = "permission denied"
    else:
        why = exc.strerror or str(exc)
    return (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: runc create failed: unable to start container process: exec: "
        f'"{executable}": {why}: unknown'
    )


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
