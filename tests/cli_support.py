"""Running `jupyter …` commands as a user would, for the CLI tests: a private set of Jupyter
user dirs, the command in a subprocess (awaited beside the test server), and
`jupyter kernel-queue fake-cluster` serving while a test talks to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

JUPYTER = str(Path(sys.executable).parent / "jupyter")


def lab_command(port: int, token: str, *args: str) -> list[str]:
    """`jupyter kernel-queue lab` as the tests start it: one pretend GPU, no browser, on `port`
    with `token`, then `args`."""
    return [
        JUPYTER,
        "kernel-queue",
        "lab",
        "--pretend-gpus",
        "1",
        "--no-browser",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        *args,
    ]


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


@contextlib.contextmanager
def serving(*args: str) -> Iterator[list[str]]:
    """`jupyter kernel-queue fake-cluster ARGS` serving: its banner, up to its last line ("…
    Press Ctrl-C to stop."); stopped with Ctrl-C (SIGINT) at the end, a clean stop."""
    process = subprocess.Popen(
        [JUPYTER, "kernel-queue", "fake-cluster", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        for line in process.stdout:
            lines.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        yield lines
    finally:
        stop(process, signal.SIGINT, within=30)
    assert process.returncode == 0


def stop(process: subprocess.Popen[str], signum: int, *, within: float) -> None:
    """Send `signum` and wait `within` s for the process to end; else kill it and fail."""
    process.send_signal(signum)
    try:
        process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def kubeconfig_of(lines: list[str]) -> str:
    [line] = [line for line in lines if line.startswith("kubeconfig: ")]
    return line.split(": ", 1)[1].strip()
