"""The kubelet's log endpoint, for a real API server: `GET /containerLogs/{namespace}/{pod}/
{container}` over HTTPS on 127.0.0.1, where the Node's `daemonEndpoints.kubeletEndpoint.Port`
says (the API server proxies `kubectl logs` there, and does not check the kubelet's serving
certificate unless told to: a self-signed one made with `openssl` serves).

Query: `tailLines`, `follow` (the text as it grows, until the container stops), `limitBytes`;
`timestamps` and `sinceSeconds` are accepted and ignored. Errors answer as the kubelet's: the
status code and the message as text.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Protocol

from aiohttp import web

from kernel_queue_fake_cluster.node.client import ApiError


class Logs(Protocol):
    """What the server asks the agent."""

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path: ...

    def running(self, namespace: str, name: str, container: str) -> bool: ...


def self_signed(folder: Path, name: str = "fake-node") -> tuple[Path, Path]:
    """A serving certificate and key for 127.0.0.1 and localhost in `folder` (made once)."""
    cert, key = folder / "kubelet.crt", folder / "kubelet.key"
    if cert.exists() and key.exists():
        return cert, key
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the node agent's log endpoint needs `openssl` to make its certificate")
    folder.mkdir(parents=True, exist_ok=True)
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365"]
    names = ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    subprocess.run(
        [openssl, *request, "-keyout", str(key), "-out", str(cert), *names],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return cert, key


class LogServer:
    """`/containerLogs/...` and `/healthz` of one agent, on 127.0.0.1 over HTTPS."""

    def __init__(self, agent: Logs, folder: Path, *, poll: float = 0.2) -> None:
        self.agent, self.folder, self.poll = agent, folder, poll
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> int:
        """Listen (port 0: any free one) and return the port."""
        cert, key = await asyncio.to_thread(self_signed, self.folder)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        try:
            where = self.agent.log_path(namespace, pod, container)
            tail = _number(request.query.get("tailLines"))
            limit = _number(request.query.get("limitBytes"))
        except ApiError as exc:
            return web.Response(status=exc.code, text=exc.message)
        except ValueError as exc:
            return web.Response(status=400, text=str(exc))
        data = where.read_bytes()
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail > 0 else b""
        if limit is not None:
            data = data[:limit]
        if request.query.get("follow") not in ("true", "1", "True"):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        offset = where.stat().st_size
        while True:
            with where.open("rb") as handle:
                handle.seek(offset)
                more = handle.read()
            if more:
                offset += len(more)
                await response.write(more)
            elif not self.agent.running(namespace, pod, container):
                break
            await asyncio.sleep(self.poll)
        await response.write_eof()
        return response


def _number(value: str | None) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"invalid number {value!r}") from None
