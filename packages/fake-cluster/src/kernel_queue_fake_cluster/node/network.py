"""Services on the node: the job of kube-proxy, over loopback addresses.

`ServiceNetwork` listens on each Service's ClusterIP (the API server allocates it; on a plane
whose service range is loopback, 127.20.0.0/16, the agent can listen there) and forwards TCP
from clusterIP:port to a ready pod's podIP:targetPort, so a replaced pod is reached at the same
address. It reads Services and pods from the agent's informers; it runs on the agent's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernel_queue_fake_cluster.common import selectors
from kernel_queue_fake_cluster.common.objects import Obj
from kernel_queue_fake_cluster.common.pods import pod_ready, target_port, terminal

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


class Objects(Protocol):
    """Where the network reads Services or pods: an informer."""

    def get(self, namespace: str | None, name: str) -> Obj | None: ...

    def objects(self) -> Iterator[Obj]: ...


class ServiceNetwork:
    """TCP forwarding for every Service the agent sees whose ClusterIP is a loopback address.

    A connection to clusterIP:port goes to a ready endpoint (round robin; with
    `publishNotReadyAddresses`, every pod with an IP that has not terminated, as kube-proxy
    reads its EndpointSlices); with none it is held up to `hold_seconds` for one, then closed.
    An endpoint that refuses closes the connection at once, as kube-proxy's NAT lets the client
    meet the refusal (a ZeroMQ client reconnects). Forwarded connections close when their pod
    is removed or terminates. Headless (`clusterIP: None`) and ExternalName Services, and
    ClusterIPs outside 127.0.0.0/8, get no listener; UDP ports are not forwarded. Feed it the
    informers' events (`on_service`, `on_pod`).
    """

    def __init__(
        self,
        services: Objects,
        pods: Objects,
        *,
        hold_seconds: float = 30.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.services, self.pods = services, pods
        self.hold_seconds, self.connect_timeout = hold_seconds, connect_timeout
        self._services: dict[tuple[str, str], _Service] = {}
        self._links: dict[str, set[_Link]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()  # every forwarded stream, both ends
        self._changed = asyncio.Event()
        self._closed = False

    def address(self, namespace: str, name: str) -> str | None:
        """The ClusterIP a Service listens on, once its listeners are being set up."""
        state = self._services.get((namespace, name))
        return state.ip if state else None

    def listening(self, namespace: str, name: str) -> list[int]:
        """Service ports with a bound listener."""
        state = self._services.get((namespace, name))
        return sorted(state.servers) if state else []

    def ready_backends(self, namespace: str, name: str, port: int) -> list[tuple[str, str, int]]:
        """(pod uid, pod IP, target port) of the Service's ready endpoints for `port` (with
        `publishNotReadyAddresses`: of each pod with an IP that has not terminated)."""
        service = self.services.get(namespace, name)
        if service is None:
            return []
        entry = next((p for p in service["spec"].get("ports") or [] if p["port"] == port), None)
        selector = service["spec"].get("selector")
        if entry is None or not selector:
            return []
        match = selectors.selector_dict({"matchLabels": selector})
        serving = _published if service["spec"].get("publishNotReadyAddresses") else pod_ready
        found = []
        for pod in self.pods.objects():
            if pod["metadata"].get("namespace") == namespace and match(pod) and serving(pod):
                target = target_port(entry, pod)
                if target is not None:
                    found.append((pod["metadata"]["uid"], pod["status"]["podIP"], target))
        return sorted(found, key=lambda b: b[1])

    async def aclose(self) -> None:
        """Close every listener and forwarded connection; stop reacting to the informers."""
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

    # -- listeners -------------------------------------------------------------------------

    def on_service(self, kind: str, service: Obj) -> None:
        """A Service changed (an informer's handler)."""
        if self._closed:
            return
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        state = self._services.get(key)
        if kind == "DELETED":
            if state is not None and state.uid == meta["uid"]:
                self._services.pop(key)
                self._spawn(self._stop(state))
            return
        ip = service.get("spec", {}).get("clusterIP")
        if state is not None and (state.uid != meta["uid"] or state.ip != ip):  # replaced
            self._services.pop(key)
            self._spawn(self._stop(state))
            state = None
        if state is None and _loopback(ip):
            state = self._services[key] = _Service(meta["uid"], str(ip))
        if state is not None:
            self._spawn(self._sync(key, state))

    def on_pod(self, kind: str, pod: Obj) -> None:
        """A pod changed (an informer's handler)."""
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
            service = self.services.get(*key)
            ports = {
                int(p["port"])
                for p in ((service or {}).get("spec") or {}).get("ports") or []
                if p.get("protocol", "TCP") == "TCP"
            }
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
        except asyncio.CancelledError:
            pass  # `aclose`: end quietly (asyncio logs a connection handler that was cancelled)
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
                return None  # every endpoint refused: the client meets it, as through NAT
            remaining = deadline - loop.time()
            if remaining <= 0 or state is None:
                return None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 1.0)):
                    await changed.wait()
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


def _published(pod: Obj) -> bool:
    """An endpoint of a Service publishing not-ready addresses: an IP, not terminated (being
    deleted included)."""
    return bool((pod.get("status") or {}).get("podIP")) and not terminal(pod)


def _loopback(ip: Any) -> bool:
    """Whether `ip` is an address this machine's `lo` answers (127.0.0.0/8)."""
    try:
        return ipaddress.ip_address(str(ip)).is_loopback
    except ValueError:
        return False
