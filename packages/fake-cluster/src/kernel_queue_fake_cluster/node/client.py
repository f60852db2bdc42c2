"""The node agent's own Kubernetes API client: a small asyncio client on aiohttp.

`ClientConfig` says where the API server is and how to authenticate (a CA file, a client
certificate and key, or a bearer token; `from_kubeconfig` reads them from a kubeconfig file).
`Client` has the verbs the agent needs: get, list (label and field selectors), watch (chunked
JSON lines from a resourceVersion, bookmarks), create, delete (grace period, uid precondition),
patch with an explicit content type, and subresources (`status`, `binding`) through `path`.
Errors are `ApiError`s carrying the API server's `Status` (code, reason, message). It knows no
object semantics; `informer.py` builds caches on it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kernel_queue_fake_cluster.common.objects import Obj

USER_AGENT = "kernel-queue-node-agent/0.1"
"""What the agent's requests say they are (the fake API server leaves them out of its stats and
faults: they are the cluster's own, not the client under test)."""
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """An error answer of the API server, with its `Status` code, reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message

    @classmethod
    def of(cls, code: int, text: str) -> ApiError:
        """The error for an HTTP answer `code` whose body is `text` (a Status, or anything)."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            return cls(int(body.get("code") or code), str(body.get("reason", "")), body["message"])
        return cls(code, "", text.strip()[:256])

    def status(self) -> Obj:
        """The `Status` body that says this error."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass(frozen=True)
class ClientConfig:
    """Where the API server is and who the agent is to it.

    `server`: the base URL (http or https). TLS: `ca_file` or `ca_data` (PEM) to verify the
    server (else the system's CAs; `insecure` skips verification); a client certificate from
    `cert_file` + `key_file` or `cert_data` + `key_data`. Or a bearer `token`.
    """

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    insecure: bool = False

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | os.PathLike[str], context: str | None = None
    ) -> ClientConfig:
        """The cluster and user of `context` (default: the current context) of a kubeconfig
        file; relative file names in it are relative to the file's directory."""
        where = Path(kubeconfig)
        config = yaml.safe_load(where.read_text()) or {}
        name = context or config.get("current-context")
        contexts = {c["name"]: c.get("context") or {} for c in config.get("contexts") or []}
        if name not in contexts:
            raise ValueError(f"{where}: no context {name!r}")
        chosen = contexts[name]
        cluster = _named(config, "clusters", "cluster", chosen.get("cluster"), where)
        user = _named(config, "users", "user", chosen.get("user"), where)

        def file(value: Any) -> str | None:
            return str(where.parent / value) if value else None

        def data(value: Any) -> bytes | None:
            return base64.b64decode(value) if value else None

        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(file(user["tokenFile"]) or "").read_text().strip()
        return cls(
            server=str(cluster["server"]).rstrip("/"),
            ca_file=file(cluster.get("certificate-authority")),
            ca_data=data(cluster.get("certificate-authority-data")),
            cert_file=file(user.get("client-certificate")),
            cert_data=data(user.get("client-certificate-data")),
            key_file=file(user.get("client-key")),
            key_data=data(user.get("client-key-data")),
            token=token or None,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for an https server (None for http)."""
        if not self.server.startswith("https:"):
            return None
        context = ssl.create_default_context(
            cafile=self.ca_file, cadata=self.ca_data.decode() if self.ca_data else None
        )
        if self.insecure:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if self.cert_file or self.cert_data:
            with tempfile.TemporaryDirectory(prefix="node-agent-tls-") as folder:
                cert, key = self.cert_file, self.key_file
                if self.cert_data is not None:
                    cert = _private(Path(folder) / "client.crt", self.cert_data)
                if self.key_data is not None:
                    key = _private(Path(folder) / "client.key", self.key_data)
                context.load_cert_chain(str(cert), key)
        return context


def _named(config: Obj, section: str, field: str, name: Any, where: Path) -> Obj:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry.get(field) or {})
    raise ValueError(f"{where}: no {field} {name!r} in {section}")


def _private(path: Path, data: bytes) -> str:
    path.touch(mode=0o600)
    path.write_bytes(data)
    return str(path)


def path(
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    sub: str | None = None,
    *,
    group: str = "",
    version: str = "v1",
) -> str:
    """The REST path of a collection, an object or its subresource (`namespace` None: all
    namespaces, or a cluster-scoped kind)."""
    parts = ["/api/v1" if not group else f"/apis/{group}/{version}"]
    if namespace:
        parts += ["namespaces", namespace]
    parts.append(plural)
    parts += [p for p in (name, sub) if p]
    return "/".join(parts)


class Client:
    """An asyncio client of one API server; `await close()` at the end."""

    def __init__(
        self, config: ClientConfig, *, user_agent: str = USER_AGENT, timeout: float = 30.0
    ) -> None:
        self.config, self.timeout = config, timeout
        self._headers = {"User-Agent": user_agent, "Accept": JSON}
        if config.token:
            self._headers["Authorization"] = f"Bearer {config.token}"
        self._ssl = config.ssl_context()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False)
            self._session = aiohttp.ClientSession(
                self.config.server, connector=connector, headers=self._headers
            )
        return self._session

    async def close(self) -> None:
        """Close every connection (open watches end)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        target: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """One request; the JSON answer (an object), or ApiError for a non-2xx answer."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with self._client().request(
            method, target, params=params, data=data, headers=headers, timeout=timeout
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise ApiError.of(response.status, text)
            try:
                answer = json.loads(text) if text else {}
            except ValueError:
                return {"text": text}
            return answer if isinstance(answer, dict) else {"items": answer}

    async def text(self, target: str) -> str:
        """A GET whose answer is text (a pod's log)."""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with self._client().get(target, timeout=timeout) as response:
            text = await response.text()
            if response.status >= 300:
                raise ApiError.of(response.status, text)
            return text

    async def get(self, target: str) -> Obj:
        return await self.request("GET", target)

    async def list(self, target: str, *, labels: str = "", fields: str = "") -> Obj:
        """A list (`items`, `metadata.resourceVersion`) with label and field selectors."""
        return await self.request("GET", target, params=_selectors(labels, fields))

    async def create(self, target: str, body: Obj) -> Obj:
        return await self.request("POST", target, body=body)

    async def patch(self, target: str, body: Any, content_type: str) -> Obj:
        """PATCH with the patch type stated (`STRATEGIC_MERGE_PATCH`, `MERGE_PATCH`, ...)."""
        return await self.request("PATCH", target, body=body, content_type=content_type)

    async def delete(self, target: str, *, grace: int | None = None, uid: str | None = None) -> Obj:
        """DELETE with DeleteOptions: `grace` seconds (None: the object's own), and a uid
        precondition (409 Conflict when the object of that name is another one)."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        return await self.request("DELETE", target, body=options)

    async def watch(
        self,
        target: str,
        *,
        resource_version: str | None,
        labels: str = "",
        fields: str = "",
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> AsyncIterator[Obj]:
        """The events (`{"type", "object"}`) of one watch stream, until the server ends it.
        An ERROR event (410 Expired: re-list) and a non-2xx answer raise ApiError."""
        params = _selectors(labels, fields)
        params.update(watch="true", timeoutSeconds=str(timeout_seconds))
        if resource_version:
            params["resourceVersion"] = resource_version
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=timeout_seconds + 60
        )
        async with self._client().get(target, params=params, timeout=timeout) as response:
            if response.status >= 300:
                raise ApiError.of(response.status, await response.text())
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _event(line)
            if buffer.strip():
                with contextlib.suppress(ValueError):
                    yield _event(buffer)


def _event(line: bytes) -> Obj:
    event = json.loads(line)
    if not isinstance(event, dict):
        raise ValueError(f"not a watch event: {line[:100]!r}")
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        code = int(status.get("code") or 500)
        raise ApiError(code, str(status.get("reason", "")), str(status.get("message", "")))
    return event


def _selectors(labels: str, fields: str) -> dict[str, str]:
    params = {}
    if labels:
        params["labelSelector"] = labels
    if fields:
        params["fieldSelector"] = fields
    return params
