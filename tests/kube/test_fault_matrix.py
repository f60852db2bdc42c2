"""The fault matrix: each fault kind at each call site, at start, cancel, preemption and shutdown,
through a real jupyter_server and the real Kubernetes client, on both planes: the whole matrix
on the fake cluster, and on the real control plane (its faults from the FaultProxy in front of
its API server) the cases of `REAL_PLANE`, at least one of every fault kind in every phase.

For every case: the fault is met (a fallback site, where Kueue may have done the work first, in
one of `FALLBACK_TRIES` runs), no object of the kernel is left (by its own id label), the
kernel leaves `/api/kernels` after its DELETE, and a kernel that failed says why in a sentence
(a transient fault never fails it; someone else's object in the way always does). One server
and cluster per phase run its cases one after the other; a case's problems are collected and
reported together, so one run shows the whole matrix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import a_sentence, gone, kube_spec, labelled, settled

pytestmark = pytest.mark.timeout(400)

# Retries, not the reaper, must make every case clean: the reaper sweeps rarely here.
BACKEND = {"reap_interval": 30.0}
LATENCY = 0.2
FALLBACK_TRIES = 3
"""Runs of a case at a fallback site (`Case.fallback`) until the server reaches it."""
FOREIGN = {"app": "someone-else"}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    """A kernel that exits on its shutdown_request, as every kernel here does, is waited for: on
    a loaded machine its pod's end can take longer than half of jupyter_client's 5 s
    `shutdown_wait_time`, and the SIGTERM that follows (the provisioner's terminate: the
    Workload deleted while its pods still run, so Kueue deletes them) is not the clean-up the
    shutdown phase means to fault."""
    jp_server_config.setdefault("KernelManager", {})["shutdown_wait_time"] = 60.0
    return jp_server_config


@dataclass(frozen=True)
class Case:
    """One fault at one call site: `verb plural` (`watch` and `relist` drop the open streams
    so the next request meets it), of `kind`: 500, 429 (Retry-After), lost (the change made,
    the answer lost), foreign (someone else's object of the name), 410, drop, latency; "a+b"
    injects a, then b (a call made once per connection, as discovery, meets both)."""

    verb: str
    plural: str
    kind: str

    def __str__(self) -> str:
        return f"{self.kind} on {self.verb} {self.plural}".replace(" on latency ", " ")

    @property
    def fallback(self) -> bool:
        """Whether the site is one the server reaches only when Kueue has not done its work:
        Kueue deletes the pods of a group whose Workload is deleted before it is Finished (even
        ended ones), so a DELETE of a pod is the server's only once Kueue saw the kernel end
        first, which it mostly does, not always (`FALLBACK_TRIES`)."""
        return (self.verb, self.plural) == ("delete", "pods")

    @property
    def fails(self) -> bool:
        """Whether the kernel must fail (with a sentence) rather than go on."""
        return self.kind == "foreign"

    def inject(self, plane: Plane) -> None:
        status = {"500": 500, "429": 429, "lost": 504}.get(self.kind, 500)
        if "+" in self.kind:  # one after the other, at a call made once: "500+429"
            for kind in self.kind.split("+"):
                Case(self.verb, self.plural, kind).inject(plane)
        elif self.kind == "latency":
            plane.latency = LATENCY
        elif self.kind == "foreign":
            plane.plant_next(self.plural, FOREIGN)
        elif self.verb == "watch":
            if self.kind == "410":
                plane.expire_next_watch()
            elif self.kind != "drop":
                plane.fail_next("watch", self.plural, status)
            plane.drop_watches()
        elif self.verb == "relist":  # a watch that expired: the informer lists again
            plane.fail_next("list", self.plural, status)
            plane.expire_next_watch()
            plane.drop_watches()
        else:
            plane.fail_next(self.verb, self.plural, status, after=self.kind == "lost")


def cases(sites: list[tuple[str, str]], kinds: tuple[str, ...]) -> list[Case]:
    return [Case(verb, plural, kind) for verb, plural in sites for kind in kinds]


CREATES = [("create", "secrets"), ("create", "services"), ("create", "pods")]
WATCHES = [("watch", "pods"), ("watch", "workloads")]
DELETES = [("delete", p) for p in ("workloads", "services", "secrets")]
LATENCY_CASE = [Case("latency", "all", "latency")]
VISIBILITY = ("get", "localqueues/pendingworkloads")
DISCOVERY = ("get", "/apis")  # read once per connection: its faults are met by the first start

MATRIX = {
    "connect": cases([DISCOVERY], ("500+429",)),
    "start": [
        *cases(CREATES, ("500", "429", "lost", "foreign")),
        *cases([("get", "localqueues")], ("500", "429")),
        *cases(WATCHES, ("500", "410", "drop")),
        *cases([("relist", "pods")], ("500", "429")),
        *LATENCY_CASE,
    ],
    "cancel": [
        *cases(DELETES, ("500", "429")),
        *cases([("list", "pods"), VISIBILITY], ("500", "429")),
        *LATENCY_CASE,
    ],
    "shutdown": [
        *cases([*DELETES, ("delete", "pods")], ("500", "429")),
        *cases([("list", "pods")], ("500", "429")),
        *LATENCY_CASE,
    ],
    "preemption": [
        *cases([("create", "pods")], ("500", "429", "lost")),
        *cases(WATCHES[:1], ("500", "410", "drop")),
        *cases([VISIBILITY], ("500",)),
        *LATENCY_CASE,
    ],
}


REAL_PLANE = {
    "connect": {"500+429 on get /apis"},
    "start": {
        "429 on create secrets",
        "lost on create pods",
        "foreign on create pods",
        "foreign on create services",
        "500 on get localqueues",
        "500 on watch workloads",
        "410 on watch pods",
        "drop on watch workloads",
        "429 on relist pods",
        "latency all",
    },
    "cancel": {
        "500 on delete workloads",
        "429 on list pods",
        "429 on get localqueues/pendingworkloads",
        "latency all",
    },
    "shutdown": {
        "500 on delete workloads",
        "429 on delete pods",
        "500 on list pods",
        "latency all",
    },
    "preemption": {
        "lost on create pods",
        "410 on watch pods",
        "drop on watch pods",
        "500 on get localqueues/pendingworkloads",
        "latency all",
    },
}
"""The cases (by name) the real control plane runs of each phase; the fake runs all of `MATRIX`.
A case there costs seconds of real pods, scheduler and Kueue, the whole matrix minutes: so every
phase runs there, and every fault kind (`KINDS`: 5xx, 429, a lost answer, someone else's object,
410, a dropped watch, latency) at least once, at the sites where the real API server's answers
differ most from the fake's (a relist, the visibility API, a lost pod create, a preemption's
replacement pod). Checked below against `MATRIX`, so a renamed case cannot silently stop
running."""
KINDS = ("500", "429", "lost", "foreign", "410", "drop", "latency")


def _kinds(*lists: list[Case]) -> set[str]:
    return {kind for cases in lists for case in cases for kind in case.kind.split("+")}


_REAL = {phase: [c for c in MATRIX[phase] if str(c) in REAL_PLANE[phase]] for phase in MATRIX}
assert all(len(_REAL[phase]) == len(names) for phase, names in REAL_PLANE.items()), _REAL
assert _kinds(*_REAL.values()) == set(KINDS) == _kinds(*MATRIX.values())


def on_plane(plane: Plane, phase: str) -> list[Case]:
    """The cases of `phase` that `plane` runs (`REAL_PLANE`)."""
    return MATRIX[phase] if plane.kind == "fake" else _REAL[phase]


class Run:
    """One phase's cases on one server, and what went wrong in each."""

    def __init__(self, server: Server, plane: Plane, name: str) -> None:
        self.server, self.plane, self.name = server, plane, name
        self.problems: list[str] = []
        self.kernels: list[str] = []

    async def start(self, spec: str | None = None) -> str:
        kernel = await self.server.start(spec or self.name)
        self.kernels.append(kernel)
        return kernel

    async def delete(self, case: Case, *kernels: str) -> None:
        for kernel in kernels:
            await self.server.shutdown(kernel)  # any answer but 2xx raises
        try:
            await gone(self.server, *kernels, within=60)
        except BaseException:
            self.problems.append(f"{case}: still listed after DELETE")
            raise

    async def clean(self, case: Case, *kernels: str) -> None:
        async def clean() -> bool:
            return not any(labelled(self.plane, k) for k in kernels)

        try:
            await self.server.wait_for(clean, within=60)
        except TimeoutError:
            left = {k[:8]: labelled(self.plane, k) for k in kernels}
            self.problems.append(f"{case}: left behind {left}")

    async def one(self, case: Case, drive: Callable[[Case], Awaitable[None]]) -> None:
        tries = FALLBACK_TRIES if case.fallback else 1
        for _ in range(tries):
            try:
                async with asyncio.timeout(120):
                    await drive(case)
            except Exception as exc:
                self.problems.append(f"{case}: {type(exc).__name__}: {exc}")
            finally:
                self.plane.latency = 0.0
                pending = self.plane.faults_pending
                self.plane.clear_faults()
            if not pending:
                return
        why = f" in {tries} tries (Kueue deleted the pods first)" if case.fallback else ""
        self.problems.append(f"{case}: the fault was never met{why}")


async def run_start(run: Run, case: Case) -> None:
    case.inject(run.plane)
    kernel = await run.start()
    model = await settled(run.server, kernel)
    if case.fails:
        if model["live"]:
            run.problems.append(f"{case}: the kernel ran on someone else's object")
        elif not a_sentence(model["reason"], kernel):
            run.problems.append(f"{case}: not a sentence: {model['reason']!r}")
    elif not model["live"]:
        run.problems.append(f"{case}: a transient fault failed the kernel: {model['reason']!r}")
    await run.delete(case, kernel)
    await run.clean(case, kernel)
    if case.fails:
        run.plane.delete_labelled(case.plural, "app=someone-else")


async def run_shutdown(run: Run, case: Case) -> None:
    kernel = await run.start()
    if not (await settled(run.server, kernel))["live"]:
        run.problems.append(f"{case}: the kernel did not start")
    case.inject(run.plane)
    await run.delete(case, kernel)
    await run.clean(case, kernel)


def run_cancel(holder: str) -> Callable[[Run, Case], Awaitable[None]]:
    async def cancel(run: Run, case: Case) -> None:
        waiting = await run.start()
        await run.server.wait_reason(waiting, "position 1 of 1")
        case.inject(run.plane)
        if case.plural == VISIBILITY[1]:  # met while it waits, before the DELETE

            async def met() -> bool:
                return run.plane.faults_pending == 0

            await run.server.wait_for(met, within=30)
        await run.delete(case, waiting)
        await run.clean(case, waiting)
        if not labelled(run.plane, holder).get("pods"):
            run.problems.append(f"{case}: the running kernel lost its pod")

    return cancel


def run_preemption(low_spec: str, high_spec: str) -> Callable[[Run, Case], Awaitable[None]]:
    async def preempt(run: Run, case: Case) -> None:
        low = await run.start(low_spec)
        if not (await settled(run.server, low))["live"]:
            run.problems.append(f"{case}: the low kernel did not start")
        if case.plural != VISIBILITY[1]:
            case.inject(run.plane)
        high = await run.start(high_spec)
        await run.server.wait_reason(low, "requeued in 'user-queue', position")
        if case.plural == VISIBILITY[1]:
            case.inject(run.plane)

            async def met() -> bool:
                return run.plane.faults_pending == 0

            await run.server.wait_for(met, within=30)
        await run.delete(case, high)
        model = await settled(run.server, low, within=90)
        if not model["live"]:
            run.problems.append(f"{case}: the preempted kernel did not come back: {model}")
        await run.delete(case, low)
        await run.clean(case, low, high)

    return preempt


@pytest.mark.parametrize("backend_config", [BACKEND])
@pytest.mark.parametrize("phase", list(MATRIX))
async def test_every_fault_at_every_site_leaves_nothing_and_fails_only_in_a_sentence(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    phase: str,
    backend_config: dict[str, Any],
) -> None:
    run = Run(server, plane, kube_spec(kernelspec))
    drive: Callable[[Run, Case], Awaitable[None]]
    holder = ""
    if phase in ("start", "connect"):
        drive = run_start
    elif phase == "shutdown":
        drive = run_shutdown
    elif phase == "cancel":
        holder = await run.start()
        assert (await settled(server, holder))["live"]
        drive = run_cancel(holder)
    else:
        low = kube_spec(kernelspec, "low", priority_class="low")
        drive = run_preemption(low, kube_spec(kernelspec, "high", priority_class="high"))
    for case in on_plane(plane, phase):
        await run.one(case, lambda c: drive(run, c))
    if holder:
        await server.shutdown(holder)
        await gone(server, holder)
    assert not run.problems, "\n".join(run.problems)
    assert not any(labelled(plane, k) for k in run.kernels)
