"""`BackendLease`: one front end's use of a backend that everything one owner runs shares.

A kernel's session (`session.KernelSession`) holds one. The owner is the server's (or Enterprise
Gateway's) mapping kernel manager, else the event loop; Enterprise Gateway has no hook at its
final shutdown, so its leases are counted and the last to end closes the owner's backends.
"""

from __future__ import annotations

from typing import Any

from kernel_queue import backends

# id(owner) -> counted leases of that owner's backends (see `BackendLease`)
_users: dict[int, int] = {}


class BackendLease:
    """One front end's use of the backend `name` shared by everything `owner` runs.

    `counted`: the owner's last counted lease to end closes the owner's backends (Enterprise
    Gateway has no hook at its final shutdown); uncounted leases leave that to the kernel
    manager (`server.kernelmanager.QueuedMappingKernelManager.shutdown_all`)."""

    def __init__(self, name: str, *, owner: Any, config: Any, log: Any, counted: bool = False):
        self.name = name
        self.backend = backends.get_backend(name, owner=owner, config=config, log=log)
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
            await backends.aclose_all(owner)
