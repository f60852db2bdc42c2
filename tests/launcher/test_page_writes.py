"""The continuous saves' page tracking in this very process: which arrays a snapshot says were
written since a base, unchanged (so a save may link their old file) or unknown. Skipped where
Linux offers no asynchronous write-protect userfaultfd or no PAGEMAP_SCAN."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kernel_queue.checkpoint import payloads
from kernel_queue.launcher import page_writes

MIB = 2**20


@pytest.fixture
def tracker() -> Iterator[page_writes.PageWrites]:
    found, why = page_writes.PageWrites.open()
    if found is None:
        pytest.skip(f"no page tracking here: {why}")
    yield found
    found.close()


class Mappings:
    """Arrays on anonymous mappings of their own: numpy's may share a page with other heap
    data, whose writes would read as the array's (a save then writes it: safe, not exact)."""

    SIZE = 2 * MIB

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3]
        self.libc.mmap.argtypes.append(ctypes.c_long)
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.made: list[int] = []

    def array(self, address: int | None = None) -> np.ndarray[Any, Any]:
        """A float64 array on a new mapping (at `address`: MAP_FIXED), zeros, untouched."""
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANON | (0x10 if address else 0)
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        found = self.libc.mmap(address, self.SIZE, rw, flags, -1, 0)
        assert found not in (None, ctypes.c_void_p(-1).value)
        self.made.append(found)
        memory = (ctypes.c_char * self.SIZE).from_address(found)
        return np.frombuffer(memory, dtype=np.float64)

    def reserve(self, count: int) -> int:
        """An address with room for `count` arrays side by side (mapped, then given back)."""
        size, rw = count * self.SIZE, mmap.PROT_READ | mmap.PROT_WRITE
        found = self.libc.mmap(None, size, rw, mmap.MAP_PRIVATE | mmap.MAP_ANON, -1, 0)
        assert found not in (None, ctypes.c_void_p(-1).value)
        assert self.libc.munmap(found, size) == 0
        return int(found)

    def unmap(self, array: np.ndarray[Any, Any]) -> int:
        address = int(array.__array_interface__["data"][0])
        assert self.libc.munmap(address, self.SIZE) == 0
        self.made.remove(address)
        return address

    def close(self) -> None:
        for address in self.made:
            self.libc.munmap(address, self.SIZE)


@pytest.fixture
def mappings() -> Iterator[Mappings]:
    found = Mappings()
    yield found
    found.close()


def saved(tracker: page_writes.PageWrites, *arrays: Any, commit: bool = True) -> page_writes.Base:
    """A save's fork as the kernel makes it: the snapshot before (registering), the one after;
    the base it makes of `arrays` (made-up digests), forgotten up to it if it `commit`s."""
    before = tracker.snapshot(register=True)
    after = tracker.snapshot()
    if commit:
        tracker.forget(after.number)
    places = {payloads.place(a): (a.nbytes, f"digest-{i}") for i, a in enumerate(arrays)}
    return page_writes.Base("base", before.number, after.number, places)  # type: ignore[arg-type]


def verdicts(history: page_writes.ArrayHistory, *arrays: Any) -> list[str]:
    found = []
    for array in arrays:
        if history.unchanged(array) is not None:
            found.append("unchanged")
        else:
            found.append("written" if history.written(array) else "unknown")
    return found


def test_an_array_written_in_place_reads_as_written_and_the_others_as_unchanged(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    arrays = [mappings.array() for _ in range(4)]
    for array in arrays:
        array[:] = 1.0
    base = saved(tracker, *arrays)

    arrays[1][-1] = 5.0  # one element, on the array's last page
    arrays[3][:] = 1.0

    history = tracker.snapshot().history(base)
    assert verdicts(history, *arrays) == ["unchanged", "written", "unchanged", "written"]
    assert history.counts == {"unchanged": 2, "written": 2, "unknown": 0}
    assert history.unchanged(arrays[0]) == (arrays[0].nbytes, "digest-0")


def test_a_write_the_kernel_makes_for_the_process_reads_as_written(
    tracker: page_writes.PageWrites, mappings: Mappings, tmp_path: Any
) -> None:
    array = mappings.array()
    array[:] = 1.0
    base = saved(tracker, array)
    source = tmp_path / "bytes"
    source.write_bytes(b"\x07" * 4096)

    with open(source, "rb") as file:  # read(2) writes into the array: no user-space store
        file.readinto(memoryview(array).cast("B")[MIB : MIB + 4096])

    assert verdicts(tracker.snapshot().history(base), array) == ["written"]


def test_writes_while_a_forked_child_shares_the_pages_are_seen_and_the_childs_are_not(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    first, second = mappings.array(), mappings.array()
    first[:] = second[:] = 1.0
    base = saved(tracker, first, second)
    (to_parent, wrote), (to_child, go) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes its copy, then lives on until the parent has written
        second[0] = 3.0
        os.write(wrote, b"x")
        os.read(to_child, 1)
        os._exit(0)
    assert os.read(to_parent, 1) == b"x"
    first[0] = 2.0  # the page is the child's too: copied on this write
    os.write(go, b"x")
    os.waitpid(pid, 0)
    for fd in (to_parent, wrote, to_child, go):
        os.close(fd)

    assert verdicts(tracker.snapshot().history(base), first, second) == ["written", "unchanged"]


def test_a_write_racing_a_fork_reads_as_written_to_its_save_and_to_the_next(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    # A thread of the user's may write between the snapshot before the fork and the fork: the
    # save may hold that write or not, and the next save must not take it as saved.
    array, other = mappings.array(), mappings.array()
    base = saved(tracker, array, other)
    before = tracker.snapshot(register=True)
    array[0] = 2.0  # between the two snapshots of a fork
    after = tracker.snapshot()

    assert verdicts(after.history(base), array, other) == ["written", "unchanged"]
    tracker.forget(after.number)  # that save committed
    then = page_writes.Base("then", before.number, after.number, base.places)
    assert verdicts(tracker.snapshot().history(then), array, other) == ["written", "unchanged"]


def test_an_array_on_a_new_mapping_at_the_same_address_is_never_unchanged(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    old = mappings.array()
    old[:] = 1.0
    base = saved(tracker, old)
    address = mappings.unmap(old)
    new = mappings.array(address)  # zeros, untouched: not one page of it was written

    assert payloads.place(new) == payloads.place(old)
    assert verdicts(tracker.snapshot(register=True).history(base), new) == ["unknown"]


def test_a_mapping_replaced_beside_another_tracked_range_leaves_the_others_writes_seen(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    """Registered ranges that touch are scanned in one call; where the scan refuses such a run
    (one of its mappings changed), each range is scanned alone: the changed one is dropped
    (unknown) and its neighbour's writes are still seen."""
    address = mappings.reserve(2)  # room for two mappings side by side
    first = mappings.array(address)
    first[:] = 1.0
    saved(tracker, first)  # registers the first range
    second = mappings.array(address + Mappings.SIZE)
    second[:] = 1.0
    base = saved(tracker, first, second)  # registers the second, touching the first

    second[0] = 2.0
    new = mappings.array(mappings.unmap(first))  # a new mapping where the first was
    later = tracker.snapshot(register=True)

    assert verdicts(later.history(base), new, second) == ["unknown", "written"]


def test_memory_mapped_after_the_base_is_unknown_then_followed(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    base = saved(tracker)
    array = mappings.array()
    array[:] = 1.0
    later = tracker.snapshot(register=True)

    assert verdicts(later.history(base), array) == ["unknown"]
    newer = saved(tracker, array)
    assert verdicts(tracker.snapshot().history(newer), array) == ["unchanged"]


def test_writes_before_the_base_do_not_count_but_writes_since_any_later_snapshot_do(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    array = mappings.array()
    tracker.snapshot(register=True)
    array[0] = 2.0  # before the base: its file has this
    base = saved(tracker, array)

    assert verdicts(tracker.snapshot().history(base), array) == ["unchanged"]
    array[0] = 3.0
    saved(tracker, array, commit=False)  # a save that failed: nothing forgotten
    assert verdicts(tracker.snapshot().history(base), array) == ["written"]


def test_a_write_still_counts_after_many_snapshots_whose_saves_failed(
    tracker: page_writes.PageWrites, mappings: Mappings
) -> None:
    array, other = mappings.array(), mappings.array()
    base = saved(tracker, array, other)
    array[0] = 1.0
    for _ in range(page_writes.KEPT_SNAPSHOTS + 5):  # no save commits: nothing is forgotten
        tracker.snapshot()

    assert verdicts(tracker.snapshot().history(base), array, other) == ["written", "unchanged"]
