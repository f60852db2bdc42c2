"""One kernel preempted again and again, on either backend: between cycles its cells add,
change and delete variables (arrays, a dict, a class instance, closures, lambdas, aliases); after
each resume the namespace and the restore summary are compared with a model of what the user
should have. A socket is created in every cycle and must be named as not saved every time."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.conftest import Server

SETUP = """
import json, socket
import numpy as np

class Counter:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += 1

def make_adder(k):
    def add(v):
        return v + k
    return add

book = {}
counter = Counter()
"""

BIG = 200_000
"""Elements of the int64 arrays made every third cycle (1.6 MB: written out of band)."""

INSPECT = """print(json.dumps({
    "names": sorted(n for n, v in get_ipython().user_ns.items() if not n.startswith("_")
                    and n not in get_ipython().user_ns_hidden and type(v) is not type(json)),
    "book": get_ipython().user_ns["book"],
    "counter": get_ipython().user_ns["counter"].n,
    "adds": {n: v(100) for n, v in get_ipython().user_ns.items() if n.startswith("add")},
    "lambdas": {n: v(100) for n, v in get_ipython().user_ns.items() if n.startswith("f")
                and callable(v)},
    "arrays": {n: [int(v.size), int(v.sum())] for n, v in get_ipython().user_ns.items()
               if n.startswith("arr")},
    "aliased": {n: get_ipython().user_ns[n] is get_ipython().user_ns["arr" + n[5:]]
                for n in get_ipython().user_ns if n.startswith("alias")},
}, sort_keys=True))"""
"""One expression that prints what the user has, defining no name of its own."""


def cycle_cell(i: int) -> str:
    """What the user does in cycle `i` before the next preemption."""
    size = BIG if i % 3 == 0 else 100 + i
    lines = [
        f"arr{i} = np.full({size}, {i}, dtype=np.int64)",
        f"alias{i} = arr{i}",
        f"book['k{i}'] = {i}",
        "counter.bump()",
        f"add{i} = make_adder({i})",
        f"f{i} = lambda v: v - {i}",
        "sock = socket.socket()",
    ]
    if i >= 2:
        lines.append(f"del arr{i - 2}, alias{i - 2}")
    if i >= 1:
        lines.append(f"book.pop('k{i - 1}')")  # a changed value: k{i-1} leaves the dict
    return "\n".join(lines)


@dataclass
class Model:
    """What the namespace must hold after cycle `cycles - 1` was saved and restored."""

    cycles: int = 0
    book: dict[str, int] = field(default_factory=dict)

    def apply(self, i: int) -> None:
        self.cycles = i + 1
        self.book[f"k{i}"] = i
        self.book.pop(f"k{i - 1}", None)

    def live_arrays(self) -> list[int]:
        return [i for i in range(self.cycles) if i >= self.cycles - 2]

    def names(self) -> list[str]:
        names = {"Counter", "book", "counter", "make_adder"}
        for i in range(self.cycles):
            names |= {f"add{i}", f"f{i}"}
        for i in self.live_arrays():
            names |= {f"arr{i}", f"alias{i}"}
        return sorted(names)

    def expected(self) -> dict[str, object]:
        def size(i: int) -> int:
            return BIG if i % 3 == 0 else 100 + i

        return {
            "names": self.names(),
            "book": self.book,
            "counter": self.cycles,
            "adds": {f"add{i}": 100 + i for i in range(self.cycles)},
            "lambdas": {f"f{i}": 100 - i for i in range(self.cycles)},
            "arrays": {f"arr{i}": [size(i), size(i) * i] for i in self.live_arrays()},
            "aliased": {f"alias{i}": True for i in self.live_arrays()},
        }


Preempt = Callable[[str], Awaitable[str]]
"""Preempt the kernel and bring it back; return its `reason` while it was requeued."""


async def torture(server: Server, kernel_id: str, preempt: Preempt, cycles: int) -> None:
    """Run `cycles` preemption cycles; fail at the first lost, stale or unreported value."""
    assert (await server.execute(kernel_id, SETUP, within=120))["status"] == "ok"
    model = Model()
    for i in range(cycles):
        done = await server.execute(kernel_id, cycle_cell(i), within=120)
        assert done["status"] == "ok", (i, done)
        model.apply(i)
        names = model.names()
        reason = await preempt(kernel_id)
        assert f"saved {len(names)} variables" in reason, (i, reason)
        assert "not saved: sock (socket" in reason, (i, reason)

        first = await server.execute(kernel_id, INSPECT, within=120)
        assert first["status"] == "ok", (i, first)
        summary, _, printed = first["stream"].partition("\n{")
        assert json.loads("{" + printed) == model.expected(), f"cycle {i}: {summary}"
        header = re.search(r"restored (\d+) variables", summary)
        assert header is not None and int(header.group(1)) == len(names), (i, summary)
        assert f"Restored: {', '.join(names)}." in summary, (i, summary)
        assert "not restored: sock (socket)" in summary, (i, summary)
