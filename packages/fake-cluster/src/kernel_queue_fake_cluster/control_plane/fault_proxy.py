"""`FaultProxy`: the fake API server's faults, in front of the real one.

A plain-HTTP server on 127.0.0.1 that forwards every request to the real API server over TLS
(the client's own `Authorization` passes through, so RBAC judges the client, not the proxy) and
injects what `FakeCluster` injects, with the same calls: `fail_next` (an error status instead of
the answer, or after serving it), `plant_next` (before a create, an object of its name made by
"someone else": the create then meets the real API server's 409), `drop_watches` (every open
watch ends now),
`expire_next_watch` (a watch gets one ERROR line with 410 Expired), `latency` (seconds added to
every request), `faults_pending`, `clear_faults` and request counts in `requests`. Watches are
relayed line by line as they come. Requests are named as the fake names them (RBAC verbs and
resources: `list pods`, `get localqueues/pendingworkloads`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kernel_queue_fake_cluster.apiserver import discovery, faults

_PASSED_HEADERS = ("Authorization", "Content-Type", "Accept", "User-Agent")
_ANSWERED_HEADERS = ("Content-Type", "Retry-After", "Warning", "Audit-Id")


class FaultProxy:
    """Forward to `upstream` (https://…, trusting `ca`), injecting faults; start on the running
    loop with `await start()`, end with `await stop()`."""

    def __init__(self, upstream: str, ca: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._context = ssl.create_default_context(cafile=str(ca))
        self.faults = faults.Faults()
        self.latency = 0.0
        self.expire = 0
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._streams: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._context, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def stop(self) -> None:
        self.drop_watches()
        if self._streams:
            await asyncio.gather(*self._streams, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
            # TLS connections finish closing on the loop's next turns (aiohttp's advice)
            await asyncio.sleep(0.25)

    # -- the fake's fault calls -------------------------------------------------------------

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
        """As `FakeCluster.fail_next`: a 429 carries `Retry-After: 1` unless told otherwise."""
        if status == 429 and retry_after is None:
            retry_after = 1
        self.faults.add(
            verb, plural, faults.Fault(status, retry_after=retry_after, after=after), count
        )

    def plant_next(
        self, plural: str, labels: Mapping[str, str] | None = None, count: int = 1
    ) -> None:
        """As `FakeCluster.plant_next`: before each of the next `count` creates on `plural`,
        create an object of the same name carrying only `labels` (with the client's own
        credentials, as a colleague of the same rights would); the create meets a real 409."""
        self.faults.add("create", plural, faults.Fault(0, plant=dict(labels or {})), count)

    def drop_watches(self) -> None:
        """End every open watch stream now."""
        for task in list(self._streams):
            task.cancel()

    def expire_next_watch(self, count: int = 1) -> None:
        self.expire += count

    @property
    def faults_pending(self) -> int:
        return self.faults.pending()

    def clear_faults(self) -> None:
        self.faults.clear()

    # -- serving ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        target = discovery.parse(request.path)
        query = {k: v for k, v in request.query.items()}
        watch = (
            request.method == "GET"
            and target is not None
            and query.get("watch") in ("true", "True", "1")
        )
        verb = discovery.verb(request.method, target, watch) if target else request.method.lower()
        resource = target.resource if target else request.path
        self.requests[(verb, resource)] += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        fault = self.faults.take(verb, resource) if self.faults else None
        if fault is not None and not fault.after and fault.plant is None:
            return _error(fault.error(verb, resource))
        if watch and self.expire > 0:
            self.expire -= 1
            return _expired()
        body = await request.read()
        headers = {h: request.headers[h] for h in _PASSED_HEADERS if h in request.headers}
        assert self._session is not None
        if fault is not None and fault.plant is not None:
            await self._plant(fault, request, body, headers)
            fault = None
        upstream = await self._session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        )
        if watch and upstream.status == 200 and fault is None:
            return await self._relay(request, upstream)
        async with upstream:
            payload = await upstream.read()
            if fault is not None:
                return _error(fault.error(verb, resource))
            answer = web.Response(status=upstream.status, body=payload)
            for name in _ANSWERED_HEADERS:
                if name in upstream.headers:
                    answer.headers[name] = upstream.headers[name]
            return answer

    async def _plant(
        self, fault: faults.Fault, request: web.Request, body: bytes, headers: dict[str, str]
    ) -> None:
        """Create the foreign object `fault` plants before the request's own create."""
        try:
            planted = fault.planted(json.loads(body)) if body else None
        except ValueError:
            planted = None  # not JSON (protobuf): nothing to copy the name from
        if planted is None:
            return
        sent = {**headers, "Content-Type": "application/json"}
        assert self._session is not None
        async with self._session.request(
            "POST", self.upstream + request.path_qs, data=json.dumps(planted), headers=sent
        ) as answer:
            await answer.read()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        answer = web.StreamResponse(status=200)
        answer.headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
        answer.enable_chunked_encoding()
        await answer.prepare(request)

        async def copy() -> None:
            async for line in upstream.content:
                await answer.write(line)

        task = asyncio.get_running_loop().create_task(copy())
        self._streams.add(task)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the client went away
                raise
            # else `drop_watches` ended it: end the answer as a restarting API server does
        except (aiohttp.ClientError, ConnectionError):
            pass  # the API server ended it
        finally:
            self._streams.discard(task)
            upstream.close()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await answer.write_eof()
        return answer


def _error(error: faults.InjectedError) -> web.Response:
    answer = web.json_response(error.status(), status=error.code)
    if error.retry_after is not None:
        answer.headers["Retry-After"] = str(error.retry_after)
    return answer


def _expired() -> web.Response:
    event = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version (injected)",
            "reason": "Expired",
            "code": 410,
        },
    }
    return web.Response(status=200, body=json.dumps(event) + "\n", content_type="application/json")
