"""The owning server's id, put on every object it creates, and the backends alive in this process.

`default_owner()` is the host's name and the Jupyter server's port (stable across a restart of
the same server, distinct for two servers on one host); outside a Jupyter server, the host's
name and the user id. `Registry` lets backends of one process that share an owner id count each
other's kernels as known, so no reaper of this process takes another's kernel.
"""

from __future__ import annotations

import os
import socket
import sys
import weakref
from typing import Protocol

from kernel_queue.kube import names


def _server_port() -> int | None:
    """The port of the running Jupyter server in this process, if there is one.

    The singleton is read as it is: under Kernel Gateway or Enterprise Gateway it is their app,
    a sibling of ServerApp, and `ServerApp.instance()` would raise MultipleInstanceError."""
    module = sys.modules.get("jupyter_server.serverapp")
    app = getattr(getattr(module, "ServerApp", None), "_instance", None)
    port = getattr(app, "port", None)
    return port if isinstance(port, int) and port > 0 else None


def default_owner() -> str:
    """`<host>-<port>` of the Jupyter server, else `<host>-uid<uid>`, as a label value."""
    host = socket.gethostname().split(".")[0] or "localhost"
    port = _server_port()
    return names.label_value(f"{host}-{port}" if port else f"{host}-uid{os.getuid()}")


class Member(Protocol):
    """What the registry asks of a backend."""

    def known_kernels(self) -> set[str]:
        """The kernel ids this backend holds objects or groups of."""
        ...


class Registry:
    """The live backends of this process, by owner id (held weakly)."""

    def __init__(self) -> None:
        self._members: weakref.WeakKeyDictionary[Member, str] = weakref.WeakKeyDictionary()

    def add(self, backend: Member, owner: str) -> None:
        self._members[backend] = owner

    def remove(self, backend: Member) -> None:
        self._members.pop(backend, None)

    def known(self, owner: str) -> set[str]:
        """Every kernel id a live backend of `owner` knows."""
        found: set[str] = set()
        for backend, member_owner in list(self._members.items()):
            if member_owner == owner:
                found |= backend.known_kernels()
        return found


REGISTRY = Registry()
