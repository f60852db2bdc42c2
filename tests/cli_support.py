"""Running `jupyter …` commands as a user would, for the CLI tests: a private set of Jupyter
user dirs, and the command in a subprocess (blocking, or awaited beside the test server)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

JUPYTER = str(Path(sys.executable).parent / "jupyter")


def private_env(tmp_path: Path) -> dict[str, str]:
    """This environment with Jupyter's user dirs (and HOME) private to the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(
        HOME=str(tmp_path / "home"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
    )
    return env


async def kernel_queue(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`jupyter kernel-queue ARGS` in a subprocess, without blocking the test server's loop."""
    process = await asyncio.create_subprocess_exec(
        JUPYTER,
        "kernel-queue",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
