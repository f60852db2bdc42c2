"""How the fake API server reads paths, and what it says it serves.

Owns the apiserver's RequestInfo rules (which group, version, namespace, resource, name,
subresource and verb a request names, and its query parameters) and the discovery documents
(`/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}[/{version}]`) built from the store's
types. Pure functions over paths and types: no HTTP, no store writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_PREFIX = re.compile(r"/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>/.*)?")
_TRUE, _FALSE = {"1", "t", "T", "true", "True", "TRUE"}, {"0", "f", "F", "false", "False", "FALSE"}


def no_such_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


@dataclass(frozen=True)
class Target:
    """A resource request: "" group is core, "" namespace is all namespaces or cluster scope."""

    group: str
    version: str
    namespace: str
    plural: str
    name: str
    sub: str

    @property
    def resource(self) -> str:
        """RBAC's spelling: `pods`, `pods/status`."""
        return f"{self.plural}/{self.sub}" if self.sub else self.plural

    def attributes(self, verb: str) -> rbac.Attributes:
        return rbac.Attributes(verb, self.group, self.plural, self.sub, self.namespace, self.name)


def parse(path: str) -> Target | None:
    """The resource a path names, or None for discovery and other non-resource paths."""
    found = _PREFIX.fullmatch(path)
    if found is None or found["rest"] in (None, "/"):
        return None
    parts = found["rest"].strip("/").split("/")
    namespace = ""
    # /namespaces/{ns}/status and /finalize are the namespace's own subresources
    if parts[0] == "namespaces" and len(parts) > 2 and parts[2] not in ("status", "finalize"):
        namespace, parts = parts[1], parts[2:]
    if len(parts) > 3 or "" in parts:
        return None  # no resource path: only an extra route (or a 404) can answer it
    plural, name, sub = (*parts, "", "")[:3]
    return Target(found["group"] or "", found["version"] or "v1", namespace, plural, name, sub)


def verb(method: str, target: Target, watch: bool) -> str:
    """The RBAC verb of a resource request."""
    if method == "GET":
        return "watch" if watch else ("get" if target.name else "list")
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def flag(query: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter as Go's ParseBool reads it (`true`, `True`, `1`, ...)."""
    value = query.get(name, "false")
    if value not in _TRUE and value not in _FALSE:
        raise ApiError(400, "BadRequest", f"invalid {name} parameter: {value!r}")
    return value in _TRUE


def number(query: Mapping[str, str], name: str) -> int | None:
    """An integer query parameter, None when absent; 400 when not an integer."""
    value = query.get(name, "")
    try:
        return int(value) if value else None
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid {name} parameter: {value!r}") from None


def dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def document(store: Store, extra: Mapping[tuple[str, str], list[Obj]], path: str) -> Obj:
    """The discovery document at `path`; `extra` adds APIResources per (group, version)."""
    parts = path.strip("/").split("/")
    if parts == ["version"]:
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake", "platform": "fake"}
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    groups: dict[str, list[str]] = {}  # preferred (storage) version first; CRD groups first
    pairs = [(t.group, v) for t in store.types.values() for v in reversed(t.versions)]
    for group, version in [*pairs, *extra]:
        versions = groups.setdefault(group, [])
        if version not in versions:
            versions.append(version)
    groups.pop("", None)
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": _groups(groups)}
    if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
        return {"kind": "APIGroup", "apiVersion": "v1", **_groups(groups, parts[1])[0]}
    if parts == ["api", "v1"] or (
        parts[0] == "apis" and len(parts) == 3 and parts[2] in groups.get(parts[1], ())
    ):
        group, version = ("", "v1") if parts[0] == "api" else (parts[1], parts[2])
        resources = [
            entry
            for rtype in store.types.values()
            if rtype.group == group and version in rtype.versions
            for entry in _api_resources(rtype)
        ]
        resources += extra.get((group, version), [])
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "groupVersion": gv, "resources": resources}
    raise no_such_path()


def _groups(groups: Mapping[str, list[str]], only: str = "") -> list[Obj]:
    found = []
    for group, versions in groups.items():
        if only and group != only:
            continue
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        found.append({"name": group, "versions": listed, "preferredVersion": listed[0]})
    return found


def _api_resources(rtype: ResourceType) -> list[Obj]:
    entry: Obj = {"name": rtype.plural, "singularName": rtype.singular, "kind": rtype.kind}
    entry |= {"namespaced": rtype.namespaced, "verbs": VERBS}
    named = dict(entry)  # the resource itself; its subresources have no short names
    if rtype.short_names:
        named["shortNames"] = list(rtype.short_names)
    if rtype.categories:
        named["categories"] = list(rtype.categories)
    found = [named]
    if rtype.status_subresource:
        found.append(entry | {"name": f"{rtype.plural}/status", "singularName": ""})
        found[-1]["verbs"] = ["get", "patch", "update"]
    if rtype.key == ("", "pods"):
        binding = {"name": "pods/binding", "singularName": "", "kind": "Binding"}
        found.append(entry | binding | {"verbs": ["create"]})
        eviction = {"name": "pods/eviction", "singularName": "", "kind": "Eviction"}
        eviction |= {"group": "policy", "version": "v1"}
        found.append(entry | eviction | {"verbs": ["create"]})
    return found
