"""Whose object is this: the owning server's id, the backends alive in this process, and
creating an object as ours or not at all.

`default_owner()` is the host's name and the Jupyter server's port (stable across a restart of
the same server, distinct for two servers on one host); outside a Jupyter server, the host's
name and the user id; every object a server creates carries it. `REGISTRY` lets backends of one
process that share an owner id count each other's kernels as known, so no reaper of this process
takes another's kernel.

`create_owned` retries transient failures within a `retries.Backoff`; a create whose answer was
lost may have made the object, so the retry meets a 409, reads the object and takes it when it
is ours: a 409 is ours only when the object found carries this kernel's id and this server's
owner labels. Someone else's object is a `ForeignObject` naming it, the kernel and what to do;
it is never changed or deleted.
"""

from __future__ import annotations

import os
import socket
import sys
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.kube import kueue, names
from kernel_queue.kube.client import retries
from kernel_queue.kube.client.verbs import KubeApi

Obj = dict[str, Any]
OWNERSHIP_LABELS = (kueue.KERNEL_ID_LABEL, kueue.OWNER_LABEL)
"""The labels that make an object ours: the kernel's id and the server's owner id."""
WORDS = {"pods": "pod", "secrets": "Secret", "services": "Service"}


class ForeignObject(errors.ClusterConflict):
    """409: an object of the name we need exists and is not this kernel's (another kernel's,
    another server's, or made by hand). Its message says which and what to do."""


class _Vanished(errors.ClusterUnavailable):
    """A 409 whose object was gone when read: create again."""


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """The object's labels (an empty dict when it has none)."""
    return dict((obj.get("metadata") or {}).get("labels") or {})


def ownership(obj: Mapping[str, Any]) -> dict[str, str]:
    """The ownership labels `obj` carries (those of `OWNERSHIP_LABELS` it has)."""
    found = labels(obj)
    return {key: found[key] for key in OWNERSHIP_LABELS if key in found}


def is_ours(obj: Mapping[str, Any], mine: Mapping[str, str]) -> bool:
    """True when `obj` carries every ownership label of `mine` with the same value."""
    found = labels(obj)
    return all(found.get(key) == mine.get(key) for key in OWNERSHIP_LABELS)


async def create_owned(
    api: KubeApi, kind: kueue.Kind, namespace: str, body: Obj, *, who: str, policy: retries.Backoff
) -> Obj:
    """Create `body` (which carries our ownership labels) and return the stored object; on 409
    return the existing one if it is ours, else raise `ForeignObject`. `who` ("kernel 1a2b3c4d")
    starts its message. Transient errors are retried within `policy`, then raised."""
    name = str(body["metadata"]["name"])
    mine = ownership(body)

    async def attempt() -> Obj:
        try:
            return await api.create(kind, namespace, body)
        except errors.ClusterConflict as exc:
            try:
                existing = await api.get(kind, namespace, name)
            except errors.ClusterNotFound:
                raise _Vanished(409, "Conflict", f"{exc.message} (and then was gone)") from exc
            if is_ours(existing, mine):
                return existing
            raise ForeignObject(
                409, "AlreadyExists", foreign(who, kind, namespace, existing)
            ) from exc

    return await retries.retry(attempt, policy)


def foreign(who: str, kind: kueue.Kind, namespace: str, existing: Mapping[str, Any]) -> str:
    """The sentence for someone else's object in the way."""
    name = (existing.get("metadata") or {}).get("name", "")
    word = WORDS.get(kind.plural, kind.qualified)
    found = ownership(existing)
    whose = (
        "carries " + " and ".join(f"{key}={value!r}" for key, value in sorted(found.items()))
        if found
        else "carries no kernel-queue owner"
    )
    return (
        f"{who}: a {word} named {name!r} already exists in namespace {namespace!r} and is not "
        f"this kernel's (it {whose}); it was left as it is. If it is a leftover, delete it "
        f"(kubectl delete {kind.qualified} {name} -n {namespace}) and start the kernel again."
    )


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
