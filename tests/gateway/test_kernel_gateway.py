"""Kernel Gateway 3 runs the provisioner on the fake cluster; a jupyter_server in gateway mode
(`--gateway-url`) in front of it starts a queued kernel, sees it wait, and runs code once Kueue
admits it. Real processes and real HTTP throughout."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KernelspecFactory, Server
from tests.gateway.conftest import REQUEST_TIMEOUT, backend_options, served
from tests.gateway.gateways import GatewayProcess, gateway_env
from tests.gateway.queueing import gated_kernels, position_reads, requeued_and_kept_active
from tests.kube.support import kube_spec, wait_clean
from tests.polling import until
from tests.ports import free_port

KERNEL_GATEWAY = Path(sys.executable).parent / "jupyter-kernelgateway"


@pytest.fixture
def gateway(
    cluster: FakeCluster,
    gateway_home: Path,
    jp_data_dir: Path,
    jp_asyncio_loop: asyncio.AbstractEventLoop,
) -> Iterator[GatewayProcess]:
    """Kernel Gateway 3 serving the test's kernelspecs, its kubernetes backend on `cluster`."""
    port = free_port()
    argv = [
        str(KERNEL_GATEWAY),
        "--KernelGatewayApp.ip=127.0.0.1",
        f"--KernelGatewayApp.port={port}",
        *backend_options(cluster),
    ]
    env = gateway_env(gateway_home, JUPYTER_PATH=str(jp_data_dir))
    yield from served(
        GatewayProcess(argv, env, port, gateway_home / "kernel-gateway.log"), jp_asyncio_loop
    )


async def test_a_queued_kernel_behind_kernel_gateway_waits_then_runs_code(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, gateway: Any
) -> None:
    name = kube_spec(kernelspec)
    first = await server.start(name)
    assert (await server.execute(first, "1+1"))["data"] == "2"

    # The only GPU is taken: the second kernel waits in the queue, its start request open.
    body = json.dumps({"name": name})
    start = asyncio.ensure_future(
        server.fetch("api", "kernels", method="POST", body=body, request_timeout=REQUEST_TIMEOUT)
    )
    (second,) = await until(lambda: gated_kernels(cluster) - {first}, "a queued kernel")
    await until(
        lambda: "queued in 'user-queue', position 1 of 1, needs 1 GPU" in gateway.log(),
        "the queue position in the gateway's log",
    )
    # Still waiting, its start request open, after the server has read the queue twice more.
    reads = position_reads(cluster)
    await until(lambda: position_reads(cluster) >= reads + 2, "two more reads of the queue")
    assert not start.done()

    await server.shutdown(first)
    started = json.loads((await start).body)
    assert started["id"] == second
    assert (await server.execute(second, "2+3"))["data"] == "5"
    await server.shutdown(second)
    await wait_clean(server, cluster, first, second)


async def test_a_preempted_kernel_behind_kernel_gateway_is_kept_active_and_comes_back(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, gateway: Any
) -> None:
    low = await server.start(kube_spec(kernelspec, "low", priority_class="low"))
    assert (await server.execute(low, "x = 41; x + 1"))["data"] == "42"
    high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    await requeued_and_kept_active(gateway, low)

    await server.shutdown(high)
    assert (await server.execute(low, "x"))["error"] == "NameError"  # back, restarted fresh
    await server.shutdown(low)
    await wait_clean(server, cluster, low, high)
