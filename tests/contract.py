"""A backend driven through the `ClusterBackend` API alone, as the backend contract tests and
the kubernetes parking tests drive one: `Contract` makes a provisioner's group spec for it,
`Followed` records every status one `watch` yields, `client_of` connects to a running group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec

from kernel_queue import backends, kernel_info, spec
from kernel_queue.model import GroupPhase, GroupRef, GroupSpec, GroupStatus
from kernel_queue.provisioner import QueuedKernelProvisioner

ARGV = ["python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"]
ENDED = (GroupPhase.FINISHED, GroupPhase.FAILED)


class Contract:
    """A backend under test and how to make a group spec for it."""

    def __init__(self, backend: backends.ClusterBackend, queue: str, **options: Any) -> None:
        self.backend, self.queue, self.options = backend, queue, options
        self.followed: list[Followed] = []

    def follow(self, ref: GroupRef) -> Followed:
        """Watch the group until the test ends."""
        followed = Followed(self.backend, ref)
        self.followed.append(followed)
        return followed

    async def aclose(self) -> None:
        for followed in self.followed:
            await followed.aclose()
        await self.backend.aclose()

    def spec(self, priority_class: str) -> GroupSpec:
        """A one-GPU kernel of `priority_class`, as the provisioner would submit it."""
        kernelspec = KernelSpec(argv=ARGV, display_name="contract", language="python")
        options = QueuedKernelProvisioner(
            kernel_id=str(uuid.uuid4()),
            kernel_spec=kernelspec,
            backend=self.backend.name,
            queue=self.queue,
            gpus=1,
            priority_class=priority_class,
            **self.options,
        )
        group = spec.build(options, argv_extra=[], cwd=None)
        return spec.with_env(group, dict(os.environ), [])


class Followed:
    """Every status one `watch` of a group yields, in a task."""

    def __init__(self, backend: backends.ClusterBackend, ref: GroupRef) -> None:
        self.statuses: list[GroupStatus] = []
        self.ended = False
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._follow(backend.watch(ref)))

    async def _follow(self, stream: AsyncIterator[GroupStatus]) -> None:
        async for status in stream:
            self.statuses.append(status)
            self._changed.set()
        self.ended = True
        self._changed.set()

    @property
    def phase(self) -> GroupPhase | None:
        return self.statuses[-1].phase if self.statuses else None

    def phases(self) -> list[GroupPhase]:
        """The distinct successive phases seen."""
        seen: list[GroupPhase] = []
        for status in self.statuses:
            if not seen or seen[-1] is not status.phase:
                seen.append(status.phase)
        return seen

    async def until(self, check: Callable[[Followed], bool], within: float = 60) -> None:
        if not await self.reaches(check, within):
            pytest.fail(
                f"the group never got there; it went through {self.phases()}, the last "
                f"statuses saying {self.said()}"
            )

    def said(self, last: int = 4) -> str:
        """The phase and message of the `last` distinct statuses seen (why a group ended)."""
        told: list[str] = []
        for status in self.statuses:
            text = f"{status.phase.value}: {status.message}".rstrip(": ")
            if not told or told[-1] != text:
                told.append(text)
        return "; ".join(told[-last:])

    async def reaches(self, check: Callable[[Followed], bool], within: float) -> bool:
        """Whether `check` holds within `within` s (read at each status)."""
        try:
            async with asyncio.timeout(within):
                while not check(self):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def running(self, ref: GroupRef) -> None:
        """Wait until the group runs and its kernel answers."""
        await self.until(lambda f: f.phase is GroupPhase.RUNNING)
        address = self.statuses[-1].address or ref.connection.ip
        await asyncio.wait_for(kernel_info.answers(ref.connection, address), 60)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def submitted(contract: Contract, priority_class: str) -> tuple[GroupRef, Followed]:
    ref = await contract.backend.submit(contract.spec(priority_class))
    return ref, contract.follow(ref)


async def client_of(ref: GroupRef, address: str) -> AsyncKernelClient:
    client = AsyncKernelClient()
    client.load_connection_info({**ref.connection.to_dict(), "ip": address})
    client.start_channels(hb=False)  # a late beat on a loaded machine is no death
    await client.wait_for_ready(timeout=60)
    return client
