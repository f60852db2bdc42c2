"""Enterprise Gateway 3.x, in its own environment (`.venv-eg`, jupyter_client 6), runs
`KueueProcessProxy` on the fake cluster; kernels run from that environment (ipykernel 6), as EG
users' kernel images do. A jupyter_server in gateway mode is the client, as in a deployment."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from tests.conftest import Listener, Server
from tests.gateway.conftest import REQUEST_TIMEOUT, backend_options, served
from tests.gateway.gateways import (
    GatewayProcess,
    enterprise_gateway_python,
    gateway_env,
)
from tests.gateway.queueing import gated_kernels, requeued_and_kept_active, uids
from tests.kube.support import REPO, labelled, ours, wait_clean
from tests.polling import until
from tests.ports import free_port

EG_IMAGE = "kernel-queue/eg-kernel"
"""The kernels' image: the fake kubelet runs it with `.venv-eg`'s python."""
LAUNCH_TIMEOUT = 2
"""EG_KERNEL_LAUNCH_TIMEOUT: far shorter than the queue waits below."""
SPEC = "eg-gpu"
EG_CONFIG = REPO / "etc" / "jupyter" / "enterprise_gateway_config.py"
JUPYTER = Path(sys.executable).parent / "jupyter"


def add_kernelspec(kernelspecs: Path, name: str, **changes: dict[str, Any]) -> str:
    """A copy of the installed kernelspec under `name`, with `kernel_provisioner` config and
    `process_proxy` config changed; EG reads kernelspecs from disk on each launch."""
    spec = json.loads((kernelspecs / "kernels" / SPEC / "kernel.json").read_text())
    spec["metadata"]["kernel_provisioner"]["config"].update(changes.get("kernel_provisioner", {}))
    spec["metadata"]["process_proxy"]["config"] = changes.get("process_proxy", {})
    folder = kernelspecs / "kernels" / name
    folder.mkdir()
    (folder / "kernel.json").write_text(json.dumps(spec))
    return name


@pytest.fixture(scope="session")
def eg_python() -> Path:
    return enterprise_gateway_python()


@pytest.fixture
def cluster_options(eg_python: Path) -> dict[str, Any]:
    return {"image_paths": {EG_IMAGE: str(eg_python.parent)}}


@pytest.fixture
def eg_kernelspecs(gateway_home: Path) -> Path:
    """A prefix holding the kernelspec `jupyter kernel-queue install --gateway ...` writes."""
    prefix = gateway_home / "prefix"
    done = subprocess.run(
        [
            str(JUPYTER),
            "kernel-queue",
            "install",
            f"--name={SPEC}",
            "--gateway=enterprise-gateway",
            "--backend=kubernetes",
            f"--image={EG_IMAGE}",
            "--namespace=default",
            "--queue=user-queue",
            "--gpus=1",
            f"--prefix={prefix}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return prefix / "share" / "jupyter"


@pytest.fixture
def gateway(
    cluster: FakeCluster,
    eg_python: Path,
    eg_kernelspecs: Path,
    gateway_home: Path,
    jp_asyncio_loop: asyncio.AbstractEventLoop,
) -> Iterator[GatewayProcess]:
    """EG configured by etc/jupyter/enterprise_gateway_config.py (file-based session
    persistence, standalone: a restart revives the sessions), its backend on `cluster`."""
    port = free_port()
    argv = [
        str(eg_python.parent / "jupyter-enterprisegateway"),
        "--EnterpriseGatewayApp.ip=127.0.0.1",
        f"--EnterpriseGatewayApp.port={port}",
        f"--config={EG_CONFIG}",  # the shipped example: persistence, culling, users
        *backend_options(cluster),
    ]
    env = gateway_env(
        gateway_home,
        JUPYTER_PATH=str(eg_kernelspecs),
        EG_KERNEL_LAUNCH_TIMEOUT=str(LAUNCH_TIMEOUT),
        EG_LIST_KERNELS="True",
    )
    yield from served(
        GatewayProcess(argv, env, port, gateway_home / "enterprise-gateway.log"), jp_asyncio_loop
    )


async def test_a_queued_kernel_outwaits_eg_launch_timeout_and_runs_code_once_admitted(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    first = await server.start(SPEC)
    assert (await server.execute(first, "import ipykernel; ipykernel.__version__[0]"))[
        "data"
    ] == "'6'"  # the kernel runs from EG's environment

    # Straight to EG: jupyter_server would send KERNEL_LAUNCH_TIMEOUT (its request_timeout less
    # 2 s), which replaces EG's launch timeout; without it EG's own 2 s are in force.
    body = json.dumps({"name": SPEC, "env": {"KERNEL_USERNAME": "alice"}})
    start = asyncio.ensure_future(
        AsyncHTTPClient().fetch(
            f"{gateway.url}/api/kernels",
            method="POST",
            body=body,
            request_timeout=REQUEST_TIMEOUT,
        )
    )
    try:
        (second,) = await until(lambda: gated_kernels(cluster) - {first}, "a queued kernel")
        await until(
            lambda: "queued in 'user-queue', position 1 of 1, needs 1 GPU" in gateway.log(),
            "the queue position in the gateway's log",
        )
        await asyncio.sleep(3 * LAUNCH_TIMEOUT)  # well past EG's launch timeout
        assert not start.done()
        assert second in gated_kernels(cluster)

        await server.shutdown(first)
        started = json.loads((await start).body)
    finally:
        start.cancel()  # a failed test leaves no request open; stopping EG ends the kernel
    assert started["id"] == second
    # jupyter_server in gateway mode attaches to a kernel the gateway runs when given its id.
    attach = json.dumps({"name": SPEC, "kernel_id": second})
    await server.fetch("api", "kernels", method="POST", body=attach)
    assert (await server.execute(second, "2+3"))["data"] == "5"
    await server.shutdown(second)
    await wait_clean(server, cluster, first, second)
    assert "Waited too long" not in gateway.log()


async def test_a_restarted_enterprise_gateway_reattaches_to_a_running_kernel(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    kernel = await server.start(SPEC)
    assert (await server.execute(kernel, "x = 41; x"))["data"] == "41"

    await gateway.stop(signal.SIGKILL)  # a crash: EG shuts nothing down
    await gateway.start()
    assert f"Startup of persisted kernel session for id '{kernel}' was successful" in (
        gateway.log()
    )
    assert (await server.execute(kernel, "x + 1"))["data"] == "42"  # the same kernel, state kept
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)


async def test_a_client_that_stops_waiting_gets_a_clear_error_and_nothing_is_left_queued(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    first = await server.start(SPEC)
    # A client whose KERNEL_LAUNCH_TIMEOUT is 3 s asks for a kernel while the GPU is taken.
    body = {"name": SPEC, "env": {"KERNEL_LAUNCH_TIMEOUT": "3", "KERNEL_USERNAME": "bob"}}
    with pytest.raises(HTTPClientError) as caught:
        await AsyncHTTPClient().fetch(
            f"{gateway.url}/api/kernels",
            method="POST",
            body=json.dumps(body),
            request_timeout=60,
        )
    assert caught.value.code == 503
    message = json.loads(caught.value.response.body)["message"]
    assert "without being admitted, as long as the gateway client waits" in message
    assert "GatewayClient.request_timeout" in message
    await until(lambda: not gated_kernels(cluster), "the queued kernel removed")
    await server.shutdown(first)
    await wait_clean(server, cluster, first)
    assert ours(cluster) == {}


async def test_stopping_enterprise_gateway_ends_its_kernels_and_leaves_nothing(
    cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    body = {"name": SPEC, "env": {"KERNEL_USERNAME": "carol"}}
    response = await AsyncHTTPClient().fetch(
        f"{gateway.url}/api/kernels",
        method="POST",
        body=json.dumps(body),
        request_timeout=60,
    )
    kernel = json.loads(response.body)["id"]
    assert labelled(cluster, kernel)["pods"]
    assert await gateway.stop() == 0  # SIGTERM: EG shuts its kernels down, then exits
    assert labelled(cluster, kernel) == {}
    assert "Traceback" not in gateway.log()


async def test_a_restart_through_enterprise_gateway_happens_in_place_and_keeps_the_admission(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    kernel = await server.start(SPEC)
    assert (await server.execute(kernel, "x = 1; x"))["data"] == "1"
    before, uids_before = labelled(cluster, kernel), uids(cluster, kernel)
    assert set(uids_before) == {"pods", "services", "secrets", "workloads"}
    await server.fetch("api", "kernels", kernel, "restart", method="POST", body="{}")
    assert (await server.execute(kernel, "'x' in dir()"))["data"] == "False"  # a fresh kernel
    assert labelled(cluster, kernel) == before  # the same pod, Workload, Service and Secret
    assert uids(cluster, kernel) == uids_before  # the same objects, none deleted and recreated
    assert gateway.log().count("submitted as pod group") == 1  # never requeued
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)


@pytest.mark.parametrize(
    ("config", "status", "message"),
    [
        pytest.param(
            {"process_proxy": {"gpu": 1}},
            500,
            "kernelspec 'eg-bad': unknown config key `gpu` (did you mean `gpus`?); the keys are "
            "admission_timeout",
            id="unknown-key",
        ),
        pytest.param(
            {"kernel_provisioner": {"queue": "gpu-queue"}},
            500,
            "LocalQueue 'gpu-queue' does not exist in namespace 'default'; LocalQueues there: "
            "user-queue",
            id="missing-queue",
        ),
    ],
)
async def test_a_bad_kernelspec_fails_the_launch_with_the_fix_and_leaves_nothing(
    cluster: FakeCluster,
    gateway: GatewayProcess,
    eg_kernelspecs: Path,
    config: dict[str, dict[str, Any]],
    status: int,
    message: str,
) -> None:
    add_kernelspec(eg_kernelspecs, "eg-bad", **config)

    body = {"name": "eg-bad", "env": {"KERNEL_USERNAME": "dave"}}
    with pytest.raises(HTTPClientError) as caught:
        await AsyncHTTPClient().fetch(
            f"{gateway.url}/api/kernels",
            method="POST",
            body=json.dumps(body),
            request_timeout=60,
        )
    assert caught.value.code == status
    assert message in json.loads(caught.value.response.body)["message"]
    assert ours(cluster) == {}


async def test_a_preempted_kernel_waits_behind_enterprise_gateway_and_comes_back(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess, eg_kernelspecs: Path
) -> None:
    low = await server.start(
        add_kernelspec(eg_kernelspecs, "eg-low", kernel_provisioner={"priority_class": "low"})
    )
    assert (await server.execute(low, "x = 41; x + 1"))["data"] == "42"
    high = await server.start(
        add_kernelspec(eg_kernelspecs, "eg-high", kernel_provisioner={"priority_class": "high"})
    )
    assert (await server.execute(high, "1+1"))["data"] == "2"
    await requeued_and_kept_active(gateway, low)  # EG's restarter keeps it

    await server.shutdown(high)
    back = await server.execute(low, "x")
    assert back["error"] == "NameError"  # no checkpoint configured: it restarted fresh
    await server.shutdown(low)
    await wait_clean(server, cluster, low, high)


async def test_an_interrupt_through_enterprise_gateway_stops_the_running_cell(
    server: Server, cluster: FakeCluster, gateway: GatewayProcess
) -> None:
    kernel = await server.start(SPEC)
    listener = await Listener.open(server, kernel)
    try:
        code = "import time; print('sleeping', flush=True); time.sleep(60)"
        cell = asyncio.ensure_future(server.execute(kernel, code, within=30))

        async def sleeping() -> bool:
            return "sleeping" in listener.text()

        await server.wait_for(sleeping, within=30)  # the cell runs: interrupt it, not the idle
    finally:
        listener.close()
    await server.fetch("api", "kernels", kernel, "interrupt", method="POST", body="{}")
    assert (await cell)["error"] == "KeyboardInterrupt"  # message mode: EG's control channel
    assert (await server.execute(kernel, "1+1"))["data"] == "2"
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)
