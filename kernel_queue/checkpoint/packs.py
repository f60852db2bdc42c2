"""Small arrays packed into one payload file, `small-arrays.bin`, instead of the session pickle.

numpy's own reduce costs the (pure Python) session pickler some 18 objects per array, dtype
and all, so a notebook's dict of 10,000 little arrays pickled slower than the big ones wrote.
Here each costs a short reference (offset, dtype string, shape, order); `Unpacker` builds each
array once, owning its memory. Only plain arrays of simple dtypes are packed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

from kernel_queue.checkpoint import CheckpointWriter, arrays

if TYPE_CHECKING:
    import numpy as np
else:
    np = arrays.NUMPY

FILE = "small-arrays.bin"
KIND = "small-arrays"


def packable(obj: Any) -> bool:
    """Whether `obj` is a plain array `Packer` takes (the caller leaves out big ones)."""
    if type(obj) is not np.ndarray:
        return False
    dtype = obj.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return False
    return bool(obj.flags.c_contiguous or obj.flags.f_contiguous)


class Packer:
    """Writes packed arrays to `small-arrays.bin` as the pickle meets them, each once."""

    def __init__(self, writer: CheckpointWriter) -> None:
        self.writer = writer
        self.offset = 0
        self._file: BinaryIO | None = None
        self._seen: dict[int, tuple[tuple[Any, ...], Any]] = {}  # id → (pid, obj kept alive)

    def reference(self, obj: np.ndarray[Any, Any]) -> tuple[Any, ...]:
        """("small", number, offset, dtype, shape, fortran) for a `packable` array, written
        once (the number tells apart empty arrays, which share an offset)."""
        known = self._seen.get(id(obj))
        if known is not None:
            return known[0]
        if self._file is None:
            self._file = self.writer.open(FILE)
        fortran = not obj.flags.c_contiguous
        data = obj.tobytes(order="F" if fortran else "C")  # a copy: the bytes hashed are written
        self._file.write(data)
        pid = ("small", len(self._seen), self.offset, obj.dtype.str, obj.shape, fortran)
        self.offset += len(data)
        self._seen[id(obj)] = (pid, obj)
        return pid

    def close(self, payload: list[dict[str, Any]]) -> None:
        """Close the file (if any array was packed) and list it in the manifest's payload."""
        if self._file is not None:
            self._file.close()
            entry = {"file": FILE, "kind": KIND, "count": len(self._seen), "bytes": self.offset}
            payload.append(entry)


class Unpacker:
    """Builds the arrays of a checked `small-arrays.bin`, each once (aliasing is kept)."""

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self._built: dict[int, np.ndarray[Any, Any]] = {}
        self._dtypes: dict[str, np.dtype[Any]] = {}

    def array(self, pid: tuple[Any, ...]) -> np.ndarray[Any, Any]:
        _, number, offset, dtype, shape, fortran = pid
        built = self._built.get(number)
        if built is None:
            kind = self._dtypes.get(dtype)
            if kind is None:
                kind = self._dtypes[dtype] = np.dtype(dtype)
            order: Literal["C", "F"] = "F" if fortran else "C"
            if offset + math.prod(shape) * kind.itemsize > len(self.data):
                raise ValueError(f"a packed array reaches past the end of {FILE}")
            view = np.ndarray(shape, kind, buffer=self.data, offset=offset, order=order)
            built = self._built[number] = view.copy(order=order)
        return built
