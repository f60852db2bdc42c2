"""Deleting what a kernel left in the cluster, or handing it to the reaper when the API fails.

`HandOver.run` runs one piece of deletion work (a release, a group's end, the undo of a failed
submit). When the API keeps failing (a `ClusterApiError` after its retries) the work goes to
the reaper, which retries it at each sweep, and the admin's log says so once per kernel, with
what to do by hand when the reaper is off. Nothing is raised: a user's shutdown never fails on
the cluster's account.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import cleanup
from kernel_queue.kube.reaper import Reaper
from kernel_queue.kube.verbs import KubeApi
from kernel_queue.model import short_id

Work = Callable[[KubeApi], Awaitable[Any]]


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
