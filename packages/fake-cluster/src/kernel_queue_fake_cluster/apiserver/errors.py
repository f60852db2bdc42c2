"""The errors the fake API server answers: `ApiError` carries the `Status` body a real
apiserver sends (code, reason, message, details), and `not_found` and `invalid` word the two
most common ones as the apiserver does. Raised by the store, its hooks and the HTTP layer alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType


class ApiError(Exception):
    """An error the API server answers with a `Status` body."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})

    def status(self) -> Obj:
        """The `Status` object for the response body."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(rtype: ResourceType, name: str) -> ApiError:
    """404 NotFound for object `name` of `rtype`."""
    what = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
    details = {"name": name, "group": rtype.group, "kind": rtype.plural}
    return ApiError(404, "NotFound", f'{what} "{name}" not found', details)


def invalid(rtype: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid listing each (field path, message), as the apiserver words it."""
    text = "; ".join(f"{path}: {message}" for path, message in causes)
    details = {
        "name": name,
        "group": rtype.group,
        "kind": rtype.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": p} for p, m in causes],
    }
    return ApiError(422, "Invalid", f'{rtype.kind} "{name}" is invalid: {text}', details)
