"""A fault soak: many kernels started and deleted through a Jupyter server while the cluster
injects API faults, and what the user would notice counted.

`soak(cluster, jupyter, ...)` runs `kernels` kernels, `parallel` at a time: each is started,
then deleted either once it runs or (a cancel) while it waits in the queue; an injector puts
`faults` random faults among them (500, 429, 409, a lost answer, someone else's object, 410,
dropped watches, latency). The `Report` counts kernels stuck (never settled, or still listed
after their DELETE), objects leaked (by each kernel's id label, once everything settled) and
failures that are not a sentence. The cluster is a `FakeCluster`, or anything with its fault
calls and a way to read and delete objects (`Cluster`: tests/kube/planes.py's `Plane`, which is
also the real control plane behind a `FaultProxy`). Used by tests/kube/test_fault_soak.py and
benchmarks/fault_soak.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.common.objects import Obj

KERNEL_ID_LABEL = "kernel-queue.dev/kernel-id"
FOREIGN = {"app": "someone-else"}
PLANTED = ("pods", "secrets", "services")
"""What `inject` plants someone else's object of."""
KUEUE = "kueue.x-k8s.io"


class Cluster(Protocol):
    """What the soak asks of a cluster besides a `FakeCluster`: its fault calls (`FakeCluster`'s
    names and meaning), and its objects, as tests/kube/planes.py's `Plane` reads and deletes
    them (a kind the API server does not serve lists as none)."""

    latency: float

    @property
    def faults_pending(self) -> int: ...
    def fail_next(
        self, verb: str, plural: str, status: int = 500, count: int = 1, *, after: bool = False
    ) -> None: ...
    def plant_next(
        self, plural: str, labels: Mapping[str, str] | None = None, count: int = 1
    ) -> None: ...
    def drop_watches(self) -> None: ...
    def expire_next_watch(self, count: int = 1) -> None: ...
    def clear_faults(self) -> None: ...
    def objects(
        self, group: str, plural: str, namespace: str | None = "default", labels: str = ""
    ) -> list[Obj]: ...
    def delete(
        self, group: str, plural: str, namespace: str | None, name: str, *, grace: int | None = None
    ) -> None: ...


def _objects(
    cluster: FakeCluster | Cluster, group: str, plural: str, namespace: str, labels: str = ""
) -> list[Obj]:
    if not isinstance(cluster, FakeCluster):
        return cluster.objects(group, plural, namespace, labels)
    if (group, plural) not in cluster.store.types:
        return []
    items, _ = cluster.store.list_objects(group, plural, namespace, labels=labels)
    return list(items)


def _delete(cluster: FakeCluster | Cluster, plural: str, namespace: str, name: str) -> None:
    """Delete core `plural` `name` at once; gone already is as asked."""
    try:
        if isinstance(cluster, FakeCluster):
            cluster.store.delete("", plural, namespace, name, grace_seconds=0)
        else:
            cluster.delete("", plural, namespace, name, grace=0)
    except Exception as exc:  # the fake's ApiError, or the real plane's client's
        if getattr(exc, "code", None) != 404:
            raise


class Jupyter(Protocol):
    """What the soak asks of a Jupyter server (its REST API)."""

    async def start(self, kernelspec: str) -> str: ...
    async def entry(self, kernel_id: str) -> dict[str, Any]:
        """The kernel's `/api/kernel-queue/kernels` entry ({} when it is not listed)."""
        ...

    async def delete(self, kernel_id: str) -> None: ...
    async def listed(self) -> set[str]: ...


@dataclass
class Report:
    """What the soak saw; `clean` when nothing stuck, leaked or unclear."""

    kernels: int = 0
    ran: int = 0
    cancelled: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # kernel id -> its reason
    stuck: dict[str, str] = field(default_factory=dict)  # kernel id -> where it stuck
    leaked: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    unclear: dict[str, str] = field(default_factory=dict)  # failures that are no sentence
    faults: int = 0
    faults_met: int = 0
    errors: list[str] = field(default_factory=list)  # requests of the soak that failed

    @property
    def clean(self) -> bool:
        return not (self.stuck or self.leaked or self.unclear or self.errors)

    def summary(self) -> str:
        return (
            f"{self.kernels} kernels ({self.ran} ran, {self.cancelled} cancelled while queued, "
            f"{len(self.failed)} failed), {self.faults} faults injected ({self.faults_met} met): "
            f"{len(self.leaked)} leaked, {len(self.stuck)} stuck, {len(self.unclear)} unclear "
            f"failures, {len(self.errors)} request errors"
        )


def is_sentence(reason: str, kernel_id: str) -> bool:
    """A failure a user can act on: it names the kernel and is not the API server's raw text."""
    return f"kernel {kernel_id.replace('-', '')[:8]}" in reason and "injected fault" not in reason


def _prefix(kernel_id: str) -> str:
    """What the names of a kernel's objects start with (its pod group's name)."""
    return f"kq-{kernel_id.replace('-', '')[:8]}"


def leftovers(
    cluster: FakeCluster | Cluster, kernel_id: str, namespace: str
) -> dict[str, list[str]]:
    """The kernel's objects still there (by its id label; Workloads by its pods' group)."""
    found: dict[str, list[str]] = {}
    for plural in ("pods", "services", "secrets"):
        items = _objects(cluster, "", plural, namespace, f"{KERNEL_ID_LABEL}={kernel_id}")
        if items:
            found[plural] = [i["metadata"]["name"] for i in items]
    workloads = _objects(cluster, KUEUE, "workloads", namespace)
    names = [
        w["metadata"]["name"]
        for w in workloads
        if w["metadata"]["name"].startswith(_prefix(kernel_id))
    ]
    if names:
        found["workloads"] = names
    return found


def inject(cluster: FakeCluster | Cluster, rng: random.Random) -> str:
    """One random fault; returns what it was."""
    kind = rng.choice(
        ["500", "500", "429", "409", "lost", "foreign", "410", "drop", "latency", "watch-500"]
    )
    if kind in ("500", "429"):
        verb, plural = rng.choice(
            [
                ("create", "pods"),
                ("create", "secrets"),
                ("create", "services"),
                ("delete", "workloads"),
                ("delete", "pods"),
                ("delete", "services"),
                ("delete", "secrets"),
                ("list", "pods"),
                ("get", "localqueues"),
                ("get", "localqueues/pendingworkloads"),
            ]
        )
        cluster.fail_next(verb, plural, int(kind))
        return f"{kind} on {verb} {plural}"
    if kind == "409":
        plural = rng.choice(["pods", "secrets", "services"])
        cluster.fail_next("create", plural, 409)
        return f"409 on create {plural}"
    if kind == "lost":
        plural = rng.choice(["pods", "secrets", "services"])
        cluster.fail_next("create", plural, 504, after=True)
        return f"lost answer of create {plural}"
    if kind == "foreign":
        plural = rng.choice(PLANTED)
        cluster.plant_next(plural, FOREIGN)
        return f"someone else's {plural}"
    if kind == "410":
        cluster.expire_next_watch()
        cluster.drop_watches()
        return "410 on the next watch"
    if kind == "watch-500":
        cluster.fail_next("watch", rng.choice(["pods", "workloads"]), 500)
        cluster.drop_watches()
        return "500 on the next watch"
    if kind == "drop":
        cluster.drop_watches()
        return "dropped watches"
    cluster.latency = rng.choice([0.05, 0.1, 0.2])
    return f"latency {cluster.latency:g} s"


async def _poll(check: Any, within: float, every: float = 0.1) -> bool:
    """Poll `check()` (async) until true; False after `within` seconds."""
    try:
        async with asyncio.timeout(within):
            while not await check():  # noqa: ASYNC110 - polling a remote server's REST API
                await asyncio.sleep(every)
    except TimeoutError:
        return False
    return True


async def soak(
    cluster: FakeCluster | Cluster,
    jupyter: Jupyter,
    kernelspec: str,
    *,
    kernels: int = 50,
    parallel: int = 6,
    faults: int = 40,
    seed: int = 12,
    namespace: str = "default",
    settle_seconds: float = 120.0,
    gone_seconds: float = 60.0,
    clean_seconds: float = 60.0,
) -> Report:
    """Run the soak (see the module docstring); the cluster's faults are cleared at the end."""
    rng = random.Random(seed)
    report = Report(kernels=kernels)
    started: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(kernels):
        queue.put_nowait(index)
    every = max(1, kernels // max(1, faults))  # one fault every few kernel starts

    async def one(index: int) -> None:
        if index % every == 0 and report.faults < faults:
            report.faults += 1
            inject(cluster, rng)
        cancel = rng.random() < 0.3
        try:
            kernel = await jupyter.start(kernelspec)
        except Exception as exc:  # the start request itself answered an error
            report.errors.append(f"start: {exc}")
            return
        started.append(kernel)
        seen: dict[str, Any] = {}

        async def settled() -> bool:
            seen.clear()
            seen.update(await jupyter.entry(kernel))
            state = (seen.get("queue") or {}).get("state")
            waiting = cancel and state == "queued" and (seen["queue"] or {}).get("position")
            return bool(
                state in ("running", "resumed") or seen.get("execution_state") == "dead" or waiting
            )

        if not await _poll(settled, settle_seconds):
            report.stuck[kernel] = f"never ran nor failed: {seen.get('queue')}"
        elif seen.get("execution_state") == "dead":
            reason = str(seen.get("reason", ""))
            report.failed[kernel] = reason
            if not is_sentence(reason, kernel):
                report.unclear[kernel] = reason
        elif (seen.get("queue") or {}).get("state") == "queued":
            report.cancelled += 1
        else:
            report.ran += 1
        try:
            await jupyter.delete(kernel)
        except Exception as exc:
            report.errors.append(f"DELETE {kernel[:8]}: {exc}")

        async def gone() -> bool:
            return kernel not in await jupyter.listed()

        if not await _poll(gone, gone_seconds, every=0.2):
            report.stuck.setdefault(kernel, "still listed after its DELETE")
        # someone else's object in its way goes with the kernel, as its owner would delete it:
        # on a real node a planted pod runs and holds a GPU, and two leave none to the kernels
        # Kueue admits
        _drop_foreign(cluster, namespace, PLANTED, _prefix(kernel))
        cluster.latency = 0.0

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    try:
        await asyncio.gather(*(worker() for _ in range(parallel)))
    finally:
        report.faults_met = report.faults - cluster.faults_pending  # drops and latency act at once
        cluster.clear_faults()
        cluster.latency = 0.0

    async def clean() -> bool:
        return not any(leftovers(cluster, k, namespace) for k in started)

    await _poll(clean, clean_seconds, every=0.5)
    for kernel in started:
        left = leftovers(cluster, kernel, namespace)
        if left:
            report.leaked[kernel] = left
    _drop_foreign(cluster, namespace, PLANTED)
    return report


def _drop_foreign(
    cluster: FakeCluster | Cluster, namespace: str, plurals: Iterable[str], prefix: str = ""
) -> None:
    """Delete the objects `inject` planted as someone else's (those whose name starts with
    `prefix`)."""
    labels = ",".join(f"{key}={value}" for key, value in FOREIGN.items())
    for plural in plurals:
        for obj in _objects(cluster, "", plural, namespace, labels):
            if obj["metadata"]["name"].startswith(prefix):
                _delete(cluster, plural, namespace, obj["metadata"]["name"])
