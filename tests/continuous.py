"""Continuous checkpoints as a notebook sees them, on either backend: the cells the kill tests
run before the kernel dies, and a cell run as a notebook runs it (numbered)."""

from __future__ import annotations

from typing import Any

from tests.conftest import Server

CELLS = [
    "import numpy as np\nx = 1",
    "a = np.zeros(2**18)\nb = np.ones(2**18)",
    "x = 3",
    "a[0] = 7.0",
    "x = 5",
]


async def run(server: Server, kernel_id: str, code: str) -> dict[str, Any]:
    """Run ``code`` as a notebook does (``store_history``: the cell gets its number); the
    execute_result's text, the stream text and the reply's status and execution_count."""
    return await server.execute(kernel_id, code, history=True)
