"""Which pages of the kernel's memory were written since a snapshot: the continuous saves' diff.

`PageWrites.open` gives a userfaultfd in asynchronous write-protect mode (Linux 6.7+: the kernel
clears a page's protection itself at its first write, nothing ever waits), and `snapshot` asks
PAGEMAP_SCAN which protected pages were written since the last snapshot, protecting them again
in the same call; with `register` it first registers the process's private anonymous memory not
yet registered (where numpy arrays live). A save child's fork takes a snapshot just before it
(on the main thread, registering) and one just after it (whatever a thread of the user's wrote
around the fork: the child may hold it or not, so it reads as written to this save and the
next); the SIGTERM flush takes one. `Snapshot.history` then tells a save, per array, whether its
bytes are those a base checkpoint hashed (link its file, read nothing), were written since (write
it, hashed once) or are unknown (hash it to find out, as without tracking): memory registered
after the base's fork, a mapping that changed under a registered range (the scan refuses it:
the range is dropped) and file mappings (np.memmap) are unknown. Where userfaultfd or
PAGEMAP_SCAN is missing (kernels before 6.7, a seccomp profile that refuses userfaultfd, other
architectures) `open` says why and every save hashes. Not seen: pages emptied by
madvise(MADV_DONTNEED) while an array lives in them, and writes by a device into memory pinned
before the snapshot.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import platform
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from kernel_queue.checkpoint import payloads

if TYPE_CHECKING:
    import numpy as np

SYSCALLS = {"x86_64": 323, "aarch64": 282}
"""userfaultfd's system call number per machine (whose ioctl numbers use the generic layout)."""
UFFD_API = 0xAA
USER_MODE_ONLY = 1  # allowed without privilege where vm.unprivileged_userfaultfd is 0
FEATURE_WP_ASYNC = 1 << 15
MODE_WP = 1 << 1
SCAN_WP_MATCHING, SCAN_CHECK_WPASYNC = 1 << 0, 1 << 1
PAGE_IS_WRITTEN = 1 << 1
REGIONS = 1024
"""Written ranges one PAGEMAP_SCAN call returns at most (the scan goes on where it stopped)."""


def _ioc(direction: int, kind: int, number: int, size: int) -> int:
    return direction << 30 | size << 16 | kind << 8 | number


UFFDIO_API = _ioc(3, UFFD_API, 0x3F, 24)
UFFDIO_REGISTER = _ioc(3, UFFD_API, 0x00, 32)
UFFDIO_UNREGISTER = _ioc(2, UFFD_API, 0x01, 16)
PAGEMAP_SCAN = _ioc(3, ord("f"), 16, 96)
UNCHANGED, WRITTEN, UNKNOWN = "unchanged", "written", "unknown"
KEPT_SNAPSHOTS = 64
"""Snapshots whose writes are kept apart; older ones merge (only while no save commits)."""


class Base(NamedTuple):
    """A committed save whose arrays later saves may reuse: the checkpoint's id, the snapshots
    just before and just after the fork it saved (`snapshot`, `forked`: writes the second saw
    may postdate the save, so they count as later), and (bytes, digest) of each array file by
    its `payloads.place`."""

    id: str
    snapshot: int
    forked: int
    places: Mapping[payloads.Place, tuple[int, str]]


class PageWrites:
    """The kernel's write tracking: one userfaultfd and its own pagemap, used under a lock."""

    def __init__(self, libc: Any, uffd: int, pagemap: int) -> None:
        self._libc, self._uffd, self._pagemap = libc, uffd, pagemap
        self._lock = threading.Lock()
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._tracked: list[tuple[int, int, int]] = []  # (start, end, since), sorted, disjoint
        self._refused: set[tuple[int, int]] = set()  # mappings registration refused
        self._written: list[tuple[int, list[tuple[int, int]]]] = []  # (snapshot, ranges)
        self._number = 0
        self._regions = (ctypes.c_uint64 * (3 * REGIONS))()

    @classmethod
    def open(cls) -> tuple[PageWrites | None, str]:
        """The tracker, or None and why this kernel has none."""
        number = SYSCALLS.get(platform.machine())
        if number is None or not hasattr(os, "O_CLOEXEC"):
            return None, f"no userfaultfd numbers for {platform.machine()} here"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        except (OSError, AttributeError) as exc:
            return None, f"no libc: {exc}"
        uffd = int(libc.syscall(number, os.O_CLOEXEC | os.O_NONBLOCK | USER_MODE_ONLY))
        if uffd < 0:
            return None, f"userfaultfd refused: {os.strerror(ctypes.get_errno())}"
        api = (ctypes.c_uint64 * 3)(UFFD_API, FEATURE_WP_ASYNC, 0)
        if libc.ioctl(uffd, UFFDIO_API, ctypes.addressof(api)) != 0:
            os.close(uffd)
            return None, f"no asynchronous write-protect: {os.strerror(ctypes.get_errno())}"
        try:
            pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            os.close(uffd)
            return None, f"no /proc/self/pagemap: {exc.strerror}"
        tracker = cls(libc, uffd, pagemap)
        if tracker._scan(0, tracker._page) is None and ctypes.get_errno() == 25:  # ENOTTY
            tracker.close()
            return None, "no PAGEMAP_SCAN (Linux 6.7 or newer has it)"
        return tracker, ""

    def snapshot(self, *, register: bool = False) -> Snapshot:
        """The pages written since the last snapshot, protected again; with `register`, memory
        mapped since is tracked from now on. A save child's fork takes one just before (the main
        thread's writes, from the main thread: `register`) and one just after (whatever a thread
        wrote meanwhile, which the child may or may not hold); the flush takes one."""
        with self._lock:
            self._number += 1
            written: list[tuple[int, int]] = []
            kept = []
            for run in _runs(self._tracked):  # adjacent ranges in one call
                found = self._scan(run[0][0], run[-1][1])
                if found is not None:
                    written.extend(found)
                    kept.extend(run)
                    continue
                for start, end, since in run:  # which range is it
                    found = self._scan(start, end)
                    if found is None:  # a mapping there is not ours any more: forget the range
                        self._control(UFFDIO_UNREGISTER, start, end)
                        continue
                    written.extend(found)
                    kept.append((start, end, since))
            self._tracked = kept
            if register:
                self._register(self._number)
            self._written.append((self._number, written))
            if len(self._written) > KEPT_SNAPSHOTS:  # saves keep failing: merge the oldest
                (_, first), (number, second) = self._written[:2]
                self._written[:2] = [(number, first + second)]  # as if all came later: safe
            return Snapshot(self._number, tuple(self._tracked), tuple(self._written))

    def forget(self, before: int) -> None:
        """A save committed whose fork snapshot `before` followed: writes seen earlier are in
        it (`Base.forked`)."""
        with self._lock:
            self._written = [(n, ranges) for n, ranges in self._written if n >= before]

    def close(self) -> None:
        """Stop tracking (the kernel unregisters every range with the descriptor)."""
        with self._lock:
            for fd in (self._uffd, self._pagemap):
                if fd >= 0:
                    os.close(fd)
            self._uffd = self._pagemap = -1

    def _register(self, number: int) -> None:
        """Register the private anonymous mappings no range covers yet (since `number`)."""
        try:
            with open("/proc/self/maps", "rb") as file:
                lines = file.read().splitlines()
        except OSError:
            return
        starts = [start for start, _, _ in self._tracked]
        added = []
        for line in lines:
            fields = line.split(None, 5)
            if fields[1] != b"rw-p" or fields[4] != b"0" or fields[3] != b"00:00":
                continue  # file-backed, shared or not writable
            name = fields[5] if len(fields) > 5 else b""
            if name and not name.startswith((b"[heap]", b"[anon:")):
                continue  # [stack], [vvar] and the like
            low, _, high = fields[0].partition(b"-")
            start, end = int(low, 16), int(high, 16)
            for piece in _uncovered(start, end, self._tracked, starts):
                if piece in self._refused:
                    continue
                if not self._control(UFFDIO_REGISTER, *piece, MODE_WP):
                    self._refused.add(piece)
                    continue
                self._scan(*piece)  # protect its pages; what it says is unknown anyway
                added.append((*piece, number))
        if added:
            self._tracked = sorted(self._tracked + added)

    def _control(self, request: int, start: int, end: int, mode: int = 0) -> bool:
        if request == UFFDIO_UNREGISTER:
            argument: Any = (ctypes.c_uint64 * 2)(start, end - start)
        else:
            argument = (ctypes.c_uint64 * 4)(start, end - start, mode, 0)
        return int(self._libc.ioctl(self._uffd, request, ctypes.addressof(argument))) == 0

    def _scan(self, start: int, end: int) -> list[tuple[int, int]] | None:
        """The written ranges of [start, end), protected again; None when the scan is refused
        (part of it is mapped but not registered by us, or another error)."""
        found: list[tuple[int, int]] = []
        regions = self._regions
        while start < end:
            argument = (ctypes.c_uint64 * 12)(
                96,  # the argument's size
                SCAN_WP_MATCHING | SCAN_CHECK_WPASYNC,
                start,
                end,
                0,  # walk_end: where the scan stopped
                ctypes.addressof(regions),
                REGIONS,
                0,  # max_pages: all
                0,  # category_inverted
                PAGE_IS_WRITTEN,  # category_mask: written pages only
                0,  # category_anyof_mask
                PAGE_IS_WRITTEN,  # return_mask
            )
            count = int(self._libc.ioctl(self._pagemap, PAGEMAP_SCAN, ctypes.addressof(argument)))
            if count < 0:
                return None
            found.extend((regions[3 * i], regions[3 * i + 1]) for i in range(count))
            if count < REGIONS or argument[4] <= start:
                break
            start = int(argument[4])
        return found


class Snapshot(NamedTuple):
    """What a `PageWrites.snapshot` saw: its number, the tracked ranges (start, end, the
    snapshot that registered them) and the ranges written, by snapshot, since the last
    `forget`."""

    number: int
    tracked: tuple[tuple[int, int, int], ...]
    written: tuple[tuple[int, list[tuple[int, int]]], ...]

    def history(self, base: Base) -> ArrayHistory:
        """What a save of this snapshot, incremental on `base`, knows of each array: unchanged
        where the pages were tracked from before `base`'s fork and no snapshot from the one
        just after it on saw a write."""
        ranges = sorted(r for n, found in self.written if n >= base.forked for r in found)
        merged: list[tuple[int, int]] = []
        for start, end in ranges:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return ArrayHistory(base, _state_of(self.tracked, base.snapshot, merged))


class ArrayHistory:
    """`payloads.History` of one save: arrays of `base` whose pages nobody wrote since."""

    def __init__(self, base: Base, state: Callable[[int, int], str]) -> None:
        self.base, self._state = base, state
        self.counts = {UNCHANGED: 0, WRITTEN: 0, UNKNOWN: 0}
        """Arrays asked about, by verdict (the kernel's log shows them)."""

    def unchanged(self, array: np.ndarray[Any, Any]) -> tuple[int, str] | None:
        place = payloads.place(array)
        if place is None or self._state(place[0], place[1]) != UNCHANGED:
            return None
        found = self.base.places.get(place)
        self.counts[UNCHANGED if found else UNKNOWN] += 1
        return found

    def written(self, array: np.ndarray[Any, Any]) -> bool:
        place = payloads.place(array)
        verdict = UNKNOWN if place is None else self._state(place[0], place[1])
        if verdict != UNCHANGED:
            self.counts[verdict] += 1
        return verdict == WRITTEN


def _state_of(
    tracked: tuple[tuple[int, int, int], ...], base: int, written: list[tuple[int, int]]
) -> Callable[[int, int], str]:
    """The verdict on the bytes [address, address + size): UNCHANGED when every page of them
    is in ranges tracked since snapshot `base` and none is in `written` (sorted, disjoint)."""
    page = os.sysconf("SC_PAGE_SIZE")
    starts = [start for start, _, _ in tracked]
    ends = [end for _, end in written]

    def state(address: int, size: int) -> str:
        low = address - address % page
        high = -(-(address + max(size, 1)) // page) * page
        index = bisect.bisect_right(starts, low) - 1
        position = low
        while position < high:  # covered by ranges tracked since the base, with no gap
            if index < 0 or index >= len(tracked):
                return UNKNOWN
            start, end, since = tracked[index]
            if not start <= position < end or since > base:
                return UNKNOWN
            position, index = end, index + 1
        first = bisect.bisect_right(ends, low)
        if first < len(written) and written[first][0] < high:
            return WRITTEN
        return UNCHANGED

    return state


def _runs(tracked: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """`tracked` (sorted, disjoint) grouped into runs of ranges that touch."""
    runs: list[list[tuple[int, int, int]]] = []
    for entry in tracked:
        if runs and runs[-1][-1][1] == entry[0]:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _uncovered(
    start: int, end: int, tracked: list[tuple[int, int, int]], starts: list[int]
) -> list[tuple[int, int]]:
    """The parts of [start, end) no tracked range covers."""
    found = []
    index = max(0, bisect.bisect_right(starts, start) - 1)
    position = start
    while position < end:
        while index < len(tracked) and tracked[index][1] <= position:
            index += 1
        if index >= len(tracked) or tracked[index][0] >= end:
            found.append((position, end))
            break
        low, high, _ = tracked[index]
        if low > position:
            found.append((position, low))
        position = max(position, high)
    return found
