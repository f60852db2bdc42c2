"""Which user variables a checkpoint saves: each is test-pickled before anything is written.

`select` goes through the user module's names and returns those that pickle, with their size,
and those that do not, with the reason (a refusal from `references`, or what the pickler
raised), so a save never fails on one bad variable and the user learns what was skipped. Values
made only of builtin scalars and containers are sized by the C pickler (`plain_size`); the rest by
a dill probe of the session pickle's own kind (`probe`) that counts big arrays and tensors without
copying them. Writes nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Collection
from types import ModuleType
from typing import Any

import dill  # type: ignore[import-untyped]

from kernel_queue.checkpoint import packs, payloads, references

PICKLE_PROTOCOL = 5
"""The protocol of every checkpoint's session pickle, and of the probes that size its variables:
not HIGHEST_PROTOCOL, so that a newer Python writes what 3.11 reads."""


def select(
    module: ModuleType,
    hidden: Collection[str],
    deadline: float | None,
    tensors: tuple[type, ...],
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, str]]]:
    """Test-pickle the user variables: (name, type, bytes) of those that pickle, and (name, type,
    reason) of those that don't. Hidden, `_`-prefixed and module names are no variables; big
    arrays and tensors are known to pickle and are not serialised twice."""
    saved, skipped = [], []
    for name, value in dict(module.__dict__).items():
        if name in hidden or name.startswith("_") or isinstance(value, ModuleType):
            continue
        payloads.check(deadline)
        refusal = references.refusal(value, tensors)
        if refusal:
            skipped.append((name, type(value).__name__, refusal))
            continue
        try:
            size = payloads.size_of(value, tensors) or plain_size(value)
            size = size or probe(value, module, tensors)
        except Exception as exc:
            skipped.append((name, type(value).__name__, reason(exc)))
        else:
            saved.append((name, type(value).__name__, size))
    return saved, skipped


_SCALARS = frozenset({str, int, float, bool, complex, bytes, type(None)})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_PLAIN_LIMIT = 1_000_000  # elements looked at before giving the value to dill's probe


def plain_size(value: Any) -> int:
    """`len(pickle.dumps(value))` by the C pickler if `value` holds only builtin scalars and
    containers (which dill pickles as pickle does), else 0; much faster than dill's probe."""
    stack, seen, visited = [value], 0, set()
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind not in _CONTAINERS:
            return 0
        if id(item) in visited:  # shared or a cycle: looked at once
            continue
        visited.add(id(item))
        seen += len(item)
        if seen > _PLAIN_LIMIT:
            return 0
        stack.extend(item.items() if kind is dict else item)
    return len(pickle.dumps(value, PICKLE_PROTOCOL))


def probe(value: Any, module: ModuleType, tensors: tuple[type, ...]) -> int:
    """`len(dill.dumps(value))`, as the session pickle would pickle it, big arrays not counted
    twice nor copied; raises what dill raises for an unpicklable value."""
    sink, big = _Counter(), {}
    names = references.Globals(module.__name__)

    def persistent_id(obj: Any) -> tuple[str, ...] | None:
        if obj is module or obj is module.__dict__:
            return ("main",)
        if type(obj) in payloads.PLAIN:
            return None
        refusal = references.refusal(obj, tensors)
        if refusal:
            raise TypeError(refusal)
        reference = names.reference(obj)
        if reference is not None:
            return reference
        size = payloads.size_of(obj, tensors)
        if size:
            big[id(obj)] = size
            return ("big",)
        if packs.packable(obj):  # written to small-arrays.bin, not into the pickle
            big[id(obj)] = int(obj.nbytes)
            return ("small",)
        return None

    pickler = dill.Pickler(sink, PICKLE_PROTOCOL)
    pickler.persistent_id = persistent_id
    pickler._main, pickler._byref, pickler._recurse = module, False, False
    pickler.dump(value)
    return sink.count + sum(big.values())


class _Counter:
    """A write-only file that only counts bytes."""

    count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)


def reason(exc: BaseException) -> str:
    """Why a value was not saved, from what pickling it raised, at most 200 characters."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"
