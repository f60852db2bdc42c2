"""Server-side printing: a `meta.k8s.io/v1` Table instead of an object or a list, when the
client asks for one (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, as `kubectl get`
does), with the columns a real cluster shows.

Built-in kinds take the apiserver's own printers (pods, Services, Secrets, ConfigMaps,
Namespaces, Nodes; other kinds Name and Age), the `-o wide` columns at priority 1; custom kinds
take their CRD's `additionalPrinterColumns` (a simple JSONPath each, dates as ages), or Name and
Age when it declares none. Each row carries the object's metadata (PartialObjectMetadata), or
the object itself for `includeObject=Object`. Pure: objects in, a Table out.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType

NONE = "<none>"
Printer = tuple[tuple[tuple[str, str, int], ...], Callable[[Obj], list[Any]]]
"""((column name, type, priority), ...) and the cells of one object."""


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


def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """`translateTimestampSince`: how long ago, as the apiserver's HumanDuration words it."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400

    def two(big: int, unit: str, small: int, small_unit: str) -> str:
        return f"{big}{unit}{small}{small_unit}" if small else f"{big}{unit}"

    if minutes < 10:
        return two(minutes, "m", seconds % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return two(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return two(days, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return two(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _printer(rtype: ResourceType, version: str) -> Printer:
    if rtype.builtin:
        return _BUILTIN.get(rtype.key, _NAME_AGE)
    declared = rtype.printer_columns.get(version) or ()
    if not declared:
        return _NAME_AGE
    columns = (
        ("Name", "string", 0),
        *((c["name"], c.get("type", "string"), int(c.get("priority", 0))) for c in declared),
    )

    def cells(obj: Obj) -> list[Any]:
        found: list[Any] = [_name(obj)]
        for column in declared:
            values = _json_path(obj, column.get("jsonPath", ""))
            found.append(_cell(column.get("type", "string"), values[0]) if values else None)
        return found

    return columns, cells


def _cell(kind: str, value: Any) -> Any:
    """`cellForJSONValue`: a date as an age, numbers and booleans as such, the rest as text."""
    if kind == "date":
        return age(value) if isinstance(value, str) else "<invalid>"
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


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _age(obj: Obj) -> str:
    return age((obj.get("metadata") or {}).get("creationTimestamp"))


_NAME_AGE: Printer = (("Name", "string", 0), ("Age", "string", 0)), lambda o: [_name(o), _age(o)]


def _pod(pod: Obj) -> list[Any]:
    """`printPod`: ready containers, the status reason a user reads, restarts."""
    spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod["metadata"]
    reason = status.get("reason") or status.get("phase") or "Pending"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    ready = restarts = 0
    running = False
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated is not None:
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif "running" in state:
            running = True
            ready += bool(container.get("ready"))
    if reason == "Completed" and running:
        reason = "Running" if ready else "NotReady"
    if meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed"):
        reason = "Terminating"
    gates = [g.get("conditionType", "") for g in spec.get("readinessGates") or []]
    return [
        _name(pod),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts,
        _age(pod),
        status.get("podIP") or NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        ",".join(gates) or NONE,
    ]


def _service(service: Obj) -> list[Any]:
    spec, status = service.get("spec") or {}, service.get("status") or {}
    kind = spec.get("type") or "ClusterIP"
    external = list(spec.get("externalIPs") or [])
    if kind == "LoadBalancer":
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        external += [i.get("ip") or i.get("hostname", "") for i in ingress]
        external = external or ["<pending>"]
    elif kind == "ExternalName":
        external = [spec.get("externalName", "")]
    ports = [
        f"{p.get('port')}{':' + str(p['nodePort']) if p.get('nodePort') else ''}"
        f"/{p.get('protocol') or 'TCP'}"
        for p in spec.get("ports") or []
    ]
    selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
    return [
        _name(service),
        kind,
        spec.get("clusterIP") or NONE,
        ",".join(external) or NONE,
        ",".join(ports) or NONE,
        _age(service),
        selector or NONE,
    ]


def _node(node: Obj) -> list[Any]:
    spec, status, meta = node.get("spec") or {}, node.get("status") or {}, node["metadata"]
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    found = ready[0].get("status") if ready else None
    state = {"True": "Ready", "False": "NotReady"}.get(str(found), "Unknown")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.removeprefix("node-role.kubernetes.io/")
        for key in meta.get("labels") or {}
        if key.startswith("node-role.kubernetes.io/")
    )
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a.get("address", "") for a in addresses if a.get("type") == kind), NONE)

    info = status.get("nodeInfo") or {}
    return [
        _name(node),
        state,
        ",".join(roles) or NONE,
        _age(node),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _data(obj: Obj) -> int:
    return len(obj.get("data") or {}) + len(obj.get("binaryData") or {})


_S, _I = "string", "integer"
_BUILTIN: Mapping[tuple[str, str], Printer] = {
    ("", "pods"): (
        (("Name", _S, 0), ("Ready", _S, 0), ("Status", _S, 0), ("Restarts", _S, 0),
         ("Age", _S, 0), ("IP", _S, 1), ("Node", _S, 1), ("Nominated Node", _S, 1),
         ("Readiness Gates", _S, 1)),
        _pod,
    ),
    ("", "services"): (
        (("Name", _S, 0), ("Type", _S, 0), ("Cluster-IP", _S, 0), ("External-IP", _S, 0),
         ("Port(s)", _S, 0), ("Age", _S, 0), ("Selector", _S, 1)),
        _service,
    ),
    ("", "secrets"): (
        (("Name", _S, 0), ("Type", _S, 0), ("Data", _I, 0), ("Age", _S, 0)),
        lambda o: [_name(o), o.get("type") or "Opaque", _data(o), _age(o)],
    ),
    ("", "configmaps"): (
        (("Name", _S, 0), ("Data", _I, 0), ("Age", _S, 0)),
        lambda o: [_name(o), _data(o), _age(o)],
    ),
    ("", "namespaces"): (
        (("Name", _S, 0), ("Status", _S, 0), ("Age", _S, 0)),
        lambda o: [_name(o), (o.get("status") or {}).get("phase") or "Active", _age(o)],
    ),
    ("", "nodes"): (
        (("Name", _S, 0), ("Status", _S, 0), ("Roles", _S, 0), ("Age", _S, 0),
         ("Version", _S, 0), ("Internal-IP", _S, 1), ("External-IP", _S, 1),
         ("OS-Image", _S, 1), ("Kernel-Version", _S, 1), ("Container-Runtime", _S, 1)),
        _node,
    ),
}  # fmt: skip
"""The apiserver's printers (pkg/printers/internalversion) for the kinds kubectl users read."""
