"""`FakeCluster`: the fake API server, Kueue and a node agent wired together, in a loop or a thread.

This is the test kit's face: start it, point a Kubernetes client at `url` or `kubeconfig`, set
up queues, inject faults, read `stats`. Everything it owns (store, controllers, HTTP server)
runs on one event loop (the node agent too, talking to the server over HTTP); from another thread
use `call()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kernel_queue_fake_cluster.apiserver import (
    addresses,
    claim_rules,
    endpoints,
    pod_rules,
    pod_security,
    rbac,
    resources,
)
from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import LogProvider, Server, Stats
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import conversion, releases, visibility
from kernel_queue_fake_cluster.kueue.controller import FakeKueue
from kernel_queue_fake_cluster.node import client as node_client
from kernel_queue_fake_cluster.node.agent import NodeAgent

T = TypeVar("T")
KUEUE_GROUP = "kueue.x-k8s.io"
NODE_NAME = "fake-node"
SERVICE_IP_POOL = "127.20.0.0/16"


class FakeCluster:
    """A Kubernetes API server with Kueue and a kubelet, on 127.0.0.1, for tests and demos.

    `crds`: Kueue's CRDs, a directory of CRD YAML files or one multi-document YAML such as
    Kueue's release manifests.yaml; None: the path in $KERNEL_QUEUE_FAKE_CLUSTER_CRDS; False:
    no custom kinds (then `kueue=False`). They are read here, so a missing source raises
    `CrdsNotFound` (`apiserver/crds.py`) at once, saying how to give one. `kueue`: the Kueue
    release to be, "0.14", "0.19" or "0.20": the versions it serves, its visibility API and its
    reasons (`kueue/releases.py`); the CRDs must be that release's (`CrdsMismatch` otherwise),
    and for "0.20", of which no CRDs are at hand, 0.19's serve with v1beta1 no longer served.
    True: the default "0.19", or "0.14" for CRDs that serve v1beta1 only; False: no Kueue
    controller, the CRDs served as they are.
    `visibility`: serve the visibility API at these versions instead of the release's (as does
    `kueue.visibility.VERSIONS` when a test sets it).
    `kubelet`: run a node agent (`NodeAgent`, as `kubelet`) in this loop, against this server's
    URL over HTTP; it binds pods itself (there is no scheduler) and, with RBAC on, authenticates
    with a token of its own in `system:masters`. `manual_admission`: Kueue admits only on
    `kueue.admit()`.
    `tokens`: bearer token → user name, which turns RBAC on with `rbac_objects` as policy.
    `image_paths`: image (fnmatch pattern) → directory put first on a container's PATH, so
    pods of that image run another virtualenv's `python` (see `NodeAgent`).
    `label_keys_to_copy`: Kueue's `integrations.labelKeysToCopy`, pod labels its Workloads get.
    """

    def __init__(
        self,
        *,
        root_dir: str | Path | None = None,
        crds: crd_files.Source = None,
        kueue: bool | str = True,
        visibility: Sequence[str] | None = None,
        kubelet: bool = True,
        manual_admission: bool = False,
        tokens: Mapping[str, str | rbac.User] | None = None,
        rbac_objects: Iterable[Obj] = (),
        history: int = 1000,
        port: int = 0,
        image_paths: Mapping[str, str] | None = None,
        label_keys_to_copy: Sequence[str] = (),
    ) -> None:
        if crds is False and kueue is not False:
            raise ValueError("the fake Kueue needs Kueue's CRDs: with crds=False pass kueue=False")
        self._crds = crd_files.load(crds)
        self.release = releases.named(kueue, self._crds)
        """The Kueue release this cluster is; None without Kueue."""
        if self.release is not None:
            where = str(crd_files.locate(crds or None))
            self._crds = releases.serve(self.release, self._crds, where)
        self._visibility = tuple(visibility) if visibility is not None else None
        self._own_root = root_dir is None
        self.root = Path(root_dir or tempfile.mkdtemp(prefix="kernel-queue-fake-cluster-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = Store(history=history)
        self._tokens = dict(tokens) if tokens is not None else None
        self._agent_token = secrets.token_hex(16)
        users: dict[str, str | rbac.User] | None = None
        if tokens is not None:
            agent = rbac.User(f"system:node:{NODE_NAME}", ("system:nodes", rbac.SUPERUSER_GROUP))
            users = {**tokens, self._agent_token: agent}
        self.server = Server(
            self.store,
            tokens=users,
            rbac_objects=rbac_objects,
            port=port,
            system_agents=(node_client.USER_AGENT.split("/")[0],),
        )
        self.kueue = (
            FakeKueue(
                self.store,
                manual=manual_admission,
                release=self.release,
                label_keys_to_copy=label_keys_to_copy,
            )
            if self.release is not None
            else None
        )
        self._image_paths = dict(image_paths or {})
        self.kubelet: NodeAgent | None = None
        """The node agent, once started (`kubelet=True`)."""
        self._with_kubelet = kubelet
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> FakeCluster:
        """Start in the running loop and return once the server listens."""
        self.loop = asyncio.get_running_loop()
        resources.install(self.store, crds=self._crds)
        if self.kueue is not None and self.release is not None:
            self.kueue.install()
            versions = next(
                found
                for found in (self._visibility, visibility.VERSIONS, self.release.visibility)
                if found is not None
            )
            pending = self.kueue.local_queue_pending, self.kueue.cluster_queue_pending
            visibility.serve(self.server, *pending, versions=versions)
        pod_rules.install(self.store)  # the apiserver's own pod rules, with or without a kubelet
        claim_rules.install(self.store)  # claims bound at once, or Pending: no volumes here
        endpoints.install(self.store)  # kube-controller-manager's Endpoints controller
        pod_security.install(self.store)  # ServiceAccount and Pod Security admission, last
        addresses.ClusterIPs(self.store, SERVICE_IP_POOL).install()  # the apiserver's
        await self.server.start()
        self._write_kubeconfig()
        if self._with_kubelet:
            token = self._agent_token if self._tokens is not None else None
            agent = NodeAgent(
                node_client.ClientConfig(self.url, token=token),
                self.root / "node",
                node_name=NODE_NAME,
                bind=True,
                image_paths=self._image_paths,
            )
            self.server.serve_logs(_logs_of(agent))
            try:
                self.kubelet = await agent.start()
            except BaseException:
                await agent.aclose()
                await self.server.stop()
                raise
        return self

    async def stop(self) -> None:
        """Stop every process, stream and listener; remove the cluster directory if it made it."""
        if self.kubelet is not None:
            await self.kubelet.aclose()
            self.kubelet = None
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
        """Create each object of a YAML text or dicts at its apiVersion, replacing one that
        exists (as kubectl apply would, without server-side apply); 404 for a version not
        served (see `for_release`). Returns the stored objects."""
        stored = []
        for doc in _documents(manifests):
            group, _, version = doc["apiVersion"].rpartition("/")
            plural = self._plural(group, doc["kind"], version)
            meta = doc.get("metadata") or {}
            namespace = meta.get("namespace") or (
                "default" if self._namespaced(group, plural) else None
            )
            try:
                stored.append(self.store.create(group, plural, namespace, doc, version=version))
            except ApiError as exc:
                if exc.code != 409:
                    raise
                name = meta["name"]
                stored.append(
                    self.store.replace(group, plural, namespace, name, doc, version=version)
                )
        return stored

    def for_release(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        """The objects of a YAML text or dicts, each Kueue object converted to the version
        this cluster's release prefers (kueue.x-k8s.io/v1beta1 on 0.14), for `apply`."""
        if self.release is None:
            return list(_documents(manifests))
        served = f"{KUEUE_GROUP}/{self.release.served[0]}"
        kueue = f"{KUEUE_GROUP}/"
        return [
            conversion.convert(doc, served) if doc["apiVersion"].startswith(kueue) else doc
            for doc in _documents(manifests)
        ]

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

        def kueue(kind: str, meta: Obj, **body: Any) -> Obj:
            return {"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": kind, "metadata": meta, **body}

        resources = [{"name": name, "nominalQuota": amount} for name, amount in quota.items()]
        flavors = [{"name": flavor, "resources": resources}]
        spec = {
            "namespaceSelector": {},
            "queueingStrategy": strategy,
            "preemption": {"withinClusterQueue": preemption},
            "resourceGroups": [{"coveredResources": list(quota), "flavors": flavors}],
        }
        objects = [
            kueue("ResourceFlavor", {"name": flavor}),
            kueue("ClusterQueue", {"name": cluster_queue}, spec=spec),
            kueue(
                "LocalQueue",
                {"name": local_queue, "namespace": namespace},
                spec={"clusterQueue": cluster_queue},
            ),
        ]
        objects += [
            kueue("WorkloadPriorityClass", {"name": name}, value=value)
            for name, value in (priority_classes or {}).items()
        ]
        if namespace != "default":
            try:
                self.store.create("", "namespaces", None, {"metadata": {"name": namespace}})
            except ApiError as exc:
                if exc.code != 409:
                    raise
        self.apply(self.for_release(objects))

    def _plural(self, group: str, kind: str, version: str) -> str:
        for rtype in self.store.types.values():
            if rtype.group == group and rtype.kind == kind and version in rtype.versions:
                return rtype.plural
        api_version = f"{group}/{version}" if group else version
        raise ApiError(404, "NotFound", f'no matches for kind "{kind}" in version "{api_version}"')

    def _namespaced(self, group: str, plural: str) -> bool:
        return self.store.type(group, plural).namespaced


def _logs_of(agent: NodeAgent) -> LogProvider:
    """The agent's `logs`, its errors said as the API server's."""

    def logs(namespace: str, name: str, container: str | None, tail: int | None) -> str:
        try:
            return agent.logs(namespace, name, container, tail)
        except node_client.ApiError as exc:
            raise ApiError(exc.code, exc.reason, exc.message) from None

    return logs


def _documents(manifests: str | Iterable[Obj]) -> Iterable[Obj]:
    docs = yaml.safe_load_all(manifests) if isinstance(manifests, str) else manifests
    return [doc for doc in docs if doc]
