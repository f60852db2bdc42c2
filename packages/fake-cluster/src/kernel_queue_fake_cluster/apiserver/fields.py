"""Server-side field validation: the `fieldValidation` query parameter of create, update and
patch, which kubectl sends as `Strict` once the OpenAPI documents (`openapi.py`) say the server
takes it.

`Strict` refuses a body naming a field its kind's schema lacks (400 `strict decoding error:
unknown field "spec.foo"`), `Warn` serves it with a warning each; with `Strict` or `Warn` a
built-in kind's field of the wrong JSON type is refused as the apiserver's decoder words it
(`json: cannot unmarshal string into Go struct field Container.spec.containers.image of type
string`); custom kinds' types are the schema validation's (`schema.py`, 422). Without the
parameter (or with `Ignore`) nothing is checked here, as before. A patch is checked as sent
(its `$` directives aside), not as merged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel_queue_fake_cluster.apiserver import openapi
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType

DIRECTIVES = ("Ignore", "Warn", "Strict")
_ALWAYS = ("apiVersion", "kind")
_JSON_KINDS = {bool: "bool", int: "number", float: "number", str: "string", dict: "object"}
_GO_TYPES = {"string": "string", "boolean": "bool", "number": "float64", "object": "map"}


@dataclass
class _Findings:
    unknown: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


def check(rtype: ResourceType, version: str, directive: str, body: Any) -> list[str]:
    """Refuse `body` (an object or a merge/strategic patch) under `directive`; 400 for a
    directive other than Ignore, Warn or Strict. Returns the warnings `Warn` gives (the
    apiserver's `Warning` headers): `unknown field "spec.foo"`."""
    if not directive or directive == "Ignore":
        return []
    if directive not in DIRECTIVES:
        message = f'fieldValidation parameter unsupported: "{directive}" (use Ignore, Warn, Strict)'
        raise ApiError(400, "BadRequest", message)
    if not isinstance(body, dict):
        return []
    root, schemas = openapi.kind_schema(rtype, version)
    if not root:
        return []
    found = _Findings()
    _walk(body, {"$ref": openapi.REF + root}, schemas, "", "", found, top=True)
    what = f'{rtype.kind} in version "{version}" cannot be handled as a {rtype.kind}'
    if found.wrong and rtype.builtin:
        raise ApiError(400, "BadRequest", f"{what}: {found.wrong[0]}")
    if found.unknown and directive == "Strict":
        listed = ", ".join(f'unknown field "{path}"' for path in found.unknown)
        raise ApiError(400, "BadRequest", f"{what}: strict decoding error: {listed}")
    return [f'unknown field "{path}"' for path in found.unknown]


def _resolve(schema: Obj, schemas: Mapping[str, Obj], struct: str) -> tuple[Obj, str]:
    """`schema` with its `$ref` (bare or as a one-element allOf) followed; the Go struct name."""
    for _ in range(8):
        ref = schema.get("$ref")
        if ref is None and len(schema.get("allOf") or []) == 1:
            ref = schema["allOf"][0].get("$ref")
        if not isinstance(ref, str):
            break
        name = ref.removeprefix(openapi.REF)
        target = schemas.get(name) or openapi.definitions().get(name) or {}
        merged = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
        schema, struct = {**target, **merged}, name.rpartition(".")[2]
    return schema, struct


def _walk(
    value: Any,
    schema: Obj,
    schemas: Mapping[str, Obj],
    path: str,
    struct: str,
    found: _Findings,
    *,
    top: bool = False,
) -> None:
    schema, struct = _resolve(schema, schemas, struct)
    if value is None or (
        schema.get("x-kubernetes-preserve-unknown-fields") and not isinstance(value, dict)
    ):
        return
    expected = schema.get("type")
    if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            _wrong(value, path, struct, "intstr.IntOrString", found)
        return
    if schema.get("format") == "quantity":
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            _wrong(value, path, struct, "resource.Quantity", found)
        return
    if isinstance(value, dict):
        if expected not in (None, "object"):
            _wrong(value, path, struct, _go(schema), found)
            return
        _object(value, schema, schemas, path, struct, found, top=top)
    elif isinstance(value, list):
        if expected not in (None, "array"):
            _wrong(value, path, struct, _go(schema), found)
            return
        items = schema.get("items") or {}
        for i, item in enumerate(value):
            _walk(item, items, schemas, f"{path}[{i}]", struct, found)
    elif isinstance(expected, str) and not _fits(value, expected):
        _wrong(value, path, struct, _go(schema), found)


def _object(
    value: Obj,
    schema: Obj,
    schemas: Mapping[str, Obj],
    path: str,
    struct: str,
    found: _Findings,
    *,
    top: bool,
) -> None:
    properties: Mapping[str, Obj] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    free = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    for key, item in value.items():
        if key.startswith("$"):
            continue  # a strategic merge patch's directive ($patch, $setElementOrder/...)
        where = f"{path}.{key}" if path else key
        if key in properties:
            _walk(item, properties[key], schemas, where, struct, found)
        elif isinstance(extra, dict):
            _walk(item, extra, schemas, where, struct, found)
        elif not (free or (top and key in _ALWAYS) or (not properties and extra is None)):
            found.unknown.append(where)


def _fits(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return expected == "boolean"
    if isinstance(value, int):
        return expected in ("integer", "number")
    if isinstance(value, float):
        return expected == "number" or (expected == "integer" and value.is_integer())
    return isinstance(value, str) and expected == "string"


def _go(schema: Obj) -> str:
    """The Go type a schema stands for, as the decoder names it."""
    expected = schema.get("type")
    if expected == "integer":
        return str(schema.get("format") or "int64")
    if expected == "array":
        return "[]" + _go(schema.get("items") or {})
    return _GO_TYPES.get(str(expected), "struct")


def _wrong(value: Any, path: str, struct: str, go_type: str, found: _Findings) -> None:
    kind = "array" if isinstance(value, list) else _JSON_KINDS.get(type(value), "value")
    dotted = ".".join(part.partition("[")[0] for part in path.split("."))
    found.wrong.append(
        f"json: cannot unmarshal {kind} into Go struct field {struct}.{dotted} of type {go_type}"
    )
