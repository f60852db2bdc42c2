"""What the session pickle refuses or writes as a reference instead of a value.

Refused (the variable is skipped with the reason): open files, which dill would reopen (and a
file open for writing truncate), and tensors inside an autograd graph, which would come back
as leaves. References: an array view onto an array that is itself a saved variable (restored
as a view, sharing its memory again); an imported module met inside a value (dill pickles any
module outside site-packages by value, and its restore overwrote the live module's globals);
and a library class or function dill cannot find because its module is not an attribute of its
package (torch.optim.adam) but is in `sys.modules`.
"""

from __future__ import annotations

import importlib
import io
import sys
import types
from typing import TYPE_CHECKING, Any

from kernel_queue.checkpoint import arrays

if TYPE_CHECKING:
    import numpy as np
else:
    np = arrays.NUMPY

_IN_MEMORY = (io.BytesIO, io.StringIO)


def refusal(obj: Any, tensors: tuple[type, ...]) -> str:
    """Why `obj` must not be saved ("" if it may)."""
    if isinstance(obj, io.IOBase) and not isinstance(obj, _IN_MEMORY):
        name = getattr(obj, "name", None)
        what = f"an open file ({name})" if isinstance(name, str) else "a file object"
        return f"{what} is not saved; open it again after the restore"
    if tensors and type(obj) in tensors and obj.requires_grad and not obj.is_leaf:
        return "a tensor inside an autograd graph is not saved; save its .detach() or recompute it"
    return ""


class Globals:
    """Finds library classes and functions dill would pickle by value though they import."""

    def __init__(self, main_name: str) -> None:
        self.main_name = main_name
        self._dill_finds: dict[str, bool] = {}

    def reference(self, obj: Any) -> tuple[str, ...] | None:
        """("module", name) for an imported module, ("global", module, qualname) for such a
        class or function, else None (dill handles it)."""
        if isinstance(obj, types.ModuleType):
            name = getattr(obj, "__name__", None)
            if isinstance(name, str) and sys.modules.get(name) is obj and name != self.main_name:
                return ("module", name)
            return None
        if not isinstance(obj, type) and type(obj) is not types.FunctionType:
            return None
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
            return None
        if module in ("__main__", "builtins", self.main_name) or module not in sys.modules:
            return None
        if _walk(sys.modules[module], qualname) is not obj:
            return None
        if module not in self._dill_finds:
            import dill  # type: ignore[import-untyped]  # a save's, never a kernel's start

            found = dill._dill._import_module(module, safe=True)
            self._dill_finds[module] = found is sys.modules[module]
        return None if self._dill_finds[module] else ("global", module, qualname)


def view(obj: Any, roots: set[int]) -> tuple[Any, ...] | None:
    """("view", root, offset, shape, strides, dtype, writeable) for an array viewing the memory
    of an array in `roots` (ids of arrays saved as variables), else None."""
    if type(obj) is not np.ndarray or obj.base is None or obj.dtype.hasobject:
        return None
    root = obj.base
    while type(root) is np.ndarray and root.base is not None:
        root = root.base
    if type(root) is not np.ndarray or id(root) not in roots:
        return None
    if not (root.flags.c_contiguous or root.flags.f_contiguous):
        return None
    offset = obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return ("view", root, offset, obj.shape, obj.strides, obj.dtype, bool(obj.flags.writeable))


def rebuild(pid: tuple[Any, ...]) -> Any:
    """The object a "view", "module" or "global" reference stands for."""
    if pid[0] == "module":
        return importlib.import_module(pid[1])
    if pid[0] == "global":
        return _walk(importlib.import_module(pid[1]), pid[2])
    _, root, offset, shape, strides, dtype, writeable = pid
    memory = root.reshape(-1, order="A").view(np.uint8)  # the root's bytes, in memory order
    array = np.ndarray(shape, dtype, buffer=memory, offset=offset, strides=strides)
    if not writeable:
        array.flags.writeable = False
    return array


def _walk(module: Any, qualname: str) -> Any:
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found
