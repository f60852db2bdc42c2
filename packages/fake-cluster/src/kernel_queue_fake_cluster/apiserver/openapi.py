"""The OpenAPI v3 documents the fake API server publishes, as kubectl reads them.

`/openapi/v3` lists one document per served group-version; each document has the paths of that
group-version's resources (with the `fieldValidation` parameter kubectl looks for before it
leaves validation to the server) and the schemas of its kinds. Built-in kinds take Kubernetes'
own schemas of one minor (`KUBERNETES`), read at run time from the `kubernetes-validate`
package's JSON schemas and turned back into OpenAPI's form; custom kinds take their CRD's
`openAPIV3Schema`, with ObjectMeta for `metadata`. Documents only; `fields.py` checks bodies.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store

KUBERNETES = "v1.32.0"
"""The Kubernetes release whose schemas the built-in kinds have (as `/version` says)."""
SCHEMAS = f"kubernetes-json-schema/{KUBERNETES}-local/_definitions.json"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
REF = "#/components/schemas/"
_SPECIAL = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "type": "string",
        "format": "int-or-string",
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string", "format": "quantity"},
}
"""Kinds of value the JSON schemas spell as `oneOf`, in OpenAPI's own spelling."""


def group_versions(store: Store) -> list[tuple[str, str]]:
    """The (group, version) pairs served, core first."""
    found = {(t.group, v) for t in store.types.values() for v in t.versions}
    return sorted(found)


def path_of(group: str, version: str) -> str:
    """The document's name under /openapi/v3: `api/v1`, `apis/<group>/<version>`."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def serve(store: Store, path: str) -> Obj:
    """The document at `path`: `/openapi/v3` (the index) or `/openapi/v3/<group-version>`."""
    if path.rstrip("/") == "/openapi/v3":
        return index(store)
    if path.startswith("/openapi/v3/"):
        return document(store, path.removeprefix("/openapi/v3/").strip("/"))
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


def index(store: Store) -> Obj:
    """The `/openapi/v3` discovery document: one entry per group-version, with a hash."""
    paths = {}
    for group, version in group_versions(store):
        name = path_of(group, version)
        digest = _hash(store, group, version)
        paths[name] = {"serverRelativeURL": f"/openapi/v3/{name}?hash={digest}"}
    return {"paths": paths}


def document(store: Store, name: str) -> Obj:
    """The OpenAPI v3 document `name` (`api/v1`, `apis/<group>/<version>`); 404 if not served."""
    for group, version in group_versions(store):
        if path_of(group, version) == name:
            break
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    rtypes = [t for t in store.types.values() if t.group == group and version in t.versions]
    schemas: dict[str, Obj] = {}
    paths: dict[str, Obj] = {}
    for rtype in rtypes:
        root, found = kind_schema(rtype, version)
        schemas.update(found)
        paths.update(_paths(rtype, version, root))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBERNETES},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def kind_schema(rtype: ResourceType, version: str) -> tuple[str, dict[str, Obj]]:
    """The name of `rtype`'s schema at `version` and every schema it needs, by name."""
    if rtype.builtin:
        name = _builtin_names().get((rtype.group, version, rtype.kind))
        if name is None:
            return "", {}
        return name, dict(_closure(name))
    name = custom_name(rtype, version)
    return name, {name: _custom(rtype, version), **_closure(OBJECT_META)}


def custom_name(rtype: ResourceType, version: str) -> str:
    """`io.x-k8s.kueue.v1beta2.Workload` for kueue.x-k8s.io/v1beta2 Workload."""
    return ".".join([*reversed(rtype.group.split(".")), version, rtype.kind])


def definitions() -> Mapping[str, Obj]:
    """Every built-in schema by name, in OpenAPI form (read once, then shared: read-only)."""
    return _definitions()


@functools.cache
def _definitions() -> dict[str, Obj]:
    # find_spec locates the package without importing it (its import pulls in jsonschema)
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the fake API server needs kubernetes-validate's schemas")
    source = Path(next(iter(spec.submodule_search_locations))) / SCHEMAS
    raw = json.loads(source.read_text(encoding="utf-8"))["$defs"]
    found: dict[str, Obj] = {}
    for name, schema in raw.items():
        if name in _SPECIAL:
            found[name] = {"description": schema.get("description", ""), **_SPECIAL[name]}
        else:
            found[name] = _openapi(schema)
    return found


@functools.cache
def _builtin_names() -> dict[tuple[str, str, str], str]:
    names = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            names[(gvk["group"], gvk["version"], gvk["kind"])] = name
    return names


def _openapi(schema: Any) -> Any:
    """A JSON schema of kubernetes-validate turned back into OpenAPI v3: `$ref`s into
    components (wrapped in allOf beside other keywords, as Kubernetes publishes them) and
    `["string", "null"]` types as one type."""
    if not isinstance(schema, dict):
        return schema
    out: Obj = {}
    for key, value in schema.items():
        if key in ("$schema", "$id", "$ref"):
            continue
        if key == "properties":
            out[key] = {name: _openapi(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _openapi(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_openapi(sub) for sub in value]
        else:
            out[key] = value
    if isinstance(out.get("type"), list):
        types = [t for t in out["type"] if t != "null"]
        out["type"] = types[0] if len(types) == 1 else types
    ref = schema.get("$ref")
    if isinstance(ref, str):
        ref = REF + ref.rpartition("/")[2]
        if not out:
            return {"$ref": ref}
        out["allOf"] = [{"$ref": ref}]
    return out


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            yield ref[len(REF) :]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


@functools.cache
def _closure(name: str) -> Mapping[str, Obj]:
    """`name` and every built-in schema it refers to, transitively."""
    found: dict[str, Obj] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found or current not in _definitions():
            continue
        found[current] = _definitions()[current]
        todo.extend(_refs(found[current]))
    return found


def _custom(rtype: ResourceType, version: str) -> Obj:
    schema = copy.deepcopy(rtype.schemas.get(version) or {"type": "object"})
    properties = schema.setdefault("properties", {})
    properties["metadata"] = {"allOf": [{"$ref": REF + OBJECT_META}]}
    group_version_kind = {"group": rtype.group, "version": version, "kind": rtype.kind}
    schema["x-kubernetes-group-version-kind"] = [group_version_kind]
    return dict(schema)


def _paths(rtype: ResourceType, version: str, root: str) -> dict[str, Obj]:
    prefix = f"/apis/{rtype.group}/{version}" if rtype.group else f"/api/{version}"
    scope = "/namespaces/{namespace}" if rtype.namespaced else ""
    collection = f"{prefix}{scope}/{rtype.plural}"
    gvk = {"group": rtype.group, "version": version, "kind": rtype.kind}
    body = {"content": {"application/json": {"schema": {"$ref": REF + root}}}} if root else {}
    reply = {"200": {"description": "OK", **body}}
    validation = {
        "name": "fieldValidation",
        "in": "query",
        "description": "Ignore, Warn or Strict: what the server does with unknown fields.",
        "schema": {"type": "string", "uniqueItems": True},
    }

    def operation(action: str, verb: str, *, validated: bool = False) -> Obj:
        return {
            "operationId": f"{verb}{rtype.kind}",
            "parameters": [validation] if validated else [],
            "responses": reply,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        }

    return {
        collection: {
            "get": operation("list", "list"),
            "post": operation("post", "create", validated=True),
        },
        f"{collection}/{{name}}": {
            "get": operation("get", "read"),
            "put": operation("put", "replace", validated=True),
            "patch": operation("patch", "patch", validated=True),
            "delete": operation("delete", "delete"),
        },
    }


def _hash(store: Store, group: str, version: str) -> str:
    """A digest of what the document says, so kubectl's cache (keyed by it) never serves a
    stale one: the kinds, and each custom kind's schema at this version."""
    kinds = sorted(
        (t.plural, t.kind, t.builtin, _digest(t.schemas.get(version)))
        for t in store.types.values()
        if t.group == group and version in t.versions
    )
    text = json.dumps([KUBERNETES, group, version, kinds])
    return hashlib.sha512(text.encode()).hexdigest()[:64].upper()


_DIGESTS: dict[int, tuple[object, str]] = {}
"""id(schema) → (the schema, kept so the id is not reused; its digest): schemas are shared
and read-only (`crds.load`), so each is digested once."""


def _digest(schema: Obj | None) -> str:
    if schema is None:
        return ""
    found = _DIGESTS.get(id(schema))
    if found is None or found[0] is not schema:
        if len(_DIGESTS) >= 256:  # many CRD sources in one process (tests): start afresh
            _DIGESTS.clear()
        text = json.dumps(schema, sort_keys=True)
        found = _DIGESTS[id(schema)] = (schema, hashlib.sha256(text.encode()).hexdigest())
    return found[1]
