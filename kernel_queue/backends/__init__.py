"""The seam between the provisioner and where kernels run, and the choice of backend.

`ClusterBackend` is what the provisioner calls; `get_backend` returns the one instance of a
backend shared by every kernel of one kernel manager (a Jupyter server), created on first use.
A front end holds a `BackendLease` on the backend its kernels share; Enterprise Gateway has no
hook at its final shutdown, so its leases are counted and the last to end closes the owner's
backends. The backends themselves are the packages `local` and `kubernetes`, and `fake` for
tests. Nothing here reads config at import time.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.model import GroupRef, GroupSpec, GroupStatus, StopCause

NAMES = ("local", "kubernetes")


class ClusterBackend(Protocol):
    """Queues, runs and stops kernel groups. One instance serves all kernels of a server."""

    name: str
    tracks_kernel_restarts: bool
    """Whether statuses report each kernel process (`generation`, `kernel_alive`); a backend
    that cannot see them (pods) leaves the provisioner to watch the heartbeat instead."""

    async def submit(self, spec: GroupSpec) -> GroupRef:
        """Queue the group, or return its ref if it is already queued or running.

        Raises a `KernelQueueError` naming the fix, having created nothing, when the spec
        cannot be served (unknown queue or priority class, a request that can never fit).
        """
        ...

    def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        """Yield the current status, then every change, ending after a terminal phase."""
        ...

    async def stop(self, ref: GroupRef, *, grace: float, cause: StopCause) -> None:
        """Stop the kernel (or restart it in place for `StopCause.RESTART`); keep the admission."""
        ...

    async def send_signal(self, ref: GroupRef, signum: int) -> None:
        """Deliver a signal to the kernel where the backend can; otherwise do nothing."""
        ...

    async def park(self, ref: GroupRef, *, grace: float) -> None:
        """Park a running kernel: stop it as a preemption does (it saves within `grace`), give
        back its admission and keep the group, reporting PARKING, then PARKED. Idempotent; does
        nothing unless the group runs."""
        ...

    async def resume(self, ref: GroupRef) -> None:
        """Put a parked group back in its queue (QUEUED, ADMITTED, RUNNING; the next kernel
        process restores its checkpoint). Asked while PARKING, it takes effect once parked;
        otherwise it does nothing."""
        ...

    async def release(self, ref: GroupRef) -> None:
        """Stop everything, give back the queue place or quota, delete what was created."""
        ...

    async def aclose(self) -> None:
        """Release every group and stop background work."""
        ...


_shared: weakref.WeakKeyDictionary[Any, dict[str, ClusterBackend]] = weakref.WeakKeyDictionary()


def get_backend(name: str, *, owner: Any, config: Any, log: Any) -> ClusterBackend:
    """The backend `name` shared by everything `owner` (a kernel manager or an event loop) runs."""
    backends = _shared.setdefault(owner, {})
    backend = backends.get(name)
    if backend is None:
        backend = _create(name, config=config, log=log)
        backends[name] = backend
    return backend


def existing(name: str, *, owner: Any) -> ClusterBackend | None:
    """The backend `name` of `owner` if one was created; never creates one."""
    return _shared.get(owner, {}).get(name)


async def aclose_all(owner: Any) -> None:
    """Close every backend `owner` created (its informers, processes and connections)."""
    for backend in _shared.pop(owner, {}).values():
        await backend.aclose()


def _create(name: str, *, config: Any, log: Any) -> ClusterBackend:
    if name == "local":
        from kernel_queue.backends import local

        return local.LocalBackend(config=config, log=log)
    if name == "kubernetes":
        try:
            from kernel_queue.backends import kubernetes
        except ImportError as exc:
            raise errors.ConfigError(
                f"the 'kubernetes' backend needs the Kubernetes client ({exc}); install "
                '"kernel-queue[kubernetes]"'
            ) from exc
        return kubernetes.KubernetesBackend(config=config, log=log)
    raise errors.ConfigError(f"unknown backend {name!r}: choose one of {', '.join(NAMES)}")


# id(owner) -> counted leases of that owner's backends (see `BackendLease`)
_users: dict[int, int] = {}


class BackendLease:
    """One front end's use of the backend `name` shared by everything `owner` runs.

    `counted`: the owner's last counted lease to end closes the owner's backends (Enterprise
    Gateway has no hook at its final shutdown); uncounted leases leave that to the kernel
    manager (`server.kernelmanager.QueuedMappingKernelManager.shutdown_all`)."""

    def __init__(self, name: str, *, owner: Any, config: Any, log: Any, counted: bool = False):
        self.name = name
        self.backend = get_backend(name, owner=owner, config=config, log=log)
        self._owner: Any = owner if counted else None
        if counted:
            _users[id(owner)] = _users.get(id(owner), 0) + 1

    def forget(self) -> bool:
        """Stop counting this lease (idempotent); True if it was its owner's last."""
        owner, self._owner = self._owner, None
        if owner is None:
            return False
        _users[id(owner)] -= 1
        if _users[id(owner)]:
            return False
        del _users[id(owner)]
        return True

    async def aclose(self) -> None:
        """End the lease; close the owner's backends if no counted lease uses them now."""
        owner = self._owner
        if self.forget():
            await aclose_all(owner)
