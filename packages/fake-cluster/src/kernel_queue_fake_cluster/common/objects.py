"""What every part of the fake cluster says about objects: `Obj` (an object as plain JSON)
and the timestamps metadata and conditions carry."""

from __future__ import annotations

import datetime
from typing import Any

Obj = dict[str, Any]


def now_rfc3339() -> str:
    """Now, as metadata and conditions write it (UTC, whole seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """Now as a `MicroTime` (a Lease's renewTime, an Event's eventTime)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
