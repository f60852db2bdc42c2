"""`KubernetesApi`: the `KubeApi` verbs (`kube.client.verbs`) over the `kubernetes` client.

This is the only module of kernel-queue that imports the `kubernetes` client. It sends
requests through `kubernetes.aio`'s generic transport (no generated typed APIs, no models), sets
every patch's content type itself, streams watches line by line, turns every client error into a
`ClusterApiError` in one function (`api_error`) and retries idempotent calls (get, list, delete,
read_log) on 429, 5xx and lost connections (`retries.Backoff`). It reads no configuration at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes.aio import client, config

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.client import retries, verbs
from kernel_queue.kube.client.verbs import (
    PATCH_CONTENT_TYPES,
    Forbidden,
    Items,
    NotFound,
    Obj,
    PatchType,
    Resource,
    Unavailable,
)

__all__ = [
    "PATCH_CONTENT_TYPES",
    "PODS",
    "Forbidden",
    "KubernetesApi",
    "NotFound",
    "Resource",
    "Unavailable",
    "api_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds one non-watch request may take, connecting included."""
WATCH_READ_SLACK = 30.0
"""Seconds a watch may stay silent beyond its `timeout_seconds` before it counts as stalled."""
DEFAULT_RETRY = retries.Backoff()
"""Retries of idempotent calls: 0.2 s doubling to 5 s, for up to 30 s of pauses."""
SERVICE_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
PODS = kueue.PODS


def api_error(
    exc: BaseException,
    action: str,
    *,
    verb: str = "",
    kind: Resource | None = None,
    namespace: str | None = None,
) -> errors.ClusterApiError:
    """Translate what the client raised while doing `action` (e.g. `create pods in namespace
    "ns"`) into our error family, keeping the server's Status `reason`, `message` and, for a
    404, `details` (`NotFound`); a 401/403 is a `Forbidden` naming `verb`, `kind` and
    `namespace`, a 429/5xx an `Unavailable` with the server's `Retry-After`."""
    if isinstance(exc, client.ApiException):
        status = int(exc.status or 0)
        reason, message, details = str(exc.reason or ""), "", {}
        with contextlib.suppress(ValueError, TypeError):
            body = json.loads(exc.body or "")
            if isinstance(body, dict):
                reason = str(body.get("reason") or reason)
                message = str(body.get("message") or "")
                found = body.get("details")
                details = found if isinstance(found, dict) else {}
        message = message or f"{action}: the API server answered {status} {reason}".rstrip()
        if status == 404:
            return NotFound(status, reason, message, details)
        if status in (401, 403):
            resource = kind.qualified if kind is not None else ""
            where = namespace if kind is None or kind.namespaced else None
            return Forbidden(status, reason, message, verb=verb, resource=resource, namespace=where)
        if status == 429 or status >= 500:
            return Unavailable(status, reason, message, retry_after=_retry_after(exc.headers))
        family: type[errors.ClusterApiError] = errors.ClusterApiError
        if status == 409:
            family = errors.ClusterConflict
        elif status == 410:
            family = errors.ClusterGone
        return family(status, reason, message)
    if isinstance(exc, TimeoutError):
        return Unavailable(0, "Timeout", f"{action}: the API server did not answer")
    detail = str(exc) or type(exc).__name__
    return Unavailable(0, "ConnectionError", f"{action}: {detail}")


def _retry_after(headers: Any) -> float | None:
    """`Retry-After` in seconds (the API server sends whole seconds); None if absent or a date."""
    try:
        value = headers.get("Retry-After") if headers is not None else None
        seconds = float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


@contextlib.contextmanager
def _translated(call: verbs.Call) -> Iterator[None]:
    try:
        yield
    except (client.ApiException, aiohttp.ClientError, TimeoutError) as exc:
        raise api_error(
            exc, str(call), verb=call.verb, kind=call.kind, namespace=call.namespace
        ) from exc


class KubernetesApi:
    """`KubeApi` over one `kubernetes.aio` ApiClient (one aiohttp session). Make one per event
    loop with `connect()` and share it; `aclose()` it when the server stops."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        retry: retries.Backoff = DEFAULT_RETRY,
    ) -> None:
        self._client = api_client
        self._timeout = request_timeout
        self.retry = retry
        """How get, list, delete and read_log retry 429, 5xx and lost connections."""

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        retry: retries.Backoff = DEFAULT_RETRY,
    ) -> KubernetesApi:
        """Load credentials now: `kubeconfig` when given; else the pod's service account when
        running in a cluster; else `$KUBECONFIG` or `~/.kube/config`. `ConfigError` if none.
        The files are read in a worker thread, off the event loop."""
        api_client = await asyncio.to_thread(_load_client, kubeconfig, context)
        return cls(api_client, request_timeout=request_timeout, retry=retry)

    # -- transport -------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Obj | Items | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        limit: float | aiohttp.ClientTimeout | None = None,
    ) -> client.rest.RESTResponse:
        """One request through the client's generic path (auth, TLS, proxy from the config);
        raises `ApiException` for a non-2xx answer, with the Status body read."""
        headers = {"Accept": accept, "Content-Type": content_type}
        request = await self._client.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        # the request's body stays a dict (typed `str` upstream): rest.py serialises it
        response = await self._client.call_api(
            *request[:4], _request_timeout=limit or self._timeout
        )
        if not 200 <= response.status <= 299:
            await response.read()  # type: ignore[no-untyped-call]
            raise client.ApiException(http_resp=response)
        return response

    async def _json(self, method: str, path: str, call: verbs.Call, **options: Any) -> Obj:
        with _translated(call):
            response = await self._send(method, path, **options)
            data: Obj = json.loads(await response.read())  # type: ignore[no-untyped-call]
        return data

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        return await retries.retry(call, self.retry)

    # -- KubeApi -------------------------------------------------------------------------

    async def create(self, kind: Resource, namespace: str | None, body: Obj) -> Obj:
        call = verbs.Call("create", kind, namespace, body.get("metadata", {}).get("name", ""))
        return await self._json("POST", kind.path(namespace), call, body=body)

    async def get(self, kind: Resource, namespace: str | None, name: str) -> Obj:
        call = verbs.Call("get", kind, namespace, name)
        return await self._retried(lambda: self._json("GET", kind.path(namespace, name), call))

    async def list(
        self,
        kind: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[Items, str]:
        query, call = (
            _selectors(label_selector, field_selector),
            verbs.Call("list", kind, namespace),
        )
        found = await self._retried(
            lambda: self._json("GET", kind.path(namespace), call, query=query)
        )
        # Items of a list carry no apiVersion/kind; add them so they look like watched objects.
        item_kind = str(found.get("kind", "")).removesuffix("List")
        items: Items = found.get("items") or []
        for item in items:
            item.setdefault("apiVersion", kind.api_version)
            if item_kind:
                item.setdefault("kind", item_kind)
        return items, str(found.get("metadata", {}).get("resourceVersion", ""))

    async def watch(
        self,
        kind: Resource,
        namespace: str | None,
        *,
        resource_version: str,
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        call = verbs.Call("watch", kind, namespace)
        query = {"watch": "true", "timeoutSeconds": str(timeout_seconds)}
        query |= _selectors(label_selector, field_selector)
        if resource_version:
            query["resourceVersion"] = resource_version
        if bookmarks:
            query["allowWatchBookmarks"] = "true"
        # No total limit: the stream lives `timeout_seconds`; only a silent socket is an error.
        limit = aiohttp.ClientTimeout(
            total=None, connect=self._timeout, sock_read=timeout_seconds + WATCH_READ_SLACK
        )
        with _translated(call):
            response = await self._send("GET", kind.path(namespace), query=query, limit=limit)
        stream: aiohttp.ClientResponse = response.response
        try:
            while True:
                with _translated(call):
                    line = await stream.content.readline()
                    if not line:
                        return  # the server ended the stream (timeout, restart, drop)
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise client.ApiException(
                            status=status.get("code"),
                            reason=status.get("reason"),
                            body=json.dumps(status),
                        )
                yield str(event["type"]), event["object"]
        finally:
            stream.close()  # an unfinished stream cannot go back to the pool

    async def patch(
        self,
        kind: Resource,
        namespace: str | None,
        name: str,
        body: Obj | Items,
        *,
        patch_type: PatchType,
        subresource: str = "",
    ) -> Obj:
        action = str(verbs.Call(f"{patch_type}-patch", kind, namespace, name))
        action += f" ({subresource})" if subresource else ""
        if (patch_type == "json") != isinstance(body, list):
            raise TypeError(f"{action}: a JSON patch is a list of operations, other patches dicts")
        call = verbs.Call("patch", kind, namespace, name, text=action)
        content_type = PATCH_CONTENT_TYPES[patch_type]
        path = kind.path(namespace, name, subresource)
        return await self._json("PATCH", path, call, body=body, content_type=content_type)

    async def delete(
        self, kind: Resource, namespace: str | None, name: str, *, grace_seconds: int | None = None
    ) -> bool:
        query = {} if grace_seconds is None else {"gracePeriodSeconds": str(grace_seconds)}
        call, path = verbs.Call("delete", kind, namespace, name), kind.path(namespace, name)
        try:
            await self._retried(lambda: self._json("DELETE", path, call, query=query))
        except errors.ClusterNotFound:
            log.debug("%s %s/%s was already gone", kind.qualified, namespace, name)
            return False
        return True

    async def read_log(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        query = {"container": container} if container else {}
        if tail_lines is not None:
            query["tailLines"] = str(tail_lines)
        call = verbs.Call("get", PODS, namespace, pod)
        call = verbs.Call(
            "get", PODS, namespace, pod, text=str(call).replace("get", "read the log of", 1)
        )

        async def read() -> str:
            with _translated(call):
                response = await self._send(
                    "GET", PODS.path(namespace, pod, "log"), query=query, accept="*/*"
                )
                data: bytes = await response.read()  # type: ignore[no-untyped-call]
            return data.decode(errors="replace")

        return await self._retried(read)

    async def get_path(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        return await self._json("GET", path, verbs.Call("get", text=f"get {path}"), query=query)

    async def aclose(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]


def _load_client(
    kubeconfig: str | os.PathLike[str] | None, context: str | None
) -> client.ApiClient:
    """Worker thread: read the credentials, as `KubernetesApi.connect` says, into a new client.

    Nothing here is bound to an event loop: the client opens its aiohttp session on its first
    request, in the loop that makes it."""
    configuration = client.Configuration()
    source = os.fspath(kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config")
    try:
        if (
            kubeconfig is None
            and context is None
            and "KUBERNETES_SERVICE_HOST" in os.environ
            and SERVICE_TOKEN.exists()
        ):
            source = "the pod's service account"
            # reads the token and CA files; the client re-reads a rotated token itself
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            # A coroutine only so that exec plugins can run; it leaves plain values in
            # `configuration`, so a loop of this thread's own serves it.
            asyncio.run(
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=source,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            )
    except config.ConfigException as exc:
        raise errors.ConfigError(
            f"cannot load Kubernetes credentials from {source}: {exc}; pass a kubeconfig, "
            "set KUBECONFIG, or run the server in a pod with a service account"
        ) from exc
    return client.ApiClient(configuration)  # reads the CA and client certificate files


def _selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    query = {"labelSelector": label_selector} if label_selector else {}
    if field_selector:
        query["fieldSelector"] = field_selector
    return query
