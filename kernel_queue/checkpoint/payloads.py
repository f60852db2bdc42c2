"""Payload files written out of band: numpy arrays and torch tensors of 1 MiB or more.

The session pickler's `persistent_id` (`OutOfBand`) writes each such object once, to its own
`.npy` or `.pt` file, and leaves a reference in the pickle; `read` reads a file back with its
digest checked (an array, or a tensor's storage, straight into its own memory: no second copy),
`build` makes the object. Arrays are
written in chunks (the store hashes each as the file holds it, so a thread changing the array
meanwhile cannot make the digest wrong), and a deadline stops even a huge one; torch is imported
only if the user imported it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import os
import re
import struct
import sys
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol

from kernel_queue.checkpoint import CheckpointWriter, arrays, digests, packs, references

if TYPE_CHECKING:
    import numpy as np
    import numpy.lib.format as npy
else:
    np = arrays.NUMPY
    npy = arrays.FORMAT

BIG = 1 << 20
"""Arrays and tensors of at least this many bytes go to their own payload file."""
PLAIN = frozenset({str, int, float, bool, complex, bytes, type(None), tuple, list, dict, set})
"""Types no `persistent_id` ever takes over (checked first: most objects are of these)."""
CHUNK = 64 << 20  # bytes per write of a big array; the deadline is checked between chunks


_HEADERS = {(1, 0): "read_array_header_1_0", (2, 0): "read_array_header_2_0"}
"""The .npy header versions `_write_array` writes, and the names of their readers."""


Place = tuple[int, int, str, tuple[int, ...], bool]
"""Where an array's bytes are and the header its file gets: (address, bytes, dtype descr,
shape, Fortran order). Two arrays of one place have the same file if their bytes are equal."""


class DeadlinePassed(Exception):
    """The save's deadline passed: stop writing."""


class History(Protocol):
    """What a save is told of its arrays since the base checkpoint's snapshot (the launcher's
    `page_writes.ArrayHistory`): it spares hashing arrays known unchanged, and hashing arrays
    known written to look for their old file."""

    def unchanged(self, array: np.ndarray[Any, Any]) -> tuple[int, str] | None:
        """(bytes, digest) of the base's file of `array`'s very bytes, if they are known not
        to have changed since; else None."""
        ...

    def written(self, array: np.ndarray[Any, Any]) -> bool:
        """Whether `array`'s bytes are known written since the base (so they are new)."""
        ...


def check(deadline: float | None) -> None:
    """Raise DeadlinePassed once `time.monotonic()` reaches `deadline` (None: no deadline)."""
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlinePassed


class OutOfBand:
    """The session pickler's `persistent_id`: big arrays and tensors to their own files, once;
    the real module and its namespace, met nested in a value, as references to the target;
    views of saved arrays and classes dill cannot find as `references`."""

    def __init__(
        self,
        writer: CheckpointWriter,
        module: ModuleType,
        deadline: float | None,
        payload: list[dict[str, Any]],
        tensors: tuple[type, ...],
        roots: set[int] = frozenset(),  # type: ignore[assignment]
        reuse: Mapping[str, Path] | None = None,
        known: Mapping[int, tuple[int, str]] | None = None,
        history: History | None = None,
    ) -> None:
        self.writer, self.module, self.deadline, self.payload = writer, module, deadline, payload
        self.tensors, self.roots = tensors, roots
        self.reuse = reuse or {}
        """Digest -> an array file of the previous checkpoint (`snapshot.reusable`)."""
        self.known = known or {}
        """id -> (bytes, digest) of arrays the caller knows unchanged since they were hashed."""
        self.history = history
        """Which arrays are known unchanged or written since the base (None: nothing known)."""
        self.digests: dict[int, tuple[int, str]] = {}
        """id -> (bytes, digest) of each array file this save wrote or linked."""
        self.places: dict[Place, tuple[int, str]] = {}
        """(bytes, digest) of each contiguous array file this save wrote or linked, by the
        array's `place` (a later save's `History` looks them up)."""
        self.namespace = module.__dict__
        self.globals = references.Globals(module.__name__)
        self.packer = packs.Packer(writer)
        self.written: dict[int, tuple[tuple[Any, ...], Any]] = {}  # id → (pid, obj kept alive)

    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        if obj is self.module:  # nested references to the real module or its namespace
            return ("main",)
        if obj is self.namespace:
            return ("main-dict",)
        if type(obj) in PLAIN:
            return None
        reference = references.view(obj, self.roots) or self.globals.reference(obj)
        if reference is not None:
            return reference
        size = size_of(obj, self.tensors)
        if not size:
            return self.packer.reference(obj) if packs.packable(obj) else None
        if id(obj) in self.written:
            return self.written[id(obj)][0]
        check(self.deadline)
        number = len(self.written) + 1
        if isinstance(obj, np.ndarray):
            name = f"array-{number:04d}.npy"
            pid: tuple[Any, ...] = ("ndarray", name)
            entry = {"kind": "ndarray", "shape": list(obj.shape), "dtype": obj.dtype.str}
        else:
            name = f"tensor-{number:04d}.pt"
            parameter = isinstance(obj, sys.modules["torch"].nn.Parameter)
            pid = ("tensor", name, str(obj.device), parameter, bool(obj.requires_grad))
            entry = {"kind": "tensor", "shape": list(obj.shape), "device": str(obj.device)}
        reused = self._reused(name, obj) if isinstance(obj, np.ndarray) else 0
        if reused:
            self.payload.append({"file": name, **entry, "bytes": reused, "reused": True})
            self.written[id(obj)] = (pid, obj)
            self._placed(obj, self.digests[id(obj)])
            return pid
        file = self.writer.open(name)
        if isinstance(obj, np.ndarray):
            _write_array(file, obj, self.deadline)
        else:
            _write_tensor(file, obj)
        self.payload.append({"file": name, **entry, "bytes": file.tell()})
        file.close()
        digest = getattr(file, "hexdigest", None)  # a store's file records its digest at close
        if isinstance(obj, np.ndarray) and isinstance(digest, str) and digest:
            self.digests[id(obj)] = (self.payload[-1]["bytes"], digest)
            self._placed(obj, self.digests[id(obj)])
        self.written[id(obj)] = (pid, obj)
        return pid

    def _placed(self, array: np.ndarray[Any, Any], found: tuple[int, str]) -> None:
        where = place(array)
        if where is not None:
            self.places[where] = found

    def _reused(self, name: str, array: np.ndarray[Any, Any]) -> int:
        """The bytes of the previous checkpoint's file of `array`'s very bytes, now file `name`
        too; 0 when there is none (or it could not be reused): write it.

        The array is hashed as its file would be (header, then data; the digest threads do
        it), so an array changed in place (`a[0] = 1`) never matches its old file. Only
        contiguous arrays; a store that cannot link (`link` absent or False) gets a new file.
        """
        link = getattr(self.writer, "link", None)
        if not self.reuse or link is None:
            return 0
        found = self.known.get(id(array))
        if found is None and self.history is not None:
            found = self.history.unchanged(array)
            if found is None and self.history.written(array):
                return 0  # new bytes: no old file to look for
        found = found or digest_of(array)
        if found is None or found[1] not in self.reuse:
            return 0
        size, digest = found
        if not link(name, self.reuse[digest], size, digest):
            return 0
        self.digests[id(array)] = found
        return size


def place(array: np.ndarray[Any, Any]) -> Place | None:
    """`array`'s `Place`; None when it is not contiguous (then its file is written in copied
    blocks, and never reused without hashing)."""
    array = np.asarray(array)
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        return None
    header = npy.header_data_from_array_1_0(array)
    address = int(array.__array_interface__["data"][0])
    shape = tuple(int(n) for n in array.shape)
    return address, int(array.nbytes), repr(header["descr"]), shape, bool(header["fortran_order"])


def digest_of(array: np.ndarray[Any, Any]) -> tuple[int, str] | None:
    """(bytes, digest) of the file `_write_array` would write for `array`; None when it is not
    contiguous (its file is written in copied blocks, and not worth hashing twice)."""
    array = np.asarray(array)
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        return None
    head = io.BytesIO()
    _write_header(head, array)
    digest = digests.Digest()
    digest.update(head.getvalue())
    flat = (array if array.flags.c_contiguous else array.T).reshape(-1).view(np.uint8)
    digest.update(flat.data)
    return head.tell() + flat.size, digest.hexdigest()


def read(directory: Path, entry: Mapping[str, Any], record: Mapping[str, Any]) -> Any:
    """The payload file `entry` of the manifest's `payload` list, read with its digest checked
    (`record`: the store's bytes and digest; digests.Mismatch if they do not hold): an array,
    a `packs.Unpacker`, or a `TensorFile` (or, of another layout, a tensor file's bytes) for
    `build`."""
    path, size, expected = (
        directory / str(entry["file"]),
        int(record["bytes"]),
        str(record["digest"]),
    )
    if entry.get("kind") == packs.KIND:
        return packs.Unpacker(digests.read(path, size, expected))
    if entry.get("kind") != "ndarray":
        return _read_tensor(path, size, expected)
    with open(path, "rb") as file:  # the header, checked with the rest below
        version = npy.read_magic(file)
        if version not in _HEADERS:
            raise digests.Mismatch(f"its file {path.name} has a .npy header of version {version}")
        shape, fortran, dtype = getattr(npy, _HEADERS[version])(file)
        header = file.tell()
        file.seek(0)
        parsed = file.read(header)
    if dtype.hasobject:
        raise digests.Mismatch(f"its file {path.name} claims to hold objects (never written so)")
    array = np.empty(shape, dtype, order="F" if fortran else "C")
    data = (array.T if fortran else array).reshape(-1).view(np.uint8)
    head = bytearray(header)
    if header + data.nbytes != size:
        raise digests.Mismatch(
            f"its file {path.name} is {size} bytes, not a {header}-byte header "
            f"and {data.nbytes} of data"
        )
    digests.read_into(path, [head, data], size, expected)
    if head != parsed:  # the header parsed is the header checked
        raise digests.Mismatch(f"its file {path.name} changed while it was read")
    return array


def build(obj: Any, pid: tuple[Any, ...]) -> Any:
    """The object a `persistent_id` reference stands for (not the "main" ones), from `read`."""
    if pid[0] == "ndarray":
        return obj
    return _load_tensor(obj, *pid[2:])


def size_of(obj: Any, tensors: tuple[type, ...]) -> int:
    """Bytes of a numpy array or torch tensor to write out of band, else 0."""
    kind = type(obj)
    if kind is np.ndarray or kind is np.memmap:
        return int(obj.nbytes) if obj.nbytes >= BIG and not obj.dtype.hasobject else 0
    if kind in tensors:
        size = int(obj.element_size() * obj.nelement())
        return size if size >= BIG and str(obj.layout) == "torch.strided" else 0
    return 0


def tensor_types() -> tuple[type, ...]:
    """torch.Tensor and torch.nn.Parameter if the user imported torch (never imported here)."""
    torch = sys.modules.get("torch")
    found = (getattr(torch, "Tensor", None), getattr(getattr(torch, "nn", None), "Parameter", None))
    return tuple(kind for kind in found if isinstance(kind, type))


def _write_array(file: IO[bytes], array: np.ndarray[Any, Any], deadline: float | None) -> None:
    """`np.save(file, array)` in chunks, checking the deadline between them; any memory layout."""
    array = np.asarray(array)  # a memmap is saved as its data and restored as an array
    _write_header(file, array)
    if array.flags.c_contiguous or array.flags.f_contiguous:
        flat = (array if array.flags.c_contiguous else array.T).reshape(-1).view(np.uint8)
        for start in range(0, flat.size, CHUNK):
            check(deadline)
            _write_through(file, flat[start : start + CHUNK].data)
        return
    rows = max(1, CHUNK // max(1, array[:1].nbytes))
    for start in range(0, array.shape[0], rows):
        check(deadline)
        block = np.ascontiguousarray(array[start : start + rows])
        _write_through(file, block.reshape(-1).view(np.uint8).data)


def _write_header(file: IO[bytes], array: np.ndarray[Any, Any]) -> None:
    header = npy.header_data_from_array_1_0(array)
    try:
        npy.write_array_header_1_0(file, header)
    except ValueError:  # a header over 64 KiB (huge structured dtypes)
        npy.write_array_header_2_0(file, header)


def _write_through(file: IO[bytes], data: memoryview) -> None:
    """Write `data`, then have the disk start on it while the next chunk is copied (Linux
    starts writeback of dirty pages on POSIX_FADV_DONTNEED), so the closing fsync waits less."""
    file.flush()
    start = file.tell()
    file.write(data)
    file.flush()
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError, ValueError):
            advise(file.fileno(), start, len(data), os.POSIX_FADV_DONTNEED)


def _write_tensor(file: IO[bytes], tensor: Any) -> None:
    """`torch.save` a host copy of `tensor`, without its autograd graph or a larger storage."""
    torch = importlib.import_module("torch")
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    elif data.untyped_storage().nbytes() != data.element_size() * data.nelement():
        data = data.clone()  # a view: save its elements, not the whole storage behind it
    torch.save(data, file)


class TensorFile:
    """A tensor file as `read` read it, digest checked: its one storage's bytes in `storage` (a
    uint8 CPU tensor, the memory the restored tensor will use) and the zip records around it in
    `head` and `tail`, so the file is in memory once."""

    def __init__(self, head: bytearray, storage: Any, memory: Any, tail: bytearray) -> None:
        self.head, self.storage, self.memory, self.tail = head, storage, memory, tail

    def image(self) -> IO[bytes]:
        """The whole file, read from these parts (the storage's bytes are not copied)."""
        return io.BufferedReader(_Image([self.head, self.memory, self.tail]))


class _Image(io.RawIOBase):
    """A read-only, seekable file over `parts` (bytes-likes) in order."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = [memoryview(part).cast("B") for part in parts]
        self._size = sum(len(part) for part in self._parts)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        done, start = 0, 0
        for part in self._parts:
            end = start + len(part)
            if self._position + done < end and done < len(target):
                low = self._position + done - start
                count = min(len(part) - low, len(target) - done)
                target[done : done + count] = part[low : low + count]
                done += count
            start = end
        self._position += done
        return done


_STORAGE = re.compile(r"[^/]+/data/[0-9]+")
"""The name of a storage's record in a `torch.save` zip ("<archive>/data/<key>")."""
_LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A zip local file header: its signature, then (past 22 bytes) its name's and extra's lengths."""


def _storage_span(file: IO[bytes]) -> tuple[int, int] | None:
    """(offset, bytes) of the one storage record of the `torch.save` zip `file`, stored as is and
    in this machine's byte order; None for any other file (several storages, none, compressed,
    not a zip): `read` then reads it whole and `torch.load` copies the storages out."""
    try:
        with zipfile.ZipFile(file) as archive:
            records = [info for info in archive.infolist() if _STORAGE.fullmatch(info.filename)]
            if len(records) != 1:
                return None
            (record,) = records
            order = [info for info in archive.infolist() if info.filename.endswith("/byteorder")]
            if len(order) > 1 or (order and archive.read(order[0]).decode() != sys.byteorder):
                return None
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            return None
        file.seek(record.header_offset)
        signature, name, extra = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
    except (zipfile.BadZipFile, struct.error, OSError, ValueError, UnicodeDecodeError):
        return None
    if signature != b"PK\x03\x04" or record.file_size <= 0:
        return None
    return record.header_offset + _LOCAL_HEADER.size + name + extra, record.file_size


def _read_tensor(path: Path, size: int, expected: str) -> TensorFile | bytearray:
    """A tensor file read once, its digest checked: its storage's bytes straight into a tensor's
    memory (`TensorFile`); a file of another layout, or without torch, as its bytes."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            torch = importlib.import_module("torch")
        except ImportError:  # `build` says so, as it unpickles
            return digests.read(path, size, expected)
    with open(path, "rb") as file:  # the layout, checked with the rest below
        span = _storage_span(file)
    if span is None or span[0] + span[1] > size:
        return digests.read(path, size, expected)
    offset, length = span
    storage = torch.empty(length, dtype=torch.uint8)
    memory = (ctypes.c_char * length).from_address(storage.data_ptr())
    parts = TensorFile(bytearray(offset), storage, memory, bytearray(size - offset - length))
    digests.read_into(path, [parts.head, memory, parts.tail], size, expected)
    if _storage_span(parts.image()) != span:  # the layout used is the layout checked
        raise digests.Mismatch(f"its file {path.name} changed while it was read")
    return parts


def _load_tensor(
    file: TensorFile | bytearray, device: str, parameter: bool, requires_grad: bool
) -> Any:
    torch = importlib.import_module("torch")
    target = device if device == "cpu" or _device_available(torch, device) else "cpu"
    if isinstance(file, TensorFile):
        data = _on_storage(torch, file)
        if target != "cpu":
            data = data.to(target)
    else:
        data = torch.load(io.BytesIO(file), map_location=target, weights_only=True)
    if parameter:
        return torch.nn.Parameter(data, requires_grad=requires_grad)
    return data.requires_grad_(requires_grad) if requires_grad else data


def _on_storage(torch: Any, file: TensorFile) -> Any:
    """The CPU tensor of `file`, on the memory its bytes were read into: `torch.load` reads only
    its metadata (the storage's place on the "meta" device), then the tensor takes the storage."""
    shape = torch.load(file.image(), map_location="meta", weights_only=True)
    if type(shape) is not torch.Tensor or shape.untyped_storage().nbytes() != len(file.memory):
        return torch.load(file.image(), map_location="cpu", weights_only=True)  # never written
    data = torch.empty(0, dtype=shape.dtype)
    return data.set_(
        file.storage.untyped_storage(), shape.storage_offset(), shape.size(), shape.stride()
    )


def _device_available(torch: Any, device: str) -> bool:
    kind, _, index = device.partition(":")
    backend = getattr(torch, kind, None)
    try:
        count = int(backend.device_count()) if backend and backend.is_available() else 0
    except Exception:
        return False
    return count > int(index or 0)
