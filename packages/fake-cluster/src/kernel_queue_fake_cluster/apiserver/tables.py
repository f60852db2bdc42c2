"""Server-side printing: a `meta.k8s.io/v1` Table instead of an object or a list, when the
client asks for one (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, as `kubectl get`
does), with the columns a real cluster shows.

Built-in kinds take the apiserver's own printers (`printers.py`: pods, Services, Nodes, Events
and more; other kinds Name and Age), the `-o wide` columns at priority 1; custom kinds
take their CRD's `additionalPrinterColumns` (a simple JSONPath each, dates as ages), or Name and
Age when it declares none. Each row carries the object's metadata (PartialObjectMetadata), or
the object itself for `includeObject=Object`. Pure: objects in, a Table out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver import printers
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType


def wanted(accept: str) -> bool:
    """Whether an Accept header asks for a Table (meta.k8s.io v1 or v1beta1)."""
    for media in accept.split(","):
        params = dict(
            part.strip().partition("=")[::2] for part in media.split(";")[1:] if "=" in part
        )
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
    return False


def table(rtype: ResourceType, version: str, body: Obj, query: Mapping[str, str]) -> Obj:
    """The Table of `body` (one object or a `<Kind>List`) of `rtype` at `version`."""
    items = body["items"] if "items" in body and body.get("kind", "").endswith("List") else [body]
    columns, cells = _printer(rtype, version)
    include = query.get("includeObject", "Metadata")
    rows = []
    for obj in items:
        row: Obj = {"cells": cells(obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata") or {},
            }
        rows.append(row)
    metadata = {"resourceVersion": (body.get("metadata") or {}).get("resourceVersion", "")}
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": [_column(*column) for column in columns],
        "rows": rows,
    }


def _column(name: str, kind: str, priority: int) -> Obj:
    form = "name" if name == "Name" else ""
    return {"name": name, "type": kind, "format": form, "description": name, "priority": priority}


def _printer(rtype: ResourceType, version: str) -> printers.Printer:
    if rtype.builtin:
        return printers.BUILTIN.get(rtype.key, printers.NAME_AGE)
    declared = rtype.printer_columns.get(version) or ()
    if not declared:
        return printers.NAME_AGE
    columns = (
        ("Name", "string", 0),
        *((c["name"], c.get("type", "string"), int(c.get("priority", 0))) for c in declared),
    )

    def cells(obj: Obj) -> list[Any]:
        found: list[Any] = [printers.name(obj)]
        for column in declared:
            values = _json_path(obj, column.get("jsonPath", ""))
            found.append(_cell(column.get("type", "string"), values[0]) if values else None)
        return found

    return columns, cells


def _cell(kind: str, value: Any) -> Any:
    """`cellForJSONValue`: a date as an age, numbers and booleans as such, the rest as text."""
    if kind == "date":
        return printers.age(value) if isinstance(value, str) else "<invalid>"
    if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if kind in ("number", "boolean") and isinstance(value, (int, float, bool)):
        return value
    if kind == "string" or isinstance(value, str):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return None


def _json_path(obj: Any, path: str) -> list[Any]:
    """The values of a simple JSONPath (`.a.b`, `[0]`, `[*]`, `[?(@.k=='v')]`)."""
    found = [obj]
    for step in re.findall(r"\.([^.\[\]]+)|\[([^\]]*)\]", path.strip().strip("{}")):
        name, index = step
        following: list[Any] = []
        for value in found:
            if name:
                if isinstance(value, dict) and name in value:
                    following.append(value[name])
            elif isinstance(value, list):
                following.extend(_select(value, index))
        found = following
    return found


def _select(items: list[Any], index: str) -> list[Any]:
    if index == "*":
        return items
    test = re.fullmatch(r"\?\(@\.([\w.-]+)\s*==\s*['\"]([^'\"]*)['\"]\)", index)
    if test:
        key, value = test.groups()
        return [i for i in items if isinstance(i, dict) and str(i.get(key)) == value]
    if re.fullmatch(r"-?\d+", index) and -len(items) <= int(index) < len(items):
        return [items[int(index)]]
    return []
