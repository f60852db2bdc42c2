"""`GET /api/kernel-queue/queues`: each queue's capacity, use, holders and waiting list.

Built from what this server knows (its kernels' queue states, its sessions' notebook paths,
each kernel's `last_activity`) plus what the backend can say of the rest: on the local backend
the machine's queue service (every server's and batch run's kernels on this machine, its
GPUs), on the kubernetes backend Kueue's LocalQueue status only (counts and usage, never
another user's notebook), read through `KubernetesBackend.local_queue_usage` in the namespace
each kernel runs in (its kernelspec's `namespace`, else the backend's), one entry per
namespace and LocalQueue; a LocalQueue that cannot be read keeps its rows and says why in its
`error` (a sentence naming the queue and its namespace), in a 200 like the rest. Read-only: it
never starts a queue service, and never creates a backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kernel_queue import backends, errors
from kernel_queue.kube.queueing import capacity
from kernel_queue.server import kernels

log = logging.getLogger(__name__)

HOLDING = frozenset({"admitted", "running", "resumed", "preempted"})
"""States whose kernel holds its queue's GPUs (a preempted one until it has saved and stopped)."""
WAITING = frozenset({"queued", "requeued"})
"""States whose kernel waits for (re-)admission."""


def kernel_rows(
    manager: Any, notebooks: Mapping[str, str]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """This server's queued kernels by id: (their queue status, their row). `notebooks` maps a
    kernel id to its session's path (absent for a kernel started through the API). The status
    carries the kernelspec's `namespace` too (None: the backend's)."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for model in manager.list_kernels():
        km = manager.get_kernel(model["id"])
        provisioner = kernels.provisioner_of(km)
        status = kernels.queue_status(km) if provisioner is not None else None
        if provisioner is None or not status or not status.get("queue"):
            continue
        status = {**status, "namespace": provisioner.namespace}
        session = provisioner.kernel_session
        row = {
            "kernel_id": model["id"],
            "notebook": notebooks.get(model["id"]),
            "state": status["state"],
            "gpus": int(status.get("gpus") or 0),
            "devices": list(status.get("devices") or []),
            "position": status.get("position"),
            "waiting_since": session.waiting_since if session is not None else None,
            "idle_since": model.get("last_activity"),
            "execution_state": model.get("execution_state"),
            "message": status.get("message", ""),
            "here": True,
        }
        found[model["id"]] = (status, row)
    return found


def _queue(name: str) -> dict[str, Any]:
    return {"name": name, "capacity": None, "in_use": None, "holders": [], "waiting": []}


def _place(
    queues: dict[Any, dict[str, Any]], key: Any, queue: str, row: dict[str, Any], holds: bool
) -> None:
    """`row` among the holders or the waiting of the entry under `key` (named `queue`)."""
    entry = queues.setdefault(key, _queue(queue))
    entry["holders" if holds else "waiting"].append(row)


def _sorted(queues: Mapping[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    for entry in queues.values():
        entry["holders"].sort(key=lambda r: (not r["here"], r["notebook"] or "", r["kernel_id"]))
        entry["waiting"].sort(key=lambda r: (r["position"] or 1 << 30, r["kernel_id"]))
    return [queues[name] for name in sorted(queues)]


def local_view(
    mine: Mapping[str, tuple[dict[str, Any], dict[str, Any]]],
    machine: Mapping[str, Any],
    configured: Iterable[str],
    gpus: int | None,
) -> dict[str, Any]:
    """The local backend's answer: `mine` (this server's kernels, from `kernel_rows`), the
    machine queue's listing `machine` (`LocalBackend.machine_queue`), the queue names of this
    server's config and its GPUs (None before they were detected). Every local queue shares
    the machine's GPUs, so each carries the same capacity and use, with `shared` true."""
    queues = {name: _queue(name) for name in configured}
    for status, row in mine.values():
        if status["state"] in HOLDING or status["state"] in WAITING:
            _place(queues, status["queue"], status["queue"], row, status["state"] in HOLDING)
    for other in machine.get("kernels", []):
        if other.get("here"):
            continue  # this server's: listed above with its notebook
        row = {
            "kernel_id": other.get("kernel_id", ""),  # empty for another user's kernel
            "notebook": None,
            "state": {"queued": "queued", "evicting": "preempted"}.get(other["state"], "running"),
            "gpus": int(other.get("gpus") or 0),
            "devices": list(other.get("devices") or []),
            "position": other.get("position") if other["state"] == "queued" else None,
            "waiting_since": None,
            "idle_since": None,
            "execution_state": None,
            "message": "",
            "here": False,
            "user": other.get("user", ""),
            "pid": other.get("pid", 0),
        }
        _place(queues, other["queue"], other["queue"], row, other["state"] != "queued")
    if machine.get("service") is not None:  # the service's word is the machine's
        gpus, in_use = len(machine.get("gpus") or []), int(machine.get("gpus_in_use", 0))
    else:  # no service yet: this server's kernels are all the machine's use
        in_use = sum(r["gpus"] for q in queues.values() for r in q["holders"])
    for entry in queues.values():
        entry["capacity"] = {"gpus": gpus} if gpus is not None else None
        entry["in_use"] = {"gpus": in_use}
        entry["shared"] = True
    return {
        "backend": "local",
        "queues": _sorted(queues),
        "hidden": dict(machine.get("hidden", {})),
    }


def kubernetes_view(
    mine: Mapping[str, tuple[dict[str, Any], dict[str, Any]]],
    usage: Mapping[tuple[str, str], capacity.Usage | str],
    namespace: str,
) -> dict[str, Any]:
    """The kubernetes backend's answer: this server's kernels, and per (namespace, LocalQueue)
    what its status says (`usage`), or why it could not be read (a sentence naming the queue,
    its namespace and what to do, as the queue's `error`; the rows still say what this server
    knows). A kernel whose status names no namespace runs in `namespace`, the backend's. Each
    entry names its `namespace`. Capacity is the ClusterQueue's business, shared with other
    namespaces: it is left out (null)."""
    queues: dict[tuple[str, str], dict[str, Any]] = {}
    for status, row in mine.values():
        if status["state"] in HOLDING or status["state"] in WAITING:
            key = (status.get("namespace") or namespace, status["queue"])
            _place(queues, key, status["queue"], row, status["state"] in HOLDING)
    for key, read in usage.items():
        entry = queues.setdefault(key, _queue(key[1]))
        entry["namespace"], entry["shared"] = key[0], False
        if isinstance(read, str):
            entry["error"] = read
        else:
            entry["in_use"] = {"gpus": read.gpus}
            entry["pending"], entry["admitted"] = read.pending, read.admitted
            entry["error"] = None
    return {"backend": "kubernetes", "queues": _sorted(queues), "hidden": {}}


async def local_queue_usage(kube: Any, namespace: str | None, queue: str) -> capacity.Usage | str:
    """What `kube` (a `KubernetesBackend`) reads of LocalQueue `queue` in `namespace` (None:
    the backend's), or the sentence of why it could not."""
    try:
        usage: capacity.Usage = await kube.local_queue_usage(queue, namespace)
        return usage
    except errors.KernelQueueError as exc:
        log.debug("kernel-queue: LocalQueue %s not read: %s", queue, exc)
        return str(exc)


async def notebooks_of(session_manager: Any) -> dict[str, str]:
    """Kernel id -> the path of its session (a notebook, a console)."""
    found: dict[str, str] = {}
    for session in await session_manager.list_sessions():
        kernel = session.get("kernel") or {}
        if kernel.get("id") and session.get("path"):
            found[kernel["id"]] = session["path"]
    return found


async def listing(manager: Any, session_manager: Any) -> dict[str, Any]:
    """What `GET /api/kernel-queue/queues` answers for the server of `manager`."""
    mine = kernel_rows(manager, await notebooks_of(session_manager))
    backend_names = {status.get("backend") for status, _ in mine.values()}
    kube = backends.existing("kubernetes", owner=manager)
    local = backends.existing("local", owner=manager)
    if kube is not None and ("kubernetes" in backend_names or local is None):
        kube_statuses = [s for s, _ in mine.values() if s.get("backend") == "kubernetes"]
        own = {(s.get("namespace"), s["queue"]) for s in kube_statuses}
        keys = sorted(own, key=lambda key: (key[0] or "", key[1]))
        read = await asyncio.gather(*(local_queue_usage(kube, *key) for key in keys))
        # The backend's namespace, resolved (off the loop) by the reads; unused without them.
        default = str(getattr(kube, "namespace", "")) if keys else ""
        usage = {(ns or default, queue): r for (ns, queue), r in zip(keys, read, strict=True)}
        return kubernetes_view(mine, usage, default)
    machine: Mapping[str, Any] = {}
    configured: tuple[str, ...] = ()
    gpus: int | None = None
    if local is not None:
        looks = getattr(local, "machine_queue", None)
        if callable(looks):
            machine = await looks()
        quota_of = getattr(local, "machine_quota", None)
        if callable(quota_of):
            quota = quota_of()
            configured, gpus = tuple(quota.queues), len(quota.gpus) or None
    return local_view(mine, machine, configured, gpus)
