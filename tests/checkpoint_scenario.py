"""The notebook state the preemption tests save and restore, on either backend: an int, a
dict, a 50 MB array, a lambda, an instance of a class defined in the notebook, and an open
socket (which cannot be saved and must be reported)."""

from __future__ import annotations

import stat
from pathlib import Path

BARE_SETUP = """
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x * self.x + self.y * self.y

count = 41
settings = {"lr": 0.1, "layers": [64, 32]}
square = lambda v: v * v
origin = Point(3, 4)
"""
"""The part that needs no numpy, for kernels on a bare image."""
BARE_CHECK = "(count, settings['layers'][1], square(7), origin.norm2())"

SETUP = f"""
import socket
import numpy as np
{BARE_SETUP}
weights = np.arange(50 * 2**20 // 8, dtype=np.float64)  # 50 MB
sock = socket.socket()
"""

CHECK = "(count, settings['layers'][1], float(weights.sum()), square(7), origin.norm2())"
EXPECTED = repr((41, 32, float(sum(range(50 * 2**20 // 8))), 49, 25))

NOTICE = "stopping to give back its GPUs (preempted, or parked while idle); saving state"
"""What a kernel that cannot tell why it stops says (a pod's SIGTERM)."""
PREEMPTED_NOTICE = "stopping to give back its GPUs (preempted by higher-priority kernel "
"""What a local kernel says: its backend tells it why."""
SAVED = "saved 6 variables"
NOT_SAVED = "not saved: sock (socket"
RESTORED = "restored 6 variables"
NOT_RESTORED = "not restored: sock (socket"

LOOP = "print('looping', flush=True)\ni = 0\nwhile True:\n    i += 1\n"
"""A cell that runs until it is stopped, counting in `i`."""


def private_modes(store: Path) -> tuple[set[int], set[int]]:
    """The permission bits of every directory and every file under `store`."""
    dirs = {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*") if p.is_dir()}
    files = {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*") if p.is_file()}
    return dirs, files
