"""The apiserver's own printers for built-in kinds: the cells of one object's row in `kubectl
get` (pkg/printers/internalversion), and ages worded as the apiserver words them.

Pods, Services, Secrets, ConfigMaps, Namespaces, Nodes, Events, ServiceAccounts and
PersistentVolumeClaims, with their `-o wide` columns at priority 1; every other built-in kind
shows Name and Age. Pure functions of one object; `tables.py` builds the Table around them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver.kinds import Obj

NONE = "<none>"
Printer = tuple[tuple[tuple[str, str, int], ...], Callable[[Obj], list[Any]]]
"""((column name, type, priority), ...) and the cells of one object."""


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


def name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _age(obj: Obj) -> str:
    return age((obj.get("metadata") or {}).get("creationTimestamp"))


NAME_AGE: Printer = (("Name", "string", 0), ("Age", "string", 0)), lambda o: [name(o), _age(o)]


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
        name(pod),
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
        name(service),
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
        name(node),
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


def _event(event: Obj) -> list[Any]:
    """`printEvent`: when last seen, what happened to which object, and who said so."""
    involved, source = event.get("involvedObject") or {}, event.get("source") or {}
    first = age(event.get("firstTimestamp") or _seconds(event.get("eventTime")))
    last = age(event["lastTimestamp"]) if event.get("lastTimestamp") else first
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [
        last,
        event.get("type", ""),
        event.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        ", ".join(filter(None, (component, host))),
        str(event.get("message", "")).strip(),
        first,
        int(event.get("count") or 1),
        name(event),
    ]


def _seconds(micro: str | None) -> str | None:
    """A MicroTime (`2026-01-01T00:00:00.123456Z`) to whole seconds, as `age` reads them."""
    return micro.split(".")[0].removesuffix("Z") + "Z" if micro else None


_ACCESS_MODES = {
    "ReadWriteOnce": "RWO",
    "ReadOnlyMany": "ROX",
    "ReadWriteMany": "RWX",
    "ReadWriteOncePod": "RWOP",
}


def _claim(claim: Obj) -> list[Any]:
    spec, status = claim.get("spec") or {}, claim.get("status") or {}
    modes = status.get("accessModes") or spec.get("accessModes") or []
    bound = bool(spec.get("volumeName"))
    return [
        name(claim),
        status.get("phase") or "Pending",
        spec.get("volumeName", ""),
        (status.get("capacity") or {}).get("storage", "") if bound else "",
        ",".join(_ACCESS_MODES.get(m, m) for m in modes),
        spec.get("storageClassName") or "",
        spec.get("volumeAttributesClassName") or "<unset>",
        _age(claim),
        spec.get("volumeMode") or "Filesystem",
    ]


def _data(obj: Obj) -> int:
    return len(obj.get("data") or {}) + len(obj.get("binaryData") or {})


_S, _I = "string", "integer"
BUILTIN: Mapping[tuple[str, str], Printer] = {
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
        lambda o: [name(o), o.get("type") or "Opaque", _data(o), _age(o)],
    ),
    ("", "configmaps"): (
        (("Name", _S, 0), ("Data", _I, 0), ("Age", _S, 0)),
        lambda o: [name(o), _data(o), _age(o)],
    ),
    ("", "namespaces"): (
        (("Name", _S, 0), ("Status", _S, 0), ("Age", _S, 0)),
        lambda o: [name(o), (o.get("status") or {}).get("phase") or "Active", _age(o)],
    ),
    ("", "events"): (
        (("Last Seen", _S, 0), ("Type", _S, 0), ("Reason", _S, 0), ("Object", _S, 0),
         ("Subobject", _S, 1), ("Source", _S, 1), ("Message", _S, 0), ("First Seen", _S, 1),
         ("Count", _S, 1), ("Name", _S, 1)),
        _event,
    ),
    ("", "serviceaccounts"): (
        (("Name", _S, 0), ("Secrets", _S, 0), ("Age", _S, 0)),
        lambda o: [name(o), len(o.get("secrets") or []), _age(o)],
    ),
    ("", "persistentvolumeclaims"): (
        (("Name", _S, 0), ("Status", _S, 0), ("Volume", _S, 0), ("Capacity", _S, 0),
         ("Access Modes", _S, 0), ("StorageClass", _S, 0), ("VolumeAttributesClass", _S, 0),
         ("Age", _S, 0), ("VolumeMode", _S, 1)),
        _claim,
    ),
    ("", "nodes"): (
        (("Name", _S, 0), ("Status", _S, 0), ("Roles", _S, 0), ("Age", _S, 0),
         ("Version", _S, 0), ("Internal-IP", _S, 1), ("External-IP", _S, 1),
         ("OS-Image", _S, 1), ("Kernel-Version", _S, 1), ("Container-Runtime", _S, 1)),
        _node,
    ),
}  # fmt: skip
"""The apiserver's printers (pkg/printers/internalversion) for the kinds kubectl users read."""
