"""The fake API server's HTTP layer: tornado on 127.0.0.1, in the caller's event loop.

Maps `/api/v1/...` and `/apis/{group}/{version}/...` requests onto `store.Store` calls (path
rules and discovery in `discovery.py`, the resource verbs in `crud.py`, watch streams in
`watches.py`, RBAC rules in `rbac.py`), answers JSON with `Status` errors, serves extra routes
(`add_route`: the fake Kueue's visibility API, the node agent's pod logs), injects faults and
counts requests. Object semantics live in the store, not here; no threads.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from kernel_queue_fake_cluster.apiserver import (
    crud,
    discovery,
    faults,
    openapi,
    protobuf,
    rbac,
    tables,
    watches,
)
from kernel_queue_fake_cluster.apiserver.changes import Subscription
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.resources import RBAC_GROUP
from kernel_queue_fake_cluster.apiserver.store import Store

POD_LOG = r"/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)/log"

_REASONS = faults.REASONS


@dataclass(frozen=True)
class Request:
    """What an extra route's handler sees."""

    method: str
    path: str
    params: Mapping[str, str]
    """The route pattern's named groups."""
    query: Mapping[str, str]
    """The last value of each query parameter."""
    body: Any
    """The JSON body, None when empty."""
    user: rbac.User | None
    """The authenticated user; None when RBAC is off."""


RouteResult = Obj | str
RouteHandler = Callable[[Request], RouteResult | Awaitable[RouteResult]]
"""Returns a JSON object (200, application/json) or text (200, text/plain); raises ApiError."""
LogProvider = Callable[[str, str, str | None, int | None], str | None]
"""`logs(namespace, pod, container, tail_lines)`: the log text, or None (404)."""


@dataclass(frozen=True)
class Stats:
    """A snapshot of what a server has served since it was made."""

    requests: collections.Counter[tuple[str, str]]
    """By (verb, resource), e.g. ("patch", "pods/status"); discovery as ("get", "/api/v1")."""
    watches: int
    """Watch streams open now."""
    peak_watches: int
    peak_requests: int
    """The most requests the server held at once (a watch counts while it streams)."""


class Server:
    """A fake Kubernetes API server over `store`, served on 127.0.0.1 in the running loop.

    `tokens` (bearer token → user name or `rbac.User`) turns RBAC on: policy is the store's
    Role/ClusterRole/RoleBinding/ClusterRoleBinding objects, seeded with `rbac_objects` at
    `start()`; members of `system:masters` may do anything. Without tokens all is allowed.
    """

    def __init__(
        self,
        store: Store,
        *,
        tokens: Mapping[str, str | rbac.User] | None = None,
        rbac_objects: Iterable[Obj] = (),
        latency: float = 0.0,
        bookmark_interval: float = 1.0,
        port: int = 0,
        system_agents: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.system_agents = tuple(system_agents)
        """User-Agent prefixes of the cluster's own components (the node agent): their requests
        are not counted in `stats` and meet no injected fault and no added latency, as the
        in-process controllers never do; faults and counts are for the client under test."""
        self.latency = latency
        """Seconds every request waits (asyncio.sleep) before it is served."""
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._serving = self._peak_serving = 0  # requests held now, and the most at once
        self._port = port
        self._users = (
            None
            if tokens is None
            else {t: u if isinstance(u, rbac.User) else rbac.User(u) for t, u in tokens.items()}
        )
        self._rbac_objects = list(rbac_objects)
        self._policy: rbac.Policy | None = None
        self._routes: list[tuple[str, re.Pattern[str], RouteHandler]] = []
        self._extra: dict[tuple[str, str], list[Obj]] = {}
        self.faults = faults.Faults()
        """Injected faults, met by the next requests of their verb and resource."""
        self.watches = watches.Watches(store, bookmark_interval)
        self._http: tornado.httpserver.HTTPServer | None = None

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>` once started."""
        if self._http is None:
            raise RuntimeError("the fake API server is not started")
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (port 0: any free port) in the running loop and return."""
        if self._users is not None:
            for plural in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"):
                if (RBAC_GROUP, plural) in self.store.types:
                    self.store.add_admission(RBAC_GROUP, plural, self._policy_changed)
            for obj in self._rbac_objects:
                plural = obj["kind"].lower() + "s"
                self.store.create(RBAC_GROUP, plural, obj["metadata"].get("namespace"), obj)
        app = tornado.web.Application([(r".*", _Handler, {"server": self})], log_function=_quiet)
        sockets = tornado.netutil.bind_sockets(self._port, "127.0.0.1")
        self._port = sockets[0].getsockname()[1]
        self._http = tornado.httpserver.HTTPServer(app)
        self._http.add_sockets(sockets)

    async def stop(self) -> None:
        """Stop listening, end open watch streams and close connections (bounded)."""
        if self._http is None:
            return
        self._http.stop()
        try:
            async with asyncio.timeout(5):
                await self.watches.drain()
                await self._http.close_all_connections()
        except TimeoutError:
            pass

    # -- extension points --------------------------------------------------------------

    def add_route(self, method: str, pattern: str, handler: RouteHandler) -> None:
        """Serve `method` on paths fully matching `pattern` with `handler`, before the
        built-in resource paths. RBAC attributes come from the path as for any resource."""
        self._routes.append((method.upper(), re.compile(pattern), handler))

    def add_api_resource(self, group: str, version: str, resource: Obj) -> None:
        """List an APIResource (`{"name", "kind", "namespaced", "verbs"}`) in discovery, so
        kubectl sees routes added with `add_route`."""
        self._extra.setdefault((group, version), []).append(resource)

    def serve_logs(self, provider: LogProvider) -> None:
        """Answer `GET .../pods/{name}/log` (`container`, `tailLines`) from `provider`."""

        def logs(request: Request) -> str:
            namespace, name = request.params["namespace"], request.params["name"]
            self.store.get("", "pods", namespace, name)
            tail = discovery.number(request.query, "tailLines")
            text = provider(namespace, name, request.query.get("container"), tail)
            if text is None:
                raise ApiError(404, "NotFound", f'no logs for pod "{name}" in "{namespace}"')
            return text

        self.add_route("GET", POD_LOG, logs)

    # -- fault injection and stats -------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """Request counts, open/peak watch streams and peak requests at once, as of now."""
        open_now = len(self.watches.open)
        counts = collections.Counter(self._requests)
        return Stats(counts, open_now, self.watches.peak, self._peak_serving)

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
        """Answer the next `count` requests of `verb` (RBAC verbs: get, list, watch, create,
        update, patch, delete, deletecollection) on `plural` (subresources as "pods/status")
        with a `status` error instead of serving them; `retry_after` sends that header, `after`
        serves each request first (the change is made, its answer lost)."""
        fault = faults.Fault(status, retry_after=retry_after, after=after)
        self.faults.add(verb, plural, fault, count)

    def plant_next(
        self, plural: str, labels: Mapping[str, str] | None = None, count: int = 1
    ) -> None:
        """Before each of the next `count` creates on `plural`, create an object of the same
        name carrying only `labels` (someone else's): the create meets a real 409."""
        self.faults.add("create", plural, faults.Fault(0, plant=dict(labels or {})), count)

    def drop_watches(self) -> None:
        """End every open watch stream now, as a restarting apiserver does."""
        self.watches.drop()

    def expire_next_watch(self, count: int = 1) -> None:
        """The next `count` watch requests get a single ERROR line with Status 410 Expired."""
        self.watches.expire += count

    # -- request handling (called by _Handler) ----------------------------------------

    def _policy_changed(self, op: str, new: Obj | None, old: Obj | None) -> None:
        self._policy = None

    def _authorize(
        self, header: str, target: discovery.Target | None, verb: str
    ) -> rbac.User | None:
        if self._users is None:
            return None
        scheme, _, token = header.partition(" ")
        user = self._users.get(token) if scheme.lower() == "bearer" else None
        if user is None:
            raise rbac.unauthorized()
        if target is None:
            return user  # discovery is open to every authenticated user (system:discovery)
        if self._policy is None:
            self._policy = rbac.Policy(
                obj
                for plural in ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
                for obj in self.store.objects(RBAC_GROUP, plural)
            )
        attributes = target.attributes(verb)
        if not self._policy.allows(user, attributes):
            raise rbac.forbidden(user, attributes)
        return user

    def _route(self, method: str, path: str) -> tuple[RouteHandler, dict[str, str]] | None:
        other = False
        for route_method, pattern, handler in self._routes:
            found = pattern.fullmatch(path)
            if found and route_method == method:
                return handler, found.groupdict()
            other = other or found is not None
        if other:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
        return None

    async def _serve(self, handler: _Handler) -> tuple[int, RouteResult] | None:
        """The reply for one request, or None once a watch stream has been written."""
        agent = handler.request.headers.get("User-Agent", "")
        if self.system_agents and agent.startswith(self.system_agents):
            return await self._answer(handler, system=True)
        self._serving += 1
        self._peak_serving = max(self._peak_serving, self._serving)
        try:
            return await self._answer(handler)
        finally:
            self._serving -= 1

    async def _answer(
        self, handler: _Handler, *, system: bool = False
    ) -> tuple[int, RouteResult] | None:
        request, method = handler.request, handler.request.method or "GET"
        if self.latency and not system:
            await asyncio.sleep(self.latency)
        path = request.path if "%" not in request.path else urllib.parse.unquote(request.path)
        query = {k: v[-1].decode() for k, v in request.query_arguments.items()}
        target = discovery.parse(path)
        watch = discovery.flag(query, "watch") if method == "GET" and target else False
        verb = discovery.verb(method, target, watch) if target else method.lower()
        resource = target.resource if target else path
        if not system:
            self._requests[(verb, resource)] += 1
        user = self._authorize(request.headers.get("Authorization", ""), target, verb)
        fault = self.faults.take(verb, resource) if self.faults and not system else None
        if fault is not None and not fault.after and fault.plant is None:
            raise fault.error(verb, resource)
        if query.get("dryRun"):
            raise ApiError(400, "BadRequest", "dryRun is not supported by the fake API server")
        route = self._route(method, path) if self._routes else None
        if route is not None:
            result = route[0](Request(method, path, route[1], query, handler.json_body(), user))
            return 200, await result if inspect.isawaitable(result) else result
        if target is None:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
            if path.startswith("/openapi/"):
                return 200, openapi.serve(self.store, path)
            return 200, discovery.document(self.store, self._extra, path)
        rtype = self.store.type(target.group, target.plural)
        binding = target.sub in crud.POD_ACTIONS and rtype.key == ("", "pods") and method == "POST"
        if (
            target.version not in rtype.versions
            or (target.namespace and not rtype.namespaced)
            or (target.name and rtype.namespaced and not target.namespace)
            or (
                target.sub
                and not binding
                and (target.sub != "status" or not rtype.status_subresource)
            )
        ):
            raise discovery.no_such_path()
        as_table = tables.wanted(request.headers.get("Accept", "")) and not target.sub
        if watch:
            present = (
                (lambda obj: tables.table(rtype, target.version, obj, query)) if as_table else None
            )
            await self.watches.serve(handler, rtype, target, query, present, counted=not system)
            return None
        if rtype.namespaced and not target.namespace and method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
        planted = fault.planted(handler.json_body()) if fault is not None else None
        if planted is not None:
            self.store.create(target.group, target.plural, target.namespace or None, planted)
        media = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        answer = crud.serve(
            self.store, method, rtype, target, query, media, handler.json_body, handler.warn
        )
        if fault is not None and fault.after:
            raise fault.error(verb, resource)
        if method == "GET" and as_table:
            return answer[0], tables.table(rtype, target.version, answer[1], query)
        return answer


def _quiet(handler: tornado.web.RequestHandler) -> None:
    """No access log: hundreds of requests per test would drown the output."""


class _Handler(tornado.web.RequestHandler):
    """Every path: hands the request to `Server._serve` and writes errors as `Status`."""

    server: Server
    subscription: Subscription | None = None

    def initialize(self, server: Server) -> None:
        self.server = server

    async def _any(self) -> None:
        try:
            answer = await self.server._serve(self)
        except ApiError as exc:
            answer = exc.code, exc.status()
            seconds = getattr(exc, "retry_after", None)
            if seconds is not None:
                self.set_header("Retry-After", str(seconds))
        if answer is not None and not self._finished:
            self.reply(*answer)

    get = post = put = patch = delete = _any

    def warn(self, text: str) -> None:
        """A `Warning` header, as the apiserver sends them (code 299, no agent)."""
        self.add_header("Warning", f"299 - {json.dumps(text)}")

    def compute_etag(self) -> str | None:
        return None

    def json_body(self) -> Any:
        """The body as JSON: parsed, or read from protobuf (`protobuf.py`); None when empty."""
        media = (self.request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if media == protobuf.MEDIA_TYPE and self.request.body:
            return protobuf.decode(self.request.body)
        try:
            return json.loads(self.request.body) if self.request.body else None
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from None

    def reply(self, code: int, body: Obj | str) -> None:
        self.set_status(code)
        if isinstance(body, str):
            self.set_header("Content-Type", "text/plain")
            self.finish(body)
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(discovery.dump(body))

    def on_connection_close(self) -> None:
        if self.subscription is not None:
            self.subscription.close()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None))[1]
        message = str(error) if error is not None else self._reason
        reason = _REASONS.get(status_code, "InternalError")
        self.reply(status_code, ApiError(status_code, reason, message).status())
