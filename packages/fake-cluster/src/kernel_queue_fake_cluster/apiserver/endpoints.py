"""The Endpoints controller of the fake cluster (kube-controller-manager's job, run on the store):
which pods back each Service, on which ports.

`install` keeps every Service's `Endpoints` in step with the pods its selector picks (ready ones
under `addresses`, others under `notReadyAddresses`) and removes it with its Service; `write`
does it for one Service. Where a connection goes is the node agent's (`node/network.py`), which
reads the same pods with the same rules (`common/pods.py`).
"""

from __future__ import annotations

import contextlib

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common import selectors
from kernel_queue_fake_cluster.common.pods import pod_ready, target_port


def install(store: Store) -> None:
    """Write each Service's Endpoints as Services and pods change (listeners on `store`)."""
    labels: dict[str, dict[str, str]] = {}  # pod uid -> its labels as last seen

    def on_service(kind: str, service: Obj) -> None:
        meta = service["metadata"]
        if kind == "DELETED":
            delete(store, meta["namespace"], meta["name"])
        else:
            write(store, service)

    def on_pod(kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        before = labels.pop(meta["uid"], None) if kind == "DELETED" else labels.get(meta["uid"])
        if kind != "DELETED":
            labels[meta["uid"]] = dict(meta.get("labels") or {})
        for service in list(store.objects("", "services")):
            selector = (service.get("spec") or {}).get("selector")
            if service["metadata"]["namespace"] != meta.get("namespace") or not selector:
                continue
            match = selectors.selector_dict({"matchLabels": selector})
            if match(pod) or (before is not None and match({"metadata": {"labels": before}})):
                write(store, service)

    store.add_listener("", "services", on_service)
    store.add_listener("", "pods", on_pod)
    for service in list(store.objects("", "services")):
        write(store, service)


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
        if pod["metadata"].get("deletionTimestamp") and not spec.get("publishNotReadyAddresses"):
            continue  # a Service publishing not-ready pods keeps terminating ones too
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
