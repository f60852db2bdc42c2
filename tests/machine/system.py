"""The machine's system service as real processes: the service run from a config file on a
socket in a temp directory (`Machine`), and client processes connected as a given uid
(`Actor`), which becomes that uid after importing everything and before it connects; what a
client process prints and is told (`ClientProcess`), for the per-user queue's clients too."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernel_queue.machine import client
from tests.polling import until

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
JUPYTER = str(Path(sys.executable).parent / "jupyter")
WITHIN = 20.0

# A client process: imports, becomes `uid`, connects to `path` with a quota of its own (which a
# system service does not hold against it), prints the welcome and then each message about the
# groups it submits or follows, as JSON lines. Commands on stdin: "submit GROUP CLASS GPUS",
# "follow GROUP", "release GROUP", "requeue GROUP", "list".
ACTOR = r"""
import asyncio, concurrent.futures.thread, json, os, sys
from pathlib import Path
from kernel_queue.machine import client, protocol

uid, path = int(sys.argv[1]), Path(sys.argv[2])
if uid != os.getuid():
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
QUOTA = protocol.Quota(("7",), 1000, 2**20, ("default",), {"mine": 5})

async def main():
    machine = await client.MachineClient.connect(QUOTA, path=path)
    welcome = json.loads(protocol.encode(machine.service))
    print(json.dumps({**welcome, "type": "connected"}), flush=True)
    tasks = []

    async def show(group):
        async for message in machine.messages(group):
            sys.stdout.write(protocol.encode(message).decode())
            sys.stdout.flush()

    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command, *args = line.split()
        if command == "submit":
            group, klass, gpus = args
            tasks.append(asyncio.create_task(show(group)))
            await machine.submit(protocol.Submit(
                group, group + "-kernel-id", "default", 99, {"gpu": int(gpus)}, 30.0,
                None if klass == "-" else klass, gpus + " GPU"))
        elif command == "follow":
            tasks.append(asyncio.create_task(show(args[0])))
        elif command == "release":
            await machine.release(args[0])
        elif command == "requeue":
            await machine.requeue(args[0])
        elif command == "list":
            sys.stdout.write(protocol.encode(await machine.listing()).decode())
            sys.stdout.flush()
    await machine.aclose()

asyncio.run(main())
"""

SETTINGS: dict[str, Any] = {
    "gpus": ["0"],
    "pretend": True,
    "cpu": "4",
    "memory": "1Gi",
    "queues": ["default"],
    "priority_classes": {"low": -100, "normal": 0, "high": 100},
    "privacy": "names",
}


class ClientProcess:
    """A client process that prints the messages it gets as JSON lines and takes commands on
    stdin, and what it printed so far (`seen`)."""

    def __init__(self, process: asyncio.subprocess.Process, within: float = WITHIN) -> None:
        self.process, self.within = process, within
        self.seen: list[dict[str, Any]] = []

    async def expect(self, *kinds: str) -> dict[str, Any]:
        """The next message of one of `kinds` it prints, within `within` s (else the test fails
        naming what it saw)."""
        kind = " or ".join(kinds)
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(self.within):
                while True:
                    line = await self.process.stdout.readline()
                    assert line, f"the client exited before a {kind!r}; saw {self.seen}"
                    message: dict[str, Any] = json.loads(line)
                    self.seen.append(message)
                    if message["type"] in kinds:
                        return message
        except TimeoutError:
            raise AssertionError(
                f"never saw {kind!r} within {self.within} s; saw {self.seen}"
            ) from None

    async def say(self, *words: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(" ".join(words).encode() + b"\n")
        await self.process.stdin.drain()

    async def listing(self) -> dict[str, Any]:
        """The service's listing, as this client is shown it."""
        await self.say("list")
        return await self.expect("listing")


class Actor(ClientProcess):
    """One client process of the system service, as uid `uid`."""

    def __init__(self, process: asyncio.subprocess.Process, uid: int) -> None:
        super().__init__(process)
        self.uid = uid


async def spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    """A client process running `script` with `args`, this checkout importable, its stdin and
    stdout piped to the test."""
    return await asyncio.create_subprocess_exec(
        *[sys.executable, "-c", script, *args],
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def kill_all(processes: Iterable[asyncio.subprocess.Process]) -> None:
    """Kill the processes still running and reap them all."""
    for process in processes:
        if process.returncode is None:
            process.kill()
        await process.wait()


class Machine:
    """A temp directory the system service and its clients share, reachable by nobody."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "run" / "queue.sock"
        self.service: asyncio.subprocess.Process | None = None
        self.actors: list[Actor] = []

    def config(self, **settings: Any) -> Path:
        path = self.root / "machine.json"
        path.write_text(json.dumps({**SETTINGS, **settings}))
        return path

    async def start(self, *extra: str, **settings: Any) -> asyncio.subprocess.Process:
        """Start the system service with SETTINGS updated by `settings`; return once it answers."""
        self.service = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "kernel_queue.machine", "--system"],
            *["--config", str(self.config(**settings)), "--socket", str(self.socket), *extra],
            stderr=asyncio.subprocess.PIPE,
        )
        service = self.service
        await until(
            lambda: client._answers(self.socket) or service.returncode is not None,
            "the system service answer",
            within=WITHIN,
        )
        assert service.returncode is None, "the system service exited at start"
        return service

    async def actor(self, uid: int) -> Actor:
        """A client process connected as `uid`, its welcome seen."""
        actor = Actor(await spawn(ACTOR, str(uid), str(self.socket)), uid)
        self.actors.append(actor)
        await actor.expect("connected")
        return actor

    async def root_holds_nobody_waits(self, **settings: Any) -> tuple[Actor, Actor, int]:
        """The service started with `settings`; root's kernel kq-root admitted on the one GPU,
        nobody's kq-nobody queued behind it: the two clients and kq-nobody's position."""
        await self.start(**settings)
        root, nobody = await self.actor(0), await self.actor(NOBODY)
        await root.say("submit", "kq-root", "-", "1")
        await root.expect("admit")
        await nobody.say("submit", "kq-nobody", "-", "1")
        return root, nobody, int((await nobody.expect("position"))["position"])

    async def __aenter__(self) -> Machine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await kill_all(actor.process for actor in self.actors)
        if self.service is not None and self.service.returncode is None:
            self.service.terminate()
            await self.service.wait()
