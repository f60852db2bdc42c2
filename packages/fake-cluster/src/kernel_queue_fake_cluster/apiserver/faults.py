"""The fake API server's injected faults: what the next requests of a verb and resource meet.

A `Fault` answers an error status instead of serving (`retry_after` adds the `Retry-After`
header an overloaded apiserver sends), or serves and then answers the error (`after`: the
change was made, the answer lost, as on a timeout), or first plants an object of the request's
name that someone else made (`plant`: the create then meets a real 409 AlreadyExists). `Faults`
queues them per (verb, resource); `server.Server` takes one per request.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
PLANTED_LABEL = "fake.kernel-queue.dev/planted"
"""The label on an object `plant` made (its other labels are the ones given, or none)."""


class InjectedError(ApiError):
    """An injected error answer, with the `Retry-After` seconds to send (None: no header)."""

    def __init__(self, code: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(code, REASONS.get(code, "InternalError"), message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Fault:
    """One injected answer. `status` 0 with `plant` set: no error of its own."""

    status: int = 500
    retry_after: int | None = None
    after: bool = False
    plant: Mapping[str, str] | None = field(default=None)
    """Labels of an object of the request's name to create first (a create then meets 409)."""

    def error(self, verb: str, resource: str) -> InjectedError:
        """The error this fault answers with."""
        message = f"injected fault: {verb} {resource} answered {self.status}"
        return InjectedError(self.status, message, self.retry_after)

    def planted(self, body: Any) -> Obj | None:
        """The foreign object to create before serving `body`, or None."""
        if self.plant is None or not isinstance(body, dict):
            return None
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta["labels"] = {**self.plant, PLANTED_LABEL: "true"}
        meta.pop("annotations", None)
        return obj


class Faults:
    """Faults waiting for their requests, first in first out per (verb, resource)."""

    def __init__(self) -> None:
        self._queued: dict[tuple[str, str], collections.deque[Fault]] = {}

    def __bool__(self) -> bool:
        return any(self._queued.values())

    def add(self, verb: str, resource: str, fault: Fault, count: int = 1) -> None:
        """Queue `fault` for the next `count` `verb` requests on `resource`."""
        self._queued.setdefault((verb, resource), collections.deque()).extend([fault] * count)

    def take(self, verb: str, resource: str) -> Fault | None:
        """The fault this request meets, if any (each is met once)."""
        queued = self._queued.get((verb, resource))
        return queued.popleft() if queued else None

    def pending(self) -> int:
        """Faults not yet met."""
        return sum(len(q) for q in self._queued.values())

    def clear(self) -> None:
        """Forget every fault not yet met."""
        self._queued.clear()
