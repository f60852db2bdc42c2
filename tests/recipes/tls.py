"""A TLS front for the fake cluster, so kubectl can apply as an admin to a cluster that enforces
RBAC: kubectl (client-go's clientcmd) sends a kubeconfig's credentials only over TLS, and the
fake API server serves plain HTTP. The front listens on 127.0.0.1 with a certificate made for
the test (openssl, valid for 127.0.0.1) and pipes each connection's bytes to the fake's port.
Test plumbing, until the fake cluster serves TLS itself."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kernel_queue_fake_cluster.cluster import FakeCluster


def certificate(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: the recipe tests make a TLS certificate with it")
    cert, key = where / "front.crt", where / "front.key"
    done = subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return cert, key


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def front(cluster: FakeCluster, token: str) -> tuple[Path, Callable[[], None]]:
    """Serve `cluster` over TLS on the cluster's own loop; return a kubeconfig that reaches it
    there with `token` (the cluster's CA: the front's certificate), and what closes the front
    (before the cluster stops)."""
    cert, key = certificate(cluster.root)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    backend = urlsplit(cluster.url)

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(backend.hostname, backend.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def serve() -> asyncio.Server:
        return await asyncio.start_server(connected, "127.0.0.1", 0, ssl=context)

    server = cluster.call(serve)
    port = int(server.sockets[0].getsockname()[1])

    async def close() -> None:
        server.close()
        await server.wait_closed()

    config = yaml.safe_load(cluster.kubeconfig_for(token).read_text())
    config["clusters"][0]["cluster"] = {
        "server": f"https://127.0.0.1:{port}",
        "certificate-authority": str(cert),
    }
    path = cluster.root / "kubeconfig-tls"
    path.write_text(yaml.safe_dump(config))
    return path, lambda: cluster.call(close)
