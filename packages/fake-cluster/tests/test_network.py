"""Loopback address pools, the API server's ClusterIPs and Endpoints, and the node agent's Service
forwarding (fed by its informers over HTTP), with pods written straight into the store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import addresses as cluster_addresses
from kernel_queue_fake_cluster.apiserver import endpoints, resources
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import Server
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common import addresses
from kernel_queue_fake_cluster.node import network
from kernel_queue_fake_cluster.node.client import Client, ClientConfig
from kernel_queue_fake_cluster.node.informer import Informer

NS = "default"
POOLS: dict[int, addresses.AddressPool] = {}  # each Service network's ClusterIP pool, by id


def test_a_pool_hands_out_distinct_loopback_addresses_and_keeps_one_per_holder() -> None:
    pool = addresses.AddressPool("127.40.0.0/24")
    first, second = pool.allocate("a"), pool.allocate("b")
    assert first != second
    assert pool.allocate("a") == first
    for address in (first, second):
        assert address.startswith("127.40.0.")
        assert address.rsplit(".", 1)[1] not in ("0", "255")
    pool.release("a")
    assert pool.holders() == ["b"]
    again = addresses.AddressPool("127.40.0.0/24")  # a second cluster in this process
    assert again.allocate("a") not in (second,)
    with pytest.raises(ValueError, match="already allocated"):
        again.reserve("c", second)
    for holder in (pool, again):
        for key in holder.holders():
            holder.release(key)


def test_a_pool_outside_loopback_is_refused_and_a_full_pool_says_so() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/8"):
        addresses.AddressPool("10.0.0.0/24")
    pool = addresses.AddressPool("127.41.0.7/32")
    assert pool.allocate("only") == "127.41.0.7"
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate("more")
    pool.release("only")


@contextlib.asynccontextmanager
async def services(**options: Any) -> AsyncIterator[tuple[Store, network.ServiceNetwork]]:
    """A store with the API server's ClusterIPs (127.42.0.0/16) and Endpoints, served over
    HTTP, and a Service network fed by informers of Services and pods."""
    store = Store()
    resources.install(store, crds=(), namespaces=(NS,))
    cluster_ips = cluster_addresses.ClusterIPs(store, "127.42.0.0/16")
    cluster_ips.install()
    endpoints.install(store)
    server = Server(store, bookmark_interval=0.2)
    await server.start()
    client = Client(ClientConfig(server.url))
    watched = {plural: Informer(client, plural) for plural in ("services", "pods")}
    net = network.ServiceNetwork(watched["services"], watched["pods"], **options)
    watched["services"].add_handler(net.on_service)
    watched["pods"].add_handler(net.on_pod)
    POOLS[id(net)] = cluster_ips.pool
    for informer in watched.values():
        informer.start()
        await informer.synced.wait()
    try:
        yield store, net
    finally:
        await net.aclose()
        for informer in watched.values():
            await informer.stop()
        await client.close()
        await server.stop()
        store.close_watches()
        for key in POOLS.pop(id(net)).holders():
            cluster_ips.pool.release(key)


@contextlib.asynccontextmanager
async def backend(reply: bytes) -> AsyncIterator[tuple[str, int]]:
    """A TCP server on its own loopback address that greets each client with `reply`."""
    pool = addresses.AddressPool("127.43.0.0/16")
    ip = pool.allocate(reply.decode())
    writers: list[asyncio.StreamWriter] = []

    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        writer.write(reply + b"\n")
        await writer.drain()

    server = await asyncio.start_server(greet, ip, 0)
    try:
        yield ip, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        pool.release(reply.decode())


def service(name: str = "kernel", **spec: Any) -> Obj:
    spec.setdefault("selector", {"kernel": "k1"})
    spec.setdefault("ports", [{"name": "shell", "port": 5000, "targetPort": "shell"}])
    return {"metadata": {"name": name, "labels": {"team": "a"}}, "spec": spec}


def pod(name: str, ip: str, port: int, *, ready: bool = True) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"kernel": "k1"}},
        "spec": {
            "nodeName": "fake-node",
            "containers": [
                {"name": "main", "image": "x", "ports": [{"name": "shell", "containerPort": port}]}
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def set_ready(store: Store, name: str, ready: bool) -> None:
    found = store.get("", "pods", NS, name)
    found["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    store.replace("", "pods", NS, name, found, subresource="status")


def subsets(store: Store) -> list[Obj]:
    """The `kernel` Endpoints' subsets ([] while it has none or does not exist yet)."""
    with contextlib.suppress(ApiError):
        found: list[Obj] = store.get("", "endpoints", NS, "kernel").get("subsets") or []
        return found
    return []


async def until(check: Callable[[], Any], seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {check}")
        await asyncio.sleep(0.02)
    return found


async def test_a_service_gets_a_cluster_ip_at_creation_and_keeps_it() -> None:
    async with services() as (store, net):
        created = store.create("", "services", NS, service())
        ip = created["spec"]["clusterIP"]
        assert ip.startswith("127.42.")
        assert created["spec"]["clusterIPs"] == [ip]
        assert created["spec"]["type"] == "ClusterIP"
        assert created["spec"]["ports"][0]["protocol"] == "TCP"

        update = store.get("", "services", NS, "kernel")
        del update["spec"]["clusterIP"], update["spec"]["clusterIPs"]
        update["metadata"]["labels"] = {"team": "b"}
        assert store.replace("", "services", NS, "kernel", update)["spec"]["clusterIP"] == ip
        update = store.get("", "services", NS, "kernel")
        update["spec"]["clusterIP"] = "127.42.9.9"
        with pytest.raises(ApiError, match="field is immutable") as immutable:
            store.replace("", "services", NS, "kernel", update)
        assert immutable.value.code == 422

        headless = store.create("", "services", NS, service("headless", clusterIP="None"))
        assert headless["spec"]["clusterIPs"] == ["None"]
        with pytest.raises(ApiError, match="already allocated"):
            store.create("", "services", NS, service("twin", clusterIP=ip))
        with pytest.raises(ApiError, match="not in the valid range"):
            store.create("", "services", NS, service("far", clusterIP="10.0.0.1"))
        await until(lambda: net.listening(NS, "kernel"))
        assert net.listening(NS, "headless") == []

        store.delete("", "services", NS, "kernel")
        await until(lambda: net.address(NS, "kernel") is None)
        assert "kernel" not in [key.split("/")[1] for key in POOLS[id(net)].holders()]
        with pytest.raises(ApiError):
            store.get("", "endpoints", NS, "kernel")


async def test_endpoints_follow_pod_readiness_and_labels() -> None:
    async with services() as (store, _):
        store.create("", "services", NS, service())
        store.create("", "pods", NS, pod("a", "127.43.1.1", 8000, ready=False))
        await until(lambda: subsets(store))
        endpoints = store.get("", "endpoints", NS, "kernel")
        assert endpoints["metadata"]["labels"] == {"team": "a"}
        subset = endpoints["subsets"][0]
        assert [a["ip"] for a in subset["notReadyAddresses"]] == ["127.43.1.1"]
        assert "addresses" not in subset
        assert subset["ports"] == [{"name": "shell", "port": 8000, "protocol": "TCP"}]

        set_ready(store, "a", True)
        await until(lambda: "addresses" in subsets(store)[0])

        relabelled = store.get("", "pods", NS, "a")
        relabelled["metadata"]["labels"] = {"kernel": "other"}
        store.replace("", "pods", NS, "a", relabelled)
        await until(lambda: not subsets(store))


async def test_connections_round_robin_over_ready_pods_and_close_when_their_pod_goes() -> None:
    async with services() as (store, net), backend(b"a") as (ip_a, port_a), backend(b"b") as b:
        cluster_ip = store.create("", "services", NS, service())["spec"]["clusterIP"]
        store.create("", "pods", NS, pod("a", ip_a, port_a))
        store.create("", "pods", NS, pod("b", *b))
        await until(lambda: net.listening(NS, "kernel"))
        connections = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection(cluster_ip, 5000)
            connections.append((await asyncio.wait_for(reader.readline(), 5), reader, writer))
        assert {line for line, _, _ in connections} == {b"a\n", b"b\n"}

        store.delete("", "pods", NS, "a", grace_seconds=0)  # its server keeps running
        for line, reader, _ in connections:
            if line == b"a\n":
                assert await asyncio.wait_for(reader.read(), 5) == b""
        reader, writer = await asyncio.open_connection(cluster_ip, 5000)
        assert await asyncio.wait_for(reader.readline(), 5) == b"b\n"
        for _, _, open_writer in [*connections, (b"", reader, writer)]:
            open_writer.close()
            await open_writer.wait_closed()


async def test_a_connection_waits_for_a_ready_pod_and_is_closed_if_none_comes() -> None:
    async with services(hold_seconds=0.5) as (store, net), backend(b"late") as (ip, port):
        cluster_ip = store.create("", "services", NS, service())["spec"]["clusterIP"]
        await until(lambda: net.listening(NS, "kernel"))
        reader, writer = await asyncio.open_connection(cluster_ip, 5000)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert time.monotonic() - started >= 0.4
        writer.close()

        store.create("", "pods", NS, pod("late", ip, port, ready=False))
        reader, writer = await asyncio.open_connection(cluster_ip, 5000)
        await asyncio.sleep(0.1)
        set_ready(store, "late", True)
        assert await asyncio.wait_for(reader.readline(), 5) == b"late\n"
        writer.close()
        await writer.wait_closed()


async def test_aclose_stops_listeners_and_forwarded_connections() -> None:
    async with backend(b"x") as (ip, port):
        async with services() as (store, net):
            cluster_ip = store.create("", "services", NS, service())["spec"]["clusterIP"]
            store.create("", "pods", NS, pod("x", ip, port))
            await until(lambda: net.listening(NS, "kernel"))
            reader, writer = await asyncio.open_connection(cluster_ip, 5000)
            assert await asyncio.wait_for(reader.readline(), 5) == b"x\n"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await writer.wait_closed()
        with pytest.raises(OSError):
            await asyncio.open_connection(cluster_ip, 5000)


async def test_aclose_ends_a_connection_held_for_a_ready_pod_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with services() as (store, net):
        cluster_ip = store.create("", "services", NS, service())["spec"]["clusterIP"]
        await until(lambda: net.listening(NS, "kernel"))
        reader, writer = await asyncio.open_connection(cluster_ip, 5000)  # held: no pod yet
        await asyncio.sleep(0.1)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.05)  # the handler's done callback
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_a_service_publishing_not_ready_pods_keeps_a_terminating_one_as_slices_do() -> None:
    # EndpointSlices mark a terminating pod ready where the Service publishes not-ready
    # addresses, and kube-proxy routes to it; the Endpoints controller keeps it too.
    async with services() as (store, net), backend(b"going") as (ip, port):
        store.create("", "services", NS, service())
        store.create("", "services", NS, service("early", publishNotReadyAddresses=True))
        held = pod("going", ip, port)
        held["metadata"]["finalizers"] = ["example.com/hold"]  # a delete leaves it terminating
        uid = store.create("", "pods", NS, held)["metadata"]["uid"]
        await until(lambda: subsets(store))
        store.delete("", "pods", NS, "going")
        assert store.get("", "pods", NS, "going")["metadata"].get("deletionTimestamp")
        await until(lambda: not subsets(store))  # the plain Service drops it
        early = store.get("", "endpoints", NS, "early")
        assert [a["ip"] for a in early["subsets"][0]["addresses"]] == [ip]
        # the network reads the store's events on its own: it may be a step behind the
        # Endpoints controller (a clean-clone CI run read [] here)
        await until(lambda: net.ready_backends(NS, "early", 5000) == [(uid, ip, port)])
        await until(lambda: net.ready_backends(NS, "kernel", 5000) == [])
