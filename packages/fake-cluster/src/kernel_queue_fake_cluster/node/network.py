"""Services on the fake node: the job of kube-proxy, over loopback addresses.

`ServiceNetwork` has the apiserver allocate each Service's ClusterIP (`addresses.ClusterIPs`),
keeps its `Endpoints` in step (`endpoints`), and forwards TCP from clusterIP:port to a ready
pod, so a replaced pod is reached at the same address. It runs on the store's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from kernel_queue_fake_cluster.apiserver.addresses import ClusterIPs
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common import selectors
from kernel_queue_fake_cluster.common.pods import pod_ready, target_port

log = logging.getLogger(__name__)


@dataclass
class _Service:
    uid: str
    ip: str
    servers: dict[int, asyncio.Server] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    turn: int = 0


@dataclass(eq=False)
class _Link:
    """One forwarded connection: the client's stream and the pod's."""

    pod_uid: str
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class ServiceNetwork:
    """ClusterIP allocation, Endpoints and TCP forwarding for every Service of one store.

    A connection to clusterIP:port goes to a ready endpoint (round robin); with none ready it is
    held up to `hold_seconds` for one, then closed. Forwarded connections close when their pod
    is removed or terminates. Headless (`clusterIP: None`) and ExternalName Services get no
    address and no listener; UDP ports are not forwarded.
    """

    def __init__(
        self,
        store: Store,
        *,
        pool: str = "127.20.0.0/16",
        hold_seconds: float = 30.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.store, self.cluster_ips = store, ClusterIPs(store, pool)
        self.pool = self.cluster_ips.pool
        self.hold_seconds, self.connect_timeout = hold_seconds, connect_timeout
        self._services: dict[tuple[str, str], _Service] = {}
        self._links: dict[str, set[_Link]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()  # every forwarded stream, both ends
        self._changed = asyncio.Event()
        self._closed = False

    def install(self) -> None:
        """Hook into the store: Service admission (ClusterIPs), Service and pod listeners."""
        self.cluster_ips.install()
        self.store.add_listener("", "services", self._on_service)
        self.store.add_listener("", "pods", self._on_pod)
        for service in list(self.store.objects("", "services")):
            self._on_service("ADDED", service)

    def address(self, namespace: str, name: str) -> str | None:
        """The ClusterIP a Service listens on, once its listeners are being set up."""
        state = self._services.get((namespace, name))
        return state.ip if state else None

    def listening(self, namespace: str, name: str) -> list[int]:
        """Service ports with a bound listener."""
        state = self._services.get((namespace, name))
        return sorted(state.servers) if state else []

    def ready_backends(self, namespace: str, name: str, port: int) -> list[tuple[str, str, int]]:
        """(pod uid, pod IP, target port) of the Service's ready endpoints for `port`."""
        try:
            service = self.store.get("", "services", namespace, name)
        except ApiError:
            return []
        entry = next((p for p in service["spec"].get("ports") or [] if p["port"] == port), None)
        selector = service["spec"].get("selector")
        if entry is None or not selector:
            return []
        match = selectors.selector_dict({"matchLabels": selector})
        found = []
        for pod in self.store.objects("", "pods"):
            if pod["metadata"].get("namespace") == namespace and match(pod) and pod_ready(pod):
                target = target_port(entry, pod)
                if target is not None:
                    found.append((pod["metadata"]["uid"], pod["status"]["podIP"], target))
        return sorted(found, key=lambda b: b[1])

    async def aclose(self) -> None:
        """Close every listener and forwarded connection; stop reacting to the store."""
        self._closed = True
        for state in self._services.values():
            for server in state.servers.values():
                server.close()
        writers, tasks = list(self._writers), list(self._tasks)
        for writer in writers:
            writer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        self._writers.clear()
        for state in self._services.values():
            for server in state.servers.values():
                await server.wait_closed()
            state.servers.clear()
        self._services.clear()
        for key in self.pool.holders():
            self.pool.release(key)

    # -- listeners -------------------------------------------------------------------------

    def _on_service(self, kind: str, service: Obj) -> None:
        if self._closed:
            return
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        state = self._services.get(key)
        if kind == "DELETED":
            if state is not None and state.uid == meta["uid"]:
                self._services.pop(key)
                self._spawn(self._stop(state))
            if not any(
                (s["metadata"]["namespace"], s["metadata"]["name"]) == key
                for s in self.store.objects("", "services")
            ):
                self.pool.release(f"{key[0]}/{key[1]}")
            return
        ip = service.get("spec", {}).get("clusterIP")
        if state is None and ip and ip != "None":
            state = self._services[key] = _Service(meta["uid"], ip)
        if state is not None:
            self._spawn(self._sync(key, state))

    def _on_pod(self, kind: str, pod: Obj) -> None:
        if self._closed:
            return
        meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
        uid = meta["uid"]
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            for link in self._links.pop(uid, set()):
                link.close()
        self._changed.set()  # wake connections waiting for a ready endpoint
        self._changed = asyncio.Event()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- listeners and forwarding ----------------------------------------------------------

    async def _sync(self, key: tuple[str, str], state: _Service) -> None:
        """Bind one listener per TCP Service port; close those of removed ports."""
        async with state.lock:
            try:
                service = self.store.get("", "services", *key)
                ports = {
                    int(p["port"])
                    for p in service["spec"].get("ports") or []
                    if p.get("protocol", "TCP") == "TCP"
                }
            except ApiError:
                ports = set()
            if self._services.get(key) is not state:
                ports = set()
            for port in set(state.servers) - ports:
                server = state.servers.pop(port)
                server.close()
                await server.wait_closed()
            for port in sorted(ports - set(state.servers)):
                handler = functools.partial(self._accept, key, port)
                try:
                    state.servers[port] = await asyncio.start_server(handler, state.ip, port)
                except OSError as exc:
                    log.warning(
                        "Service %s/%s cannot listen on %s:%s: %s", *key, state.ip, port, exc
                    )

    async def _stop(self, state: _Service) -> None:
        async with state.lock:
            for server in state.servers.values():
                server.close()
                await server.wait_closed()
            state.servers.clear()

    async def _accept(
        self,
        key: tuple[str, str],
        port: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            upstream = await self._connect(key, port)
            if upstream is None:
                return
            uid, (up_reader, up_writer) = upstream
            self._writers.add(up_writer)
            link = _Link(uid, (writer, up_writer))
            self._links.setdefault(uid, set()).add(link)
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                self._links.get(uid, set()).discard(link)
                up_writer.close()
                self._writers.discard(up_writer)
        finally:
            writer.close()
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)

    async def _connect(
        self, key: tuple[str, str], port: int
    ) -> tuple[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None:
        """Open a connection to a ready endpoint, waiting up to `hold_seconds` for one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_seconds
        while not self._closed:
            changed = self._changed
            backends = self.ready_backends(*key, port)
            state = self._services.get(key)
            if state is not None and backends:
                state.turn += 1
                start = state.turn % len(backends)
                for uid, ip, target in backends[start:] + backends[:start]:
                    with contextlib.suppress(OSError, TimeoutError):
                        async with asyncio.timeout(self.connect_timeout):
                            streams = await asyncio.open_connection(ip, target)
                        return uid, streams
            remaining = deadline - loop.time()
            if remaining <= 0 or state is None:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 1.0))
        return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close; an error closes the writer (and so the other pipe)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        writer.close()
