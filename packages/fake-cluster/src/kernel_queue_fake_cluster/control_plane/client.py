"""A small synchronous client of the real API server, as its admin: the control plane's own
set-up (CRDs, webhooks, namespaces, tokens) and the tests' look at what is in the cluster.

Blocking calls over one TLS connection per request, with the plane's admin client certificate;
errors are `ApiError`s carrying the API server's Status. No Kubernetes client library: the
product's client is what the tests test, this only sets the stage and looks."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

RETRIES = 5
CORE_KINDS = {
    "Namespace": ("", "v1", "namespaces", False),
    "ServiceAccount": ("", "v1", "serviceaccounts", True),
    "Secret": ("", "v1", "secrets", True),
    "ConfigMap": ("", "v1", "configmaps", True),
    "Service": ("", "v1", "services", True),
    "Pod": ("", "v1", "pods", True),
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims", True),
    "Event": ("", "v1", "events", True),
    "Node": ("", "v1", "nodes", False),
}


class ApiError(RuntimeError):
    """The API server refused a request: `code` and its Status `reason` and `message`."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message
        self.retry_after: int | None = None


class AdminClient:
    """Requests to `url` as the client certificate's user (the plane's admin)."""

    def __init__(self, url: str, ca: Path, cert: Path, key: Path) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.load_cert_chain(str(cert), str(key))
        self._plurals: dict[tuple[str, str], tuple[str, bool]] = {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 30,
    ) -> Any:
        """One request; the decoded JSON answer (or text), or `ApiError`. A 429 (the API server
        is busy, or a CRD's storage is still initializing) is tried again after its
        Retry-After, up to `RETRIES` times."""
        for attempt in range(RETRIES + 1):
            try:
                return self._request(method, path, body, content_type, query, timeout)
            except ApiError as exc:
                if exc.code != 429 or attempt == RETRIES:
                    raise
                time.sleep(exc.retry_after or 1)
        raise AssertionError("unreachable")

    def _request(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: Mapping[str, str] | None,
        timeout: float,
    ) -> Any:
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        data = (
            None
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )
        try:
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        text = raw.decode(errors="replace")
        try:
            answer = json.loads(text) if text else None
        except json.JSONDecodeError:
            answer = text
        if response.status >= 400:
            status = answer if isinstance(answer, dict) else {}
            error = ApiError(
                response.status,
                str(status.get("reason", response.reason)),
                str(status.get("message", text)),
            )
            retry = response.getheader("Retry-After") or ""
            error.retry_after = int(retry) if retry.isdigit() else None
            raise error
        return answer

    # -- objects by kind -------------------------------------------------------------------------

    def path(
        self, api_version: str, kind: str, namespace: str | None, name: str | None = None
    ) -> str:
        """The REST path of `kind` at `api_version` (discovery decides plural and scope)."""
        group, _, version = api_version.rpartition("/")
        plural, namespaced = self._resource(group, version, kind)
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        where = f"/namespaces/{namespace or 'default'}" if namespaced else ""
        return f"{prefix}{where}/{plural}" + (f"/{name}" if name else "")

    def _resource(self, group: str, version: str, kind: str) -> tuple[str, bool]:
        key = (f"{group}/{version}", kind)
        if key not in self._plurals:
            where = f"/apis/{group}/{version}" if group else f"/api/{version}"
            for resource in self.request("GET", where)["resources"]:
                if "/" not in resource["name"]:
                    found = (resource["name"], bool(resource["namespaced"]))
                    self._plurals[(f"{group}/{version}", resource["kind"])] = found
        if key not in self._plurals:
            raise ApiError(
                404, "NotFound", f'no kind "{kind}" is served at {group or "core"}/{version}'
            )
        return self._plurals[key]

    def resource(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        name: str | None = None,
    ) -> str:
        """The REST path of `plural` (in `namespace`, None: every namespace or cluster scope)."""
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{prefix}{where}/{plural}" + (f"/{name}" if name else "")

    def apply(self, manifests: str | Iterable[Obj]) -> list[Obj]:
        """Create each object, or replace the one of its name (with its resourceVersion)."""
        docs = yaml.safe_load_all(manifests) if isinstance(manifests, str) else manifests
        stored = []
        for doc in (d for d in docs if d):
            meta = doc.get("metadata") or {}
            collection = self.path(doc["apiVersion"], doc["kind"], meta.get("namespace"))
            try:
                stored.append(self.request("POST", collection, doc))
            except ApiError as exc:
                if exc.code != 409:
                    raise
                stored.append(self._replace(f"{collection}/{meta['name']}", doc))
        return stored

    def _replace(self, target: str, doc: Obj) -> Obj:
        """PUT `doc` over the object at `target` unless it already says the same; a write that
        met another's (409 Conflict: a controller wrote the object meanwhile) is tried again."""
        for attempt in range(RETRIES + 1):
            current: Obj = self.request("GET", target)
            same = all(
                current.get(k) == v for k, v in doc.items() if k not in ("metadata", "status")
            )
            labels = (doc.get("metadata") or {}).get("labels")
            if same and (labels is None or current["metadata"].get("labels") == labels):
                return current
            meta = {
                **(doc.get("metadata") or {}),
                "resourceVersion": current["metadata"]["resourceVersion"],
            }
            try:
                replaced: Obj = self.request("PUT", target, {**doc, "metadata": meta})
                return replaced
            except ApiError as exc:
                if exc.code != 409 or attempt == RETRIES:
                    raise
        raise AssertionError("unreachable")

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, *, labels: str = ""
    ) -> list[Obj]:
        """Objects of `kind` (in `namespace`, or every namespace for None), by label selector."""
        group, _, version = api_version.rpartition("/")
        plural, namespaced = self._resource(group, version, kind)
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        where = f"/namespaces/{namespace}" if namespaced and namespace else ""
        query = {"labelSelector": labels} if labels else None
        return list(self.request("GET", f"{prefix}{where}/{plural}", query=query)["items"])

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """The object, or None when there is none of that name."""
        try:
            found: Obj = self.request("GET", self.path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return found

    def wait(self, what: str, check: Any, within: float = 60, step: float = 0.2) -> Any:
        """Call `check()` until it returns something true (returned), at most `within` s."""
        deadline = time.monotonic() + within
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except ApiError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(step)
        raise TimeoutError(f"{what} did not happen within {within:g} s (last: {last!r})")
