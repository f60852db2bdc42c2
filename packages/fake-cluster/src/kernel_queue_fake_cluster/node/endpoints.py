"""The Endpoints controller of the fake cluster: which pods back each Service, on which ports.

`write` keeps a Service's `Endpoints` in step with the pods its selector picks (ready ones under
`addresses`, others under `notReadyAddresses`); `pod_ready` and `target_port` also tell
`network.ServiceNetwork` where to forward.
"""

from __future__ import annotations

import contextlib

from kernel_queue_fake_cluster.apiserver import selectors
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store


def target_port(port: Obj, pod: Obj) -> int | None:
    """The pod port a Service port forwards to (`targetPort` number or container port name)."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for found in container.get("ports") or []:
            if found.get("name") == target:
                return int(found["containerPort"])
    return None


def pod_ready(pod: Obj) -> bool:
    """Ready condition True, an IP, running and not being deleted: a serving endpoint."""
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    deleting = pod["metadata"].get("deletionTimestamp")
    return ready and bool(status.get("podIP")) and status.get("phase") == "Running" and not deleting


def write(store: Store, service: Obj) -> None:
    """Create or update the Service's `Endpoints` from the pods its selector picks."""
    spec, meta = service.get("spec") or {}, service["metadata"]
    if ("", "endpoints") not in store.types or not spec.get("selector"):
        return
    match = selectors.selector_dict({"matchLabels": spec["selector"]})
    groups: dict[tuple[tuple[str, int, str], ...], dict[str, list[Obj]]] = {}
    for pod in store.objects("", "pods"):
        status = pod.get("status") or {}
        if pod["metadata"].get("namespace") != meta["namespace"] or not match(pod):
            continue
        if not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        ports = []
        for port in spec.get("ports") or []:
            target = target_port(port, pod)
            if target is not None:
                ports.append((port.get("name", ""), target, port.get("protocol", "TCP")))
        address = {
            "ip": status["podIP"],
            "nodeName": pod["spec"].get("nodeName", ""),
            "targetRef": {
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
        ready = pod_ready(pod) or spec.get("publishNotReadyAddresses")
        side = "addresses" if ready else "notReadyAddresses"
        groups.setdefault(tuple(ports), {}).setdefault(side, []).append(address)
    subsets = []
    for ports_key, sides in sorted(groups.items()):
        subset: Obj = {k: sorted(v, key=lambda a: a["ip"]) for k, v in sorted(sides.items())}
        subset["ports"] = [
            {**({"name": n} if n else {}), "port": p, "protocol": proto}
            for n, p, proto in ports_key
        ]
        subsets.append(subset)
    body: Obj = {"metadata": {"name": meta["name"], "labels": dict(meta.get("labels") or {})}}
    if subsets:
        body["subsets"] = subsets
    try:
        current = store.get("", "endpoints", meta["namespace"], meta["name"])
    except ApiError:
        current = None
    with contextlib.suppress(ApiError):
        if current is None:
            store.create("", "endpoints", meta["namespace"], body)
        elif (current.get("subsets"), current["metadata"].get("labels") or {}) != (
            body.get("subsets"),
            body["metadata"]["labels"],
        ):
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            store.replace("", "endpoints", meta["namespace"], meta["name"], body)


def delete(store: Store, namespace: str, name: str) -> None:
    """Remove a Service's `Endpoints`, if the store serves that kind."""
    if ("", "endpoints") in store.types:
        with contextlib.suppress(ApiError):
            store.delete("", "endpoints", namespace, name, grace_seconds=0)
