"""`KubeApi`: the Kubernetes API verbs kernel-queue calls, on plain dicts, and what they raise.

The seam between the kubernetes backend (with its informers, reaper and clean-up) and the API
server: those modules type against `KubeApi` and catch the errors below, and never import the
`kubernetes` client, which only `kube.client.api` (`KubernetesApi`, the implementation) does. The
error classes carry what the server's Status said and `Call` names the request in their messages;
`kube.client.api.api_error` makes them. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kernel_queue import errors
from kernel_queue.kube import kueue

Obj = dict[str, Any]
"""A Kubernetes object (or list, or Status) as JSON decodes it."""
Items = list[Obj]
PatchType = Literal["json", "merge", "strategic"]

PATCH_CONTENT_TYPES: Mapping[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
"""The Content-Type each patch type is sent with (custom resources accept no strategic)."""

# Where a kind is served; one definition, beside every other Kubernetes and Kueue key.
Resource = kueue.Kind


class KubeApi(Protocol):
    """The API verbs the Kubernetes backend and the informers call. Bodies are plain dicts;
    every error is a `ClusterApiError` whose message is the API server's own."""

    async def create(self, kind: Resource, namespace: str | None, body: Obj) -> Obj:
        """POST `body`; return the object as stored."""
        ...

    async def get(self, kind: Resource, namespace: str | None, name: str) -> Obj:
        """Read one object; `ClusterNotFound` when it does not exist."""
        ...

    async def list(
        self,
        kind: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[Items, str]:
        """The matching objects and the list's resourceVersion (to watch from)."""
        ...

    def watch(
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
        """Yield (type, object) from `resource_version` on ("ADDED", "MODIFIED", "DELETED",
        "BOOKMARK") until the server ends the stream; an ERROR event raises its error
        (`ClusterGone` for 410). Close the iterator (`aclose`) to end it early."""
        ...

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
        """PATCH with the content type of `patch_type`; return the object as stored."""
        ...

    async def delete(
        self, kind: Resource, namespace: str | None, name: str, *, grace_seconds: int | None = None
    ) -> bool:
        """Delete one object: True when the server took the delete (the object is gone or
        going), False when it was already gone (404)."""
        ...

    async def read_log(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        """A pod container's log text (the last `tail_lines` lines)."""
        ...

    async def get_path(self, path: str, query: Mapping[str, str] | None = None) -> Obj:
        """GET any JSON path, e.g. an aggregated API such as Kueue's visibility API."""
        ...

    async def aclose(self) -> None:
        """Close every connection (open watches included)."""
        ...


@dataclass(frozen=True)
class Call:
    """What one request does, as its errors name it: `create pods "p" in namespace "ns"`."""

    verb: str
    kind: Resource | None = None
    namespace: str | None = None
    name: str = ""
    text: str = ""  # said instead (a path that is no kind of ours, a subresource)

    def __str__(self) -> str:
        if self.text or self.kind is None:
            return self.text
        what = f'{self.kind.qualified} "{self.name}"' if self.name else self.kind.qualified
        where = (
            f' in namespace "{self.namespace}"' if self.kind.namespaced and self.namespace else ""
        )
        return f"{self.verb} {what}{where}"


class NotFound(errors.ClusterNotFound):
    """A 404 with the `details` of the server's Status: `name`, `kind` (and `group`) of the
    object that does not exist; empty when the server named none, as for a path it does not
    serve (an API group that is not installed)."""

    def __init__(self, status: int, reason: str, message: str, details: Mapping[str, Any]) -> None:
        super().__init__(status, reason, message)
        self.details = details


class Forbidden(errors.ClusterForbidden):
    """A 401 or 403, with what was refused: `verb`, `resource` (``pods``,
    ``workloads.kueue.x-k8s.io``), `namespace` (None for a cluster-scoped kind) and `user` (the
    identity the server named in its message, "" when it named none)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        verb: str = "",
        resource: str = "",
        namespace: str | None = None,
    ) -> None:
        super().__init__(status, reason, message)
        self.verb, self.resource, self.namespace = verb, resource, namespace
        found = re.search(r'User "([^"]*)"', message)
        self.user = found.group(1) if found else ""


class Unavailable(errors.ClusterUnavailable):
    """A 429, a 5xx, a timeout or a lost connection, with the `Retry-After` seconds the server
    asked for (None when it did not)."""

    def __init__(
        self, status: int, reason: str, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(status, reason, message)
        self.retry_after = retry_after
