"""Fixtures of the gateway tests: the fake cluster of tests/kube, a gateway server process
(Kernel Gateway 3 in this environment, Enterprise Gateway 3.x in `.venv-eg`) with the kubernetes
backend pointed at the cluster, and the test's jupyter_server in gateway mode in front of it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.gateway.gateways import GatewayProcess
from tests.kube.conftest import cluster, cluster_options  # noqa: F401 - shared fixtures
from tests.kube.support import SERVER_TOKEN

REQUEST_TIMEOUT = 120.0
"""The notebook server's GatewayClient.request_timeout: longer than any queue wait here."""


def backend_options(fake: FakeCluster) -> list[str]:
    """Command-line config of the gateway's kubernetes backend: the cluster, RBAC as the server."""
    kubeconfig = fake.kubeconfig_for(SERVER_TOKEN, name="gateway-kubeconfig")
    return [
        f"--KubernetesBackend.kubeconfig={kubeconfig}",
        "--KubernetesBackend.namespace=default",
        "--KubernetesBackend.position_interval=0.2",
    ]


@pytest.fixture
def gateway_home(tmp_path: Path) -> Path:
    home = tmp_path / "gateway-home"
    home.mkdir()
    return home


@pytest.fixture
def gateway_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what a gateway-mode jupyter_server leaves in the process: the GatewayClient
    singleton, its class-level KERNEL_LAUNCH_TIMEOUT and the env var it writes."""
    GatewayClient.clear_instance()
    saved = GatewayClient.KERNEL_LAUNCH_TIMEOUT
    monkeypatch.setenv("KERNEL_LAUNCH_TIMEOUT", str(int(REQUEST_TIMEOUT - 2)))
    monkeypatch.setenv("KERNEL_USERNAME", "alice")  # EG refuses kernels for root by default
    yield
    GatewayClient.clear_instance()
    GatewayClient.KERNEL_LAUNCH_TIMEOUT = saved


@pytest.fixture
def jp_server_config(gateway: GatewayProcess, gateway_client: None) -> dict[str, Any]:
    """The test server's config: gateway mode in front of the module's `gateway` fixture,
    patient enough for queued kernels."""
    return {
        "GatewayClient": {"url": gateway.url, "request_timeout": REQUEST_TIMEOUT},
        "ServerApp": {"jpserver_extensions": {"kernel_queue": False}},
    }


def served(gateway: GatewayProcess, loop: asyncio.AbstractEventLoop) -> Iterator[GatewayProcess]:
    """A gateway fixture's life: `gateway` started, yielded to the test, stopped after it."""
    loop.run_until_complete(gateway.start())
    yield gateway
    loop.run_until_complete(gateway.stop())
