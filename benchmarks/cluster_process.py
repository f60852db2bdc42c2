"""The server's end of a fake cluster run in a child process by a benchmark.

The benchmark script runs itself with `--serve-cluster ROOT`: that child starts the cluster,
prints its kubeconfig path, then answers each line on its stdin with one line (JSON by each
script's convention) and stops at the end of its input. Here: start it, ask it, stop it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from pathlib import Path
from typing import Any

STOP_WITHIN = 30.0
"""Seconds the child has to stop after its input ends, before it is killed."""


class ClusterProcess:
    """The child process serving the fake cluster for `script`."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, root: Path) -> str:
        """Start the process; return its kubeconfig path once it serves."""
        pipe = asyncio.subprocess.PIPE
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, self.script, "--serve-cluster", str(root), stdin=pipe, stdout=pipe
        )
        try:
            line = await asyncio.wait_for(self._stdout().readline(), 60)
            if not line:
                raise RuntimeError("the fake cluster process ended before it served")
        except BaseException:
            await self.stop()
            raise
        return line.decode().strip()

    async def ask(self, line: str) -> str:
        """Send one line; its one-line answer."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        return (await self._stdout().readline()).decode()

    async def stats(self) -> dict[str, Any]:
        """The child's JSON answer to `stats`, its `requests` ([verb, resource, count] triples)
        as a Counter by (verb, resource)."""
        answer: dict[str, Any] = json.loads(await self.ask("stats"))
        answer["requests"] = collections.Counter({(v, r): n for v, r, n in answer["requests"]})
        return answer

    async def stop(self) -> None:
        """End of input stops the cluster; kill it if it has not ended within STOP_WITHIN."""
        if self.proc is None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_WITHIN)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def _stdout(self) -> asyncio.StreamReader:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout
