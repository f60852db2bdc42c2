"""`FakeCluster`: the fake API server, Kueue and kubelet wired together, in a loop or a thread.

This is the test kit's face: start it, point a Kubernetes client at `url` or `kubeconfig`, set
up queues, inject faults, read `stats`. Everything it owns (store, controllers, HTTP server)
runs on one event loop; from another thread use `call()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kernel_queue_fake_cluster.apiserver import addresses, pod_rules, pod_security, rbac, resources
from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import Server, Stats
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import visibility
from kernel_queue_fake_cluster.kueue.controller import FakeKueue
from kernel_queue_fake_cluster.node.kubelet import FakeKubelet

T = TypeVar("T")
KUEUE_GROUP = "kueue.x-k8s.io"
SERVICE_IP_POOL = "127.20.0.0/16"


class FakeCluster:
    """A Kubernetes API server with Kueue and a kubelet, on 127.0.0.1, for tests and demos.

    `crds`: Kueue's CRDs, a directory of CRD YAML files or one multi-document YAML such as
    Kueue's release manifests.yaml; None: the path in $KERNEL_QUEUE_FAKE_CLUSTER_CRDS; False:
    no custom kinds (then `kueue=False`). They are read here, so a missing source raises
    `CrdsNotFound` (`apiserver/crds.py`) at once, saying how to give one. `kueue` and
    `kubelet`: run those controllers. `manual_admission`: Kueue admits only on `kueue.admit()`.
    `tokens`: bearer token → user name, which turns RBAC on with `rbac_objects` as policy.
    `image_paths`: image (fnmatch pattern) → directory put first on a container's PATH, so
    pods of that image run another virtualenv's `python` (see `FakeKubelet`).
    """

    def __init__(
        self,
        *,
        root_dir: str | Path | None = None,
        crds: crd_files.Source = None,
        kueue: bool = True,
        kubelet: bool = True,
        manual_admission: bool = False,
        tokens: Mapping[str, str | rbac.User] | None = None,
        rbac_objects: Iterable[Obj] = (),
        history: int = 1000,
        port: int = 0,
        image_paths: Mapping[str, str] | None = None,
    ) -> None:
        if crds is False and kueue:
            raise ValueError("the fake Kueue needs Kueue's CRDs: with crds=False pass kueue=False")
        self._crds = crd_files.load(crds)
        self._own_root = root_dir is None
        self.root = Path(root_dir or tempfile.mkdtemp(prefix="kernel-queue-fake-cluster-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = Store(history=history)
        self._tokens = dict(tokens) if tokens is not None else None
        self.server = Server(self.store, tokens=tokens, rbac_objects=rbac_objects, port=port)
        self.kueue = FakeKueue(self.store, manual=manual_admission) if kueue else None
        self.kubelet = (
            FakeKubelet(self.store, self.root / "node", image_paths=image_paths)
            if kubelet
            else None
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> FakeCluster:
        """Start in the running loop and return once the server listens."""
        self.loop = asyncio.get_running_loop()
        resources.install(self.store, crds=self._crds)
        if self.kueue is not None:
            self.kueue.install()
            visibility.serve(
                self.server, self.kueue.local_queue_pending, self.kueue.cluster_queue_pending
            )
        pod_rules.install(self.store)  # the apiserver's own pod rules, with or without a kubelet
        pod_security.install(self.store)  # ServiceAccount and Pod Security admission, last
        if self.kubelet is None:  # the apiserver allocates ClusterIPs even with no node
            addresses.ClusterIPs(self.store, SERVICE_IP_POOL).install()
        if self.kubelet is not None:
            self.kubelet.install()
            self.server.serve_logs(self.kubelet.logs)
        await self.server.start()
        self._write_kubeconfig()
        return self

    async def stop(self) -> None:
        """Stop every process, stream and listener; remove the cluster directory if it made it."""
        if self.kubelet is not None:
            await self.kubelet.aclose()
        await self.server.stop()
        self.store.close_watches()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    async def __aenter__(self) -> FakeCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> FakeCluster:
        """Start on a loop of its own in a daemon thread (for synchronous callers)."""
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                ready.set_exception(exc)
                loop.close()
                return
            ready.set_result(None)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="fake-cluster", daemon=True)
        self._thread.start()
        ready.result(timeout=60)
        return self

    def stop_in_thread(self) -> None:
        """Stop a cluster started with `start_in_thread` and join its thread."""
        if self._thread is None or self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the cluster's loop and return its result (thread-safe).

        Coroutine functions are awaited there. On the loop itself, calls `fn` directly.
        """
        if self.loop is None:
            raise RuntimeError("the fake cluster is not started")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return fn(*args, **kwargs)

        async def run() -> T:
            result = fn(*args, **kwargs)
            if asyncio.iscoroutine(result):
                return await result  # type: ignore[no-any-return]
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=60)

    # -- what clients need -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The API server's base URL."""
        return self.server.url

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig file for this cluster (context `fake`, namespace `default`)."""
        return self.root / "kubeconfig"

    def kubeconfig_for(self, token: str, *, namespace: str = "default", name: str = "") -> Path:
        """A kubeconfig that authenticates with `token` (RBAC clusters)."""
        path = self.root / (name or f"kubeconfig-{abs(hash(token)) % 10**8}")
        path.write_text(yaml.safe_dump(self._config(token, namespace)))
        return path

    def _write_kubeconfig(self) -> None:
        admin = next(iter(self._tokens or {}), None)
        self.kubeconfig.write_text(yaml.safe_dump(self._config(admin, "default")))

    def _config(self, token: str | None, namespace: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-user", "user": {"token": token} if token else {}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake-user", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }

    # -- faults and stats --------------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """Requests per (verb, resource), open/peak watch streams, the most requests at once."""
        return self.server.stats

    def fail_next(
        self,
        verb: str,
        plural: str,
        status: int = 500,
        count: int = 1,
        *,
        retry_after: int | None = None,
        after: bool = False,
    ) -> None:
        """Answer the next `count` `verb` requests on `plural` with an error `status`. A 429
        carries `Retry-After: 1` unless `retry_after` says otherwise (as the apiserver's
        priority and fairness does); `after`: serve the request, then answer the error."""
        if status == 429 and retry_after is None:
            retry_after = 1
        self.server.fail_next(verb, plural, status, count, retry_after=retry_after, after=after)

    def plant_next(
        self, plural: str, labels: Mapping[str, str] | None = None, count: int = 1
    ) -> None:
        """The next `count` creates on `plural` meet an object of their name that someone else
        made (carrying only `labels`): a real 409 AlreadyExists, and the object stays."""
        self.server.plant_next(plural, labels, count)

    @property
    def faults_pending(self) -> int:
        """Injected faults no request has met yet."""
        return self.server.faults.pending()

    def clear_faults(self) -> None:
        """Forget the injected faults no request has met."""
        self.server.faults.clear()

    def drop_watches(self) -> None:
        """End every open watch stream now."""
        self.server.drop_watches()

    def expire_next_watch(self, count: int = 1) -> None:
        """The next `count` watches get 410 Expired."""
        self.server.expire_next_watch(count)

    @property
    def latency(self) -> float:
        """Seconds added to every request."""
        return self.server.latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self.server.latency = seconds

    # -- set-up helpers (run on the cluster's loop; use `call` from other threads) ----------

    def apply(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        """Create each object of a YAML text or dicts, replacing one that exists (as kubectl
        apply would, without server-side apply). Returns the stored objects."""
        docs = yaml.safe_load_all(manifests) if isinstance(manifests, str) else manifests
        stored = []
        for doc in docs:
            if not doc:
                continue
            group, _, _ = doc["apiVersion"].rpartition("/")
            plural = self._plural(group, doc["kind"])
            meta = doc.get("metadata") or {}
            namespace = meta.get("namespace") or (
                "default" if self._namespaced(group, plural) else None
            )
            try:
                stored.append(self.store.create(group, plural, namespace, doc))
            except ApiError as exc:
                if exc.code != 409:
                    raise
                stored.append(self.store.replace(group, plural, namespace, meta["name"], doc))
        return stored

    def setup_queues(
        self,
        *,
        namespace: str = "default",
        local_queue: str = "user-queue",
        cluster_queue: str = "cluster-queue",
        flavor: str = "default-flavor",
        quota: Mapping[str, str | int] | None = None,
        preemption: str = "LowerPriority",
        strategy: str = "BestEffortFIFO",
        priority_classes: Mapping[str, int] | None = None,
    ) -> None:
        """A ResourceFlavor, a ClusterQueue with `quota` (default 9 CPU, 36Gi, 2 GPUs), a
        LocalQueue in `namespace`, and WorkloadPriorityClasses (name → value)."""
        quota = dict(quota or {"cpu": 9, "memory": "36Gi", "nvidia.com/gpu": 2})
        objects: list[Obj] = [
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
            },
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {},
                    "queueingStrategy": strategy,
                    "preemption": {"withinClusterQueue": preemption},
                    "resourceGroups": [
                        {
                            "coveredResources": list(quota),
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [
                                        {"name": name, "nominalQuota": amount}
                                        for name, amount in quota.items()
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": local_queue, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ]
        for name, value in (priority_classes or {}).items():
            objects.append(
                {
                    "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                }
            )
        if namespace != "default":
            try:
                self.store.create("", "namespaces", None, {"metadata": {"name": namespace}})
            except ApiError as exc:
                if exc.code != 409:
                    raise
        self.apply(objects)

    def _plural(self, group: str, kind: str) -> str:
        for rtype in self.store.types.values():
            if rtype.group == group and rtype.kind == kind:
                return rtype.plural
        raise ApiError(404, "NotFound", f"no kind {kind!r} in group {group!r} is served")

    def _namespaced(self, group: str, plural: str) -> bool:
        return self.store.type(group, plural).namespaced
