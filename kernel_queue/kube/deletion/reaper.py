"""The reaper: deletes what this server made and no kernel of it still owns, never another's.

Every object we create carries this server's owner id (`kueue.OWNER_LABEL`). A sweep lists pods,
Services and Secrets by that one label in each namespace the server uses (cheap lists, never a
request per kernel; the pods come from the informer's cache where it watches the namespace,
`cached_pods`, so an idle server's sweep costs two lists and the launcher ConfigMaps'); a kernel
id that no kernel of this server knows, at two sweeps in a row, has its objects deleted with
their Workloads, one INFO line each. Releases that failed are handed over (`hand_over`) and
retried at each sweep until done. Objects of another owner are never listed, so never touched.
Workloads are deleted at the version the connection speaks (`preflight.Discovery`). Launcher
ConfigMaps (one per namespace and archive, shared by every server of that version) are deleted
when no pod of kernel-queue's, whoever's, mounts them at two sweeps in a row, except the one
this server delivers (`current`).

`HandOver.run` runs one piece of deletion work (a release, a group's end, the undo of a failed
submit). When the API keeps failing (a `ClusterApiError` after its retries) the work goes to
the reaper, and the admin's log says so once per kernel, with what to do by hand when the
reaper is off. Nothing is raised: a user's shutdown never fails on the cluster's account.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import kueue, names
from kernel_queue.kube.client import explain
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.deletion import cleanup
from kernel_queue.kube.objects import preflight
from kernel_queue.kube.queueing import launch_failures
from kernel_queue.model import short_id

Work = Callable[["KubeApi"], Awaitable[list[str]]]
OURS = f"{kueue.MANAGED_BY_LABEL}={kueue.MANAGED_BY}"
LAUNCHERS = f"{kueue.COMPONENT_LABEL}={kueue.LAUNCHER_COMPONENT}"
Key = tuple[str, str]  # (namespace, kernel id label value)
Obj = dict[str, Any]


@dataclass
class _Found:
    """What one sweep found of one kernel."""

    groups: set[str] = field(default_factory=set)
    services: set[str] = field(default_factory=set)
    secrets: set[str] = field(default_factory=set)


@dataclass
class _Job:
    key: Key
    what: str
    work: Work


class Reaper:
    """Sweeps for `owner`'s objects whose kernel `known()` (kernel ids) does not name."""

    def __init__(
        self,
        *,
        owner: str,
        known: Callable[[], Iterable[str]],
        log: logging.Logger | logging.LoggerAdapter[Any],
        discovery: preflight.Discovery | None = None,
        current: Callable[[], str | None] = lambda: None,
        cached_pods: Callable[[str], list[Obj] | None] = lambda namespace: None,
    ) -> None:
        self.owner = names.label_value(owner)
        self._cached_pods = cached_pods  # this owner's pods of a watched namespace, else None
        self._current = current  # the launcher ConfigMap this server delivers: never reaped
        self._stale: set[Key] = set()  # (namespace, launcher ConfigMap) unused at the last sweep
        self._known = known
        self._discovery = discovery or preflight.Discovery()
        self.log = log
        self._suspects: set[Key] = set()
        self._jobs: list[_Job] = []
        self._reported = ""  # the last sweep failure logged (each is logged once)
        self.sweeps = 0

    @property
    def selector(self) -> str:
        """The label selector of this owner's objects."""
        return f"{kueue.OWNER_LABEL}={self.owner}"

    def hand_over(self, namespace: str, kernel_id: str, what: str, work: Work) -> None:
        """Retry `work` (a failed release of `what`) at each sweep until it succeeds."""
        self._jobs.append(_Job((namespace, names.label_value(kernel_id)), what, work))

    @property
    def pending(self) -> int:
        """Handed-over releases not yet done."""
        return len(self._jobs)

    async def sweep(self, api: KubeApi, namespaces: Iterable[str]) -> list[str]:
        """One sweep; returns what it deleted. API errors raise (after the API's retries)."""
        self.sweeps += 1
        deleted = []
        for job in list(self._jobs):
            try:
                done = await job.work(api)
            except errors.ClusterApiError as exc:  # logged when it was handed over
                self.log.debug("reaper: %s still fails: %s", job.what, exc)
                continue
            self._jobs.remove(job)
            deleted += self._report(job.key, done, f"handed over when {job.what} failed")
        found: dict[Key, _Found] = {}
        mounted: set[Key] = set()  # launcher ConfigMaps our own pods mount
        for namespace in sorted(set(namespaces)):
            for kind in (kueue.PODS, kueue.SERVICES, kueue.SECRETS):
                cached = self._cached_pods(namespace) if kind is kueue.PODS else None
                if cached is None:
                    cached, _ = await api.list(kind, namespace, label_selector=self.selector)
                for obj in cached:
                    meta = obj.get("metadata") or {}
                    labels = meta.get("labels") or {}
                    kernel = labels.get(kueue.KERNEL_ID_LABEL)
                    if not kernel or labels.get(kueue.OWNER_LABEL) != self.owner:
                        continue
                    entry = found.setdefault((namespace, str(kernel)), _Found())
                    if kind is kueue.PODS:
                        entry.groups.add(str(labels.get(kueue.POD_GROUP_NAME_LABEL, "")))
                        mounted.add((namespace, launch_failures.launcher_configmap(obj) or ""))
                    elif kind is kueue.SERVICES:
                        entry.services.add(str(meta["name"]))
                    else:
                        entry.secrets.add(str(meta["name"]))
        known = {names.label_value(k) for k in self._known()}  # read after the lists
        suspects = {key for key in found if key[1] not in known}
        ripe, self._suspects = suspects & self._suspects, suspects - self._suspects
        try:
            workloads = await self._discovery.workloads(api) if ripe else None
        except errors.ClusterApiError:
            self._suspects |= ripe  # still ripe at the next sweep
            raise
        for key in sorted(ripe):
            try:
                done = await _delete(api, key, found[key], workloads)
            except errors.ClusterApiError as exc:  # still there at the next sweep: try again
                self.log.debug("reaper: kernel %s: %s", short_id(key[1]), exc)
                self._suspects.add(key)
                continue
            deleted += self._report(key, done, "unknown to this server")
        for namespace in sorted(set(namespaces)):
            deleted += await self._sweep_launchers(api, namespace, mounted)
        return deleted

    async def _sweep_launchers(self, api: KubeApi, namespace: str, mounted: set[Key]) -> list[str]:
        """Delete the launcher ConfigMaps of `namespace` no pod mounted at two sweeps in a row."""
        selector = f"{kueue.MANAGED_BY_LABEL}={kueue.MANAGED_BY},{LAUNCHERS}"
        items, _ = await api.list(kueue.CONFIGMAPS, namespace, label_selector=selector)
        unused = {
            (namespace, str(obj["metadata"]["name"]))
            for obj in items
            if obj["metadata"]["name"] != self._current()
        } - mounted
        if unused:  # maybe another server's pods mount them: one list of every pod of ours
            pods, _ = await api.list(kueue.PODS, namespace, label_selector=OURS)
            unused -= {(namespace, launch_failures.launcher_configmap(p) or "") for p in pods}
        kept = {key for key in self._stale if key[0] != namespace}
        ripe, self._stale = unused & self._stale, kept | unused
        deleted = []
        for _, name in sorted(ripe):
            if await api.delete(kueue.CONFIGMAPS, namespace, name):
                self.log.info(
                    "reaper: deleted ConfigMap %s in %s (no pod uses it)", name, namespace
                )
                deleted.append(f"ConfigMap {name}")
        self._stale -= ripe
        return deleted

    def _report(self, key: Key, done: list[str], why: str) -> list[str]:
        namespace, kernel = key
        for what in done:
            self.log.info(
                "reaper: deleted %s in %s (kernel %s, %s)", what, namespace, short_id(kernel), why
            )
        return done

    async def run(
        self,
        client: Callable[[], Awaitable[KubeApi]],
        namespaces: Callable[[], Iterable[str]],
        interval: float,
    ) -> None:
        """Sweep now, then every `interval` seconds, until cancelled; a failed sweep is logged
        (once for the same failure) and the next one tries again."""
        while True:
            try:
                await self.sweep(await client(), namespaces())
                if self._reported:
                    self.log.info("reaper: sweeping again")
                    self._reported = ""
            except errors.ClusterApiError as exc:
                if isinstance(exc, errors.ClusterForbidden):
                    text = explain.forbidden(exc, "the reaper")
                else:
                    text = f"the reaper cannot list this server's objects ({exc})"
                if text != self._reported:
                    self._reported = text
                    self.log.warning("%s; it tries again in %g s", text, interval)
            await asyncio.sleep(interval)


async def _delete(api: KubeApi, key: Key, found: _Found, workloads: kueue.Kind | None) -> list[str]:
    namespace, kernel = key
    groups = found.groups - {""}
    deleted = await cleanup.delete_kernel(
        api, namespace, kernel, groups, workloads=workloads, service="", secret=""
    )
    for service in sorted(found.services):
        if await api.delete(kueue.SERVICES, namespace, service):
            deleted.append(f"Service {service}")
    for secret in sorted(found.secrets):
        if await api.delete(kueue.SECRETS, namespace, secret):
            deleted.append(f"Secret {secret}")
    return deleted


class HandOver:
    """Runs deletion work through `connect`'s client; what fails goes to `reaper`, which sweeps
    every `interval()` seconds (0: off)."""

    def __init__(
        self,
        reaper: Reaper,
        connect: Callable[[], Awaitable[KubeApi]],
        interval: Callable[[], float],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self._reaper, self._connect, self._interval, self._log = reaper, connect, interval, log
        self._warned: set[str] = set()  # kernels whose hand-over was logged

    async def run(self, namespace: str, kernel: str, what: str, work: Work) -> bool:
        """Run `work`; if the API keeps failing, give it to the reaper (one warning per kernel)
        and return False."""
        api = await self._connect()
        try:
            await work(api)
            return True
        except errors.ClusterApiError as exc:
            self._reaper.hand_over(namespace, kernel, what, work)
            if kernel not in self._warned:
                self._warned.add(kernel)
                self._log.warning(
                    "kernel %s: %s failed (%s); %s", short_id(kernel), what, exc, self._then(kernel)
                )
            return False

    def _then(self, kernel: str) -> str:
        interval = self._interval()
        if interval > 0:
            return f"the reaper deletes what is left within {interval:g} s"
        return (
            "the reaper is off (reap_interval = 0): delete its objects by hand "
            f"(kubectl delete pods,services,secrets -l {cleanup.kernel_selector(kernel)})"
        )
