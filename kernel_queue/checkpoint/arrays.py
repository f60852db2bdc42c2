"""numpy for the checkpoint library, where the kernel's image has it.

A kernel image need not have numpy (the server delivers the launcher to any image with Python
and ipykernel). `NUMPY` and `FORMAT` stand for ``numpy`` and ``numpy.lib.format``: an
attribute is numpy's own once numpy imports; without numpy, ``ndarray`` and ``memmap`` are a
class no object is an instance of (a kernel without numpy holds no arrays, so every check for
one says no), and anything else raises `MissingNumpy`, which says what to add to the image.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from kernel_queue.errors import KernelQueueError

MISSING_NUMPY = (
    "this checkpoint holds numpy arrays, but the kernel's image has no numpy: add numpy to "
    "the image"
)


class MissingNumpy(KernelQueueError, ImportError):
    """numpy is needed (a checkpoint with arrays) and the image has none."""


class _NoArray:
    """What ``ndarray`` and ``memmap`` are without numpy: nothing is an instance of it."""


class Lazy:
    """A module imported on first use, with the stand-ins above where it is missing."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._missing = False

    def module(self) -> ModuleType | None:
        """The module, or None where this image has no numpy."""
        found = sys.modules.get(self._name)
        if found is not None or self._missing:
            return found
        try:
            return importlib.import_module(self._name)
        except ImportError:
            self._missing = True  # not looked for again, unless the user imports it later
            return None

    def __getattr__(self, name: str) -> Any:
        found = self.module()
        if found is None:
            if name in ("ndarray", "memmap"):
                return _NoArray
            raise MissingNumpy(MISSING_NUMPY)
        value = getattr(found, name)
        setattr(self, name, value)  # later lookups skip __getattr__ (the pickler's hot path)
        return value


NUMPY = Lazy("numpy")
FORMAT = Lazy("numpy.lib.format")


def version() -> str | None:
    """numpy's version, or None where the image has no numpy."""
    found = NUMPY.module()
    return str(found.__version__) if found is not None else None
