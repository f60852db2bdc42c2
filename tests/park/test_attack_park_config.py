"""Hostile `park_after` values, in kernel.json and in the server's config: each fails the kernel
with a sentence naming the key and the fix (never a traceback, never a kernel that parks at once
or never), and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            float("nan"),
            "`park_after` is NaN; give the seconds a kernel may sit idle before it is parked",
            id="nan",
        ),
        pytest.param(
            float("inf"),
            "`park_after` is Infinity; give the seconds a kernel may sit idle before it is parked",
            id="infinity",
        ),
        pytest.param(
            "1800",
            "kernelspec config key 'park_after' must be a number of seconds such as 60, not "
            "'1800' (a string)",
            id="string",
        ),
        pytest.param(
            True,
            "kernelspec config key 'park_after' must be a number of seconds such as 60, not true",
            id="boolean",
        ),
        pytest.param(
            10**400,
            "kernelspec config key 'park_after' must be a number of seconds such as 60, not "
            "a number too large for seconds",
            id="integer-beyond-a-float",
        ),
    ],
)
async def test_a_hostile_park_after_in_kernel_json_fails_the_kernel_with_a_sentence(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, value: Any, expected: str
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 60}
    _, model = await server.failure(kernelspec(gpus=0, park_after=value, checkpoint=checkpoint))
    assert launcher_pids() == set()
    assert expected in model["reason"], model["reason"]
    assert "Traceback" not in model["reason"]
