"""Kernel ids: the one form kernel-queue accepts, checked before anything is named after one.

jupyter_server lets a client choose a kernel's id (`POST /api/kernels {"kernel_id": ...}`) and
accepts any string; queue entries, log and checkpoint paths and cluster objects are named after
the id, so only a canonical lowercase UUID passes. Pure: no I/O.
"""

from __future__ import annotations

import re

from kernel_queue import errors

_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SHOWN = 64  # characters of a refused id quoted in the message


def is_valid(kernel_id: object) -> bool:
    """True for a lowercase UUID in its canonical 8-4-4-4-12 form (any version)."""
    return isinstance(kernel_id, str) and _CANONICAL.fullmatch(kernel_id) is not None


def check(kernel_id: object) -> str:
    """`kernel_id` if valid; else a `ConfigError` that quotes it (escaped, shortened)."""
    if is_valid(kernel_id):
        return str(kernel_id)
    text = str(kernel_id)
    shown = repr(text[:_SHOWN]) + ("…" if len(text) > _SHOWN else "")
    raise errors.ConfigError(
        f"kernel id {shown} is not a lowercase UUID such as "
        "'1b4e28ba-2fa1-41d2-883f-0016d3cca427'; kernel-queue names queue entries, files and "
        "cluster objects after the id, so it accepts no other form. Start the kernel without "
        "choosing an id (the server picks one), or choose a lowercase UUID."
    )


def directory(kernel_id: object) -> str:
    """The name of a kernel's own directory under any root (its checkpoints, locally or in a
    claim's ``subPath``): its id, checked, so it is always one safe path segment."""
    return check(kernel_id)
