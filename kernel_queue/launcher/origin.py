"""Where this launcher runs from: the archive the server delivered, or an installed package.

A leaf (stdlib only) that the settings read and the archive's entry point (``launcher.archive``)
shares, so neither imports the other.
"""

from __future__ import annotations

import zipimport

KERNEL_COMMAND = "kernel"
"""First argument that makes the archive run the kernel instead of the launcher."""


def path() -> str | None:
    """The archive this code runs from, or None when it runs from an installed package."""
    loader = globals().get("__loader__")
    return loader.archive if isinstance(loader, zipimport.zipimporter) else None
