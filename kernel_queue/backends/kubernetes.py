"""The kubernetes backend: each kernel a Kueue-managed pod group, reached through its Service.

Submitting creates a Secret (the key), a ClusterIP Service (a stable address across pod
replacement) and the group's pods; Kueue gates, admits, evicts. One shared informer per
namespace and kind (pods, Workloads) feeds every kernel's status from memory; queue positions
come from Kueue's visibility API, fetched per LocalQueue only while kernels wait there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from traitlets import Float, Unicode, default
from traitlets.config import LoggingConfigurable

from kernel_queue import errors
from kernel_queue.backends import feed
from kernel_queue.kube import kueue, manifests, names
from kernel_queue.kube import status as group_status
from kernel_queue.kube.informer import Informer, Informers
from kernel_queue.model import (
    GroupPhase,
    GroupRef,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    StopCause,
    short_id,
)

if TYPE_CHECKING:
    from kernel_queue.kube.api import KubeApi

Obj = dict[str, Any]
_TERMINAL = feed.TERMINAL
_LOG_LINES = 20
_POD_SELECTOR = f"{kueue.MANAGED_BY_LABEL}={kueue.MANAGED_BY}"
_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(eq=False)
class _Group:
    """One kernel's current pod group as this backend tracks it."""

    ref: GroupRef
    queue: str
    spec: GroupSpec | None = None  # None for a group adopted after a server restart
    status: GroupStatus = field(default_factory=lambda: GroupStatus(GroupPhase.PENDING))
    place: QueuePlace | None = None
    watchers: set[asyncio.Queue[GroupStatus]] = field(default_factory=set)
    was_running: bool = False
    had_workload: bool = False
    replacing: bool = False
    attempt: int = 0
    released: bool = False
    failure_logged: bool = False
    saved: str = ""  # what the last preempted pod's checkpoint saved; kept after it is deleted


class KubernetesBackend(LoggingConfigurable):
    """Queues kernels as Kueue pod groups. Configure it as `c.KubernetesBackend.<trait>`."""

    name = "kubernetes"
    tracks_kernel_restarts = False  # a pod's launcher restarts its kernel unseen by the API

    kubeconfig = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""Kubeconfig file to use; default: in-cluster credentials, else $KUBECONFIG or
        ~/.kube/config.""",
    )
    context = Unicode(None, allow_none=True, config=True, help="Kubeconfig context to use.")
    namespace = Unicode(
        config=True,
        help="""Namespace of kernels whose kernelspec names none.
        Env: KERNEL_QUEUE_NAMESPACE; default: the server's own namespace, else 'default'.""",
    )
    position_interval = Float(
        2.0,
        config=True,
        help="""Seconds between reads of Kueue's visibility API for a LocalQueue, while kernels
        wait in it (one read serves every kernel of that queue).""",
    )

    @default("namespace")
    def _namespace_default(self) -> str:
        return _own_namespace()  # `_client` reads it first, off the event loop

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._api: KubeApi | None = None
        self._api_lock = asyncio.Lock()
        self._informers = Informers()
        self._groups: dict[str, _Group] = {}  # group name -> group
        self._launches: dict[str, int] = {}  # kernel id -> launches so far
        self._positions: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._namespaces: dict[str, tuple[Informer, Informer]] = {}  # ns -> (pods, workloads)
        # (namespace, group) -> pod name -> pod: each group's pods without scanning them all
        self._pods_by_group: dict[tuple[str, str], dict[str, Obj]] = {}

    # -- ClusterBackend ----------------------------------------------------------------------

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Create the Secret, the Service and the pods; return at once (Kueue queues them).

        Every bad input raises before anything is created; if creation fails half-way, what
        was created is deleted again."""
        for group in self._groups.values():
            if group.ref.kernel_id == spec.kernel_id and not group.released:
                if group.status.phase not in _TERMINAL:
                    return group.ref
                await self._release_group(group)
        api = await self._client()
        namespace = spec.namespace or self.namespace
        spec = replace(spec, namespace=namespace)
        await self._check_queue(api, spec)
        await self._watch_namespace(namespace)
        launch = self._launches.get(spec.kernel_id, 0)
        self._launches[spec.kernel_id] = launch + 1
        name = names.group_name(spec.kernel_id, launch)
        created: list[tuple[kueue.Kind, str]] = []
        try:
            address = await self._ensure_address(api, spec, created)
            for pod in manifests.pods(
                spec, name, 0, kernel_env=dict(spec.env), checkpoint_claim=_claim(spec)
            ):
                made = await api.create(kueue.PODS, namespace, pod)
                created.append((kueue.PODS, made["metadata"]["name"]))
                if not kueue.is_gated(made):
                    raise errors.ConfigError(
                        f"kernel {short_id(spec.kernel_id)}: namespace {namespace!r} is not "
                        "managed by Kueue (its pod was created without Kueue's admission "
                        "gate, so it would run unqueued); nothing was left behind. Use a "
                        "namespace Kueue manages (managedJobsNamespaceSelector) or set "
                        "`namespace` in the kernelspec."
                    )
        except BaseException:
            for kind, obj_name in reversed(created):
                with contextlib.suppress(errors.ClusterApiError):
                    await api.delete(kind, namespace, obj_name, grace_seconds=0)
            raise
        ports = manifests.KERNEL_PORTS
        connection = replace(
            spec.connection,
            ip=address,
            shell_port=ports["shell"],
            iopub_port=ports["iopub"],
            stdin_port=ports["stdin"],
            control_port=ports["control"],
            hb_port=ports["hb"],
        )
        ref = GroupRef(self.name, name, spec.kernel_id, connection, namespace=namespace)
        self._groups[name] = _Group(ref=ref, queue=spec.queue, spec=spec)
        self.log.info(
            "kernel %s submitted as pod group %s in %s/%s needing %s",
            short_id(spec.kernel_id),
            name,
            namespace,
            spec.queue,
            spec.needs(),
        )
        self._refresh(name)
        return ref

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """Yield the current status, then each change, until the group ends.

        A ref this backend does not know (a restarted server) is adopted from the cluster."""
        group = self._groups.get(ref.name)
        if group is None:
            group = await self._adopt(ref)
        async for status in feed.follow(group):
            yield status

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """End the pod group (the Service and the Secret stay for a later launch).

        An in-place restart never gets here unless the kernel ignored its `shutdown_request`
        (the launcher restarts a kernel that exits to restart): then the group ends too, and the
        next launch queues a new one."""
        group = self._groups.get(ref.name)
        if group is not None:
            await self._release_group(group, grace=0 if cause is StopCause.KILL else grace)

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Pods cannot be signalled through the API; kernelspecs use message-mode interrupts."""
        self.log.debug(
            "kernel %s: signal %d not sent (pods take no signals)", ref.kernel_id, signum
        )

    async def release(self, ref: GroupRef) -> None:
        """Delete the Workload (Kueue then removes the pods and their finalizers), any pods
        left without one, the Service and the Secret."""
        group = self._groups.get(ref.name) or _Group(ref=ref, queue="")
        await self._release_group(group)
        api = await self._client()
        namespace = ref.namespace or self.namespace
        await api.delete(kueue.SERVICES, namespace, names.service_name(ref.kernel_id))
        await api.delete(kueue.SECRETS, namespace, names.secret_name(ref.kernel_id))
        self._launches.pop(ref.kernel_id, None)

    async def aclose(self) -> None:
        """Stop the informers, the position readers and the API client."""
        for task in self._positions.values():
            task.cancel()
        self._positions.clear()
        await self._informers.aclose()
        if self._api is not None:
            await self._api.aclose()
            self._api = None

    # -- submission ------------------------------------------------------------------------

    async def _client(self) -> KubeApi:
        """The API client, connected on first use; `namespace` is resolved then too, so that
        its default (a file of the pod's service account) is read off the event loop."""
        async with self._api_lock:
            if self._api is None:
                from kernel_queue.kube.api import KubernetesApi

                if not self.trait_has_value("namespace"):
                    self.namespace = await asyncio.to_thread(_own_namespace)
                self._api = await KubernetesApi.connect(self.kubeconfig, self.context)
            return self._api

    async def _check_queue(self, api: KubeApi, spec: GroupSpec) -> None:
        """Kueue installed, the LocalQueue there, the priority class and the checkpoint claim
        known: else say which."""
        from kernel_queue.kube.api import NotFound  # loaded with the client

        who, namespace = f"kernel {short_id(spec.kernel_id)}", spec.namespace
        try:
            await api.get(kueue.LOCAL_QUEUES, namespace, spec.queue)
        except errors.ClusterNotFound as exc:
            # A missing LocalQueue is named in the Status; a path not served names nothing.
            if not (isinstance(exc, NotFound) and exc.details.get("name")):
                raise errors.KueueNotInstalled(
                    f"{who}: the cluster serves no Kueue API ({exc.message}); install Kueue "
                    "(its CRDs and controller) or use backend 'local'"
                ) from exc
            known, _ = await api.list(kueue.LOCAL_QUEUES, namespace)
            listed = ", ".join(sorted(q["metadata"]["name"] for q in known)) or "none"
            raise errors.QueueNotFound(
                f"{who}: LocalQueue {spec.queue!r} does not exist in namespace {namespace!r}; "
                f"LocalQueues there: {listed}. Set `queue` in the kernelspec to one of them, or "
                "create it (see etc/kubernetes/queues.yaml)."
            ) from exc
        if spec.priority_class:
            try:
                await api.get(kueue.WORKLOAD_PRIORITY_CLASSES, None, spec.priority_class)
            except errors.ClusterNotFound as exc:
                raise errors.PriorityClassNotFound(
                    f"{who}: WorkloadPriorityClass {spec.priority_class!r} does not exist, so "
                    "Kueue would never queue the kernel; fix `priority_class` in the "
                    "kernelspec or create the class."
                ) from exc
        claim = _claim(spec)
        if claim:
            try:
                await api.get(kueue.CLAIMS, namespace, claim)
            except errors.ClusterNotFound as exc:
                raise errors.ConfigError(
                    f"{who}: checkpoint claim {claim!r} does not exist in namespace "
                    f"{namespace!r}, so the kernel's pod could never start; create the "
                    "PersistentVolumeClaim (ReadWriteMany, so a requeued kernel can mount it on "
                    "any node) or fix `checkpoint.claim` in the kernelspec."
                ) from exc

    async def _ensure_address(
        self, api: KubeApi, spec: GroupSpec, created: list[tuple[kueue.Kind, str]]
    ) -> str:
        """The Secret and the Service (made once per kernel); the address clients connect to."""
        namespace = spec.namespace
        try:
            await api.create(kueue.SECRETS, namespace, manifests.secret(spec))
            created.append((kueue.SECRETS, names.secret_name(spec.kernel_id)))
        except errors.ClusterConflict:
            pass  # a relaunch of the same kernel keeps its key
        try:
            service = await api.create(kueue.SERVICES, namespace, manifests.service(spec))
            created.append((kueue.SERVICES, names.service_name(spec.kernel_id)))
        except errors.ClusterConflict:
            service = await api.get(kueue.SERVICES, namespace, names.service_name(spec.kernel_id))
        if spec.connect == "pod-ip":
            return ""  # known once the head pod runs
        address = (service.get("spec") or {}).get("clusterIP")
        if not address or address == "None":
            raise errors.LaunchFailed(
                f"kernel {short_id(spec.kernel_id)}: Service {service['metadata']['name']} got "
                'no cluster IP; check the cluster\'s Service CIDR, or set "connect": "pod-ip"'
            )
        return str(address)

    async def _watch_namespace(self, namespace: str) -> None:
        """One pod informer and one Workload informer per namespace, for every kernel."""
        if namespace in self._namespaces:
            return
        api = await self._client()
        pods = await self._informers.get(api, kueue.PODS, namespace, _POD_SELECTOR)
        workloads = await self._informers.get(api, kueue.WORKLOADS, namespace)
        if namespace not in self._namespaces:
            self._namespaces[namespace] = (pods, workloads)
            for pod in pods.items():
                self._index(pod, deleted=False)
            pods.add_handler(self._on_pod)
            workloads.add_handler(self._on_workload)

    async def _adopt(self, ref: GroupRef) -> _Group:
        await self._client()  # resolves `namespace`
        namespace = ref.namespace or self.namespace
        await self._watch_namespace(namespace)
        group = _Group(ref=ref, queue="", was_running=True, had_workload=True)
        self._groups[ref.name] = group
        pods = self._group_pods(namespace, ref.name)
        if pods:
            labels = pods[0]["metadata"].get("labels", {})
            group.queue = labels.get(kueue.QUEUE_NAME_LABEL, "")
            group.was_running = any(kueue.pod_ready(p) for p in pods)
        self._refresh(ref.name)
        return group

    # -- status --------------------------------------------------------------------------

    def _on_pod(self, event: str, pod: Obj, old: Obj | None) -> None:
        name = self._index(pod, deleted=event == "DELETED")
        if name in self._groups:
            self._refresh(name)

    def _index(self, pod: Obj, *, deleted: bool) -> str:
        """Keep `_pods_by_group` current; return the pod's group name."""
        meta = pod["metadata"]
        name = meta.get("labels", {}).get(kueue.POD_GROUP_NAME_LABEL, "")
        key = (meta.get("namespace", ""), name)
        if deleted:
            self._pods_by_group.get(key, {}).pop(meta["name"], None)
            if not self._pods_by_group.get(key, True):
                del self._pods_by_group[key]
        else:
            self._pods_by_group.setdefault(key, {})[meta["name"]] = pod
        return str(name)

    def _on_workload(self, event: str, workload: Obj, old: Obj | None) -> None:
        if workload["metadata"]["name"] in self._groups:
            self._refresh(workload["metadata"]["name"])

    def _group_pods(self, namespace: str, name: str) -> list[Obj]:
        return list(self._pods_by_group.get((namespace, name), {}).values())

    def _refresh(self, name: str) -> None:
        """Recompute one group's status from the informers' caches and act on it."""
        group = self._groups.get(name)
        if group is None or group.released:
            return
        namespace = group.ref.namespace or self.namespace
        informers = self._namespaces.get(namespace)
        workload = informers[1].get(name) if informers else None
        pods = self._group_pods(namespace, name)
        pod_ip = group.spec is not None and group.spec.connect == "pod-ip"
        group.saved = group_status.saved_message(workload, pods) or group.saved
        status = group_status.group_status(
            workload,
            pods,
            place=group.place,
            was_running=group.was_running,
            had_workload=group.had_workload,
            pod_ip_address=pod_ip,
            saved=group.saved,
        )
        group.had_workload = group.had_workload or workload is not None
        if status.phase is GroupPhase.RUNNING:
            group.was_running, group.saved = True, ""
        if group_status.needs_replacement(workload, pods) and not group.replacing:
            group.replacing = True
            asyncio.get_running_loop().create_task(self._replace(group, pods))
        if status.phase is GroupPhase.QUEUED:
            self._follow_positions(namespace, group.queue)
        if status.phase is GroupPhase.FAILED:
            # Published once, by the task that adds the pod's last log lines to the message.
            if not group.failure_logged:
                group.failure_logged = True
                asyncio.get_running_loop().create_task(self._fail_with_logs(group, pods, status))
            return
        feed.publish(group, status)

    async def _fail_with_logs(self, group: _Group, pods: list[Obj], status: GroupStatus) -> None:
        """A pod that failed before it was ready: its last log lines make the error."""
        lead = group_status.head(pods)
        tail = ""
        if lead is not None:
            api = await self._client()
            with contextlib.suppress(errors.ClusterApiError):
                text = await api.read_log(
                    lead["metadata"]["namespace"],
                    lead["metadata"]["name"],
                    container="kernel",
                    tail_lines=_LOG_LINES,
                )
                if text.strip():
                    tail = f"; its last log lines:\n{text.rstrip()}"
        feed.publish(group, status.evolve(message=status.message + tail))

    async def _replace(self, group: _Group, pods: list[Obj]) -> None:
        """Replacement pods after an eviction: the same shape, so Kueue keeps the Workload."""
        try:
            api = await self._client()
            group.attempt += 1
            namespace = group.ref.namespace or self.namespace
            if group.spec is not None:
                spec = group.spec
                fresh = manifests.pods(
                    spec,
                    group.ref.name,
                    group.attempt,
                    kernel_env=spec.env,
                    checkpoint_claim=_claim(spec),
                )
            else:  # adopted after a server restart: copy the pods Kueue last saw
                fresh = [_replacement(old, group.attempt) for old in _latest_round(pods)]
            for pod in fresh:
                if group.released:
                    return  # released meanwhile (a failed kernel, a shutdown): make nothing
                with contextlib.suppress(errors.ClusterConflict):
                    await api.create(kueue.PODS, namespace, pod)
                if group.released:  # released while this one was created: it is not listed
                    await api.delete(
                        kueue.PODS, namespace, pod["metadata"]["name"], grace_seconds=0
                    )
                    return
            self.log.info(
                "kernel %s: replacement pods created for group %s (round %d)",
                short_id(group.ref.kernel_id),
                group.ref.name,
                group.attempt,
            )
        except errors.ClusterApiError as exc:
            self.log.error("kernel %s: replacement pods failed: %s", group.ref.kernel_id, exc)
            feed.publish(group, GroupStatus(GroupPhase.FAILED, message=str(exc)))
        finally:
            group.replacing = False

    # -- queue positions -------------------------------------------------------------------

    def _follow_positions(self, namespace: str, queue: str) -> None:
        key = (namespace, queue)
        task = self._positions.get(key)
        if queue and (task is None or task.done()):
            self._positions[key] = asyncio.get_running_loop().create_task(
                self._read_positions(namespace, queue)
            )

    async def _read_positions(self, namespace: str, queue: str) -> None:
        """Read the LocalQueue's pending Workloads while any of our kernels waits there."""
        try:
            await self._position_loop(namespace, queue)
        except Exception:
            self.log.exception("reading queue positions of %s/%s failed", namespace, queue)
            raise

    async def _position_loop(self, namespace: str, queue: str) -> None:
        api = await self._client()
        path = kueue.pending_workloads_path(namespace, queue)
        while True:
            waiting = [
                g
                for g in self._groups.values()
                if g.queue == queue
                and (g.ref.namespace or self.namespace) == namespace
                and g.status.phase in (GroupPhase.QUEUED, GroupPhase.PENDING)
                and not g.released
            ]
            if not waiting:
                return
            places = await self._places(api, path, namespace, queue)
            for group in waiting:
                group.place = places.get(group.ref.name, places.get(""))
                self._refresh(group.ref.name)
            await asyncio.sleep(self.position_interval)

    async def _places(
        self, api: KubeApi, path: str, namespace: str, queue: str
    ) -> dict[str, QueuePlace]:
        """Workload name -> place, from the visibility API; if that is unavailable, the
        LocalQueue's pending count for every kernel (key "")."""
        try:
            summary = await api.get_path(path)
        except errors.ClusterApiError as exc:
            self.log.warning("queue positions of %s/%s unavailable: %s", namespace, queue, exc)
            try:
                local_queue = await api.get(kueue.LOCAL_QUEUES, namespace, queue)
            except errors.ClusterApiError:
                return {}
            count = int((local_queue.get("status") or {}).get("pendingWorkloads") or 0)
            return {"": QueuePlace(queue, 0, count)} if count else {}
        items = summary.get("items") or []
        return {
            item["metadata"]["name"]: QueuePlace(
                queue, int(item.get("positionInLocalQueue", index)) + 1, len(items)
            )
            for index, item in enumerate(items)
        }

    # -- release ---------------------------------------------------------------------------

    async def _release_group(self, group: _Group, *, grace: float | None = None) -> None:
        """Delete the Workload and any pods of the group; forget it."""
        if group.released:
            return
        group.released = True
        api = await self._client()
        namespace = group.ref.namespace or self.namespace
        await api.delete(kueue.WORKLOADS, namespace, group.ref.name)
        for pod in self._group_pods(namespace, group.ref.name):
            seconds = None if grace is None else int(grace)
            await api.delete(kueue.PODS, namespace, pod["metadata"]["name"], grace_seconds=seconds)
        self._groups.pop(group.ref.name, None)
        final = GroupStatus(GroupPhase.FINISHED, message="the pod group was deleted", exit_code=0)
        feed.publish(group, final)


def _claim(spec: GroupSpec) -> str | None:
    return spec.checkpoint.claim if spec.checkpoint.enabled else None


def _latest_round(pods: list[Obj]) -> list[Obj]:
    """The pods of the newest replacement round (one per role and index)."""
    newest: dict[str, Obj] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
        role = pod["metadata"]["name"].rsplit("-", 1)[0]
        newest[role] = pod
    return list(newest.values())


def _replacement(old: Obj, attempt: int) -> Obj:
    """A new pod with `old`'s spec and labels (Kueue's role hash is unchanged), a new name, and
    none of what the API server, Kueue or the kubelet added."""
    meta = old["metadata"]
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if k not in (kueue.PODSET_LABEL, kueue.LOCAL_QUEUE_LABEL, kueue.CLUSTER_QUEUE_LABEL)
        and k != kueue.MANAGED_LABEL
    }
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != kueue.ROLE_HASH_ANNOTATION
    }
    spec = {k: v for k, v in old["spec"].items() if k not in ("nodeName", "schedulingGates")}
    base = meta["name"].rsplit("-", 1)[0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{base}-{attempt}", "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def _own_namespace() -> str:
    """$KERNEL_QUEUE_NAMESPACE, else the namespace of the pod the server runs in, else default."""
    if os.environ.get("KERNEL_QUEUE_NAMESPACE"):
        return os.environ["KERNEL_QUEUE_NAMESPACE"]
    try:
        with open(_SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or "default"
    except OSError:
        return "default"
