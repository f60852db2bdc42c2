"""The resource verbs of the fake API server: one request on a resource path, onto the store.

GET (one object or a list), POST (and a pod's `binding` and `eviction`), PUT, PATCH and DELETE
(one object or a collection, with a uid precondition), with the
apiserver's rules for which path takes which verb, the JSON-only bodies of POST and PUT (415
otherwise), the DELETE options, and every body read and answered at the version the path names
(the store converts). Watches, routing, RBAC and faults come before this, in `server.py`; object
semantics after, in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver import discovery, fields, pod_rules, protobuf
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store

BODY_TYPES = ("", "application/json", "*/*", protobuf.MEDIA_TYPE)
"""Content types a POST or PUT body may have (a client that sends none means JSON; protobuf
for the built-in kinds kubectl creates, `protobuf.py`)."""

OBJECT_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
"""Patches shaped as the object, whose fields `fields.check` can read."""


POD_ACTIONS = ("binding", "eviction")
"""A pod's subresources one POSTs to (a scheduler's binding, an eviction)."""


def serve(
    store: Store,
    method: str,
    rtype: ResourceType,
    target: discovery.Target,
    query: Mapping[str, str],
    media: str,
    body: Callable[[], Any],
    warn: Callable[[str], None] = lambda text: None,
) -> tuple[int, Obj]:
    """The status and body answering `method` on `target`; `media` is the request's content
    type (lower case, no parameters), `body()` its parsed JSON (read only once it is needed);
    `warn(text)` is told each warning for the client (`fieldValidation=Warn`)."""
    version = target.version
    key = (target.group, target.plural, target.namespace or None)
    labels, by_fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
    name, sub = target.name, target.sub

    def served(obj: Obj) -> Obj:
        return store.versions.at(rtype, obj, version)

    if method == "GET" and not name:
        items, rv = store.list_objects(*key, labels=labels, fields=by_fields)
        return 200, collection(store, rtype, version, items, rv)
    if method == "DELETE" and not name:
        items = store.delete_collection(*key, labels=labels, fields=by_fields)
        return 200, collection(store, rtype, version, items, store.resource_version)
    if method == "GET":
        return 200, store.get(*key, name, version=version)
    if (method == "POST") == bool(name) and not (method == "POST" and sub in POD_ACTIONS):
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on this path")
    if method in ("POST", "PUT") and (
        media not in BODY_TYPES or (media == protobuf.MEDIA_TYPE and not rtype.builtin)
    ):
        message = "the body of the request was in an unknown format - accepted media types "
        accepted = "application/json" + (f", {protobuf.MEDIA_TYPE}" if rtype.builtin else "")
        raise ApiError(415, "UnsupportedMediaType", f"{message}include: {accepted}")
    sent = body()
    if method in ("POST", "PUT") or media in OBJECT_PATCHES:
        for warning in fields.check(rtype, version, query.get("fieldValidation", ""), sent):
            warn(warning)
    if method == "PATCH":
        patched = store.patch(*key, name, sent, media, subresource=sub, version=version)
        return 200, served(patched)
    if method == "DELETE":
        options = sent if isinstance(sent, dict) else {}
        grace = options.get("gracePeriodSeconds", discovery.number(query, "gracePeriodSeconds"))
        uid = (options.get("preconditions") or {}).get("uid")
        return 200, served(store.delete(*key, name, grace_seconds=grace, uid=uid))
    if not isinstance(sent, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    if sub == "binding":
        return 201, pod_rules.bind(store, target.namespace, name, sent)
    if sub == "eviction":
        return 201, pod_rules.evict(store, target.namespace, name, sent)
    if method == "POST":
        return 201, served(store.create(*key, sent, version=version))
    given = (sent.get("metadata") or {}).get("name")
    if given and given != name:
        message = f"the name of the object ({given}) does not match the name on the URL"
        raise ApiError(400, "BadRequest", f"{message} ({name})")
    return 200, served(store.replace(*key, name, sent, subresource=sub, version=version))


def collection(store: Store, rtype: ResourceType, version: str, items: list[Obj], rv: int) -> Obj:
    """A `<Kind>List` of `items` (stored objects) at `version`, as of resourceVersion `rv`."""
    return {
        "kind": f"{rtype.kind}List",
        "apiVersion": rtype.api_version(version),
        "metadata": {"resourceVersion": str(rv)},
        "items": [store.versions.at(rtype, item, version) for item in items],
    }
