"""The machine queue with real processes: plain Python clients (each its own process, using
`kernel_queue.machine.client`) sharing one pretend GPU through the service they start.

Each test has its own runtime directory, so its own service; the service's pid comes from the
clients' welcome, and one still alive at the end is stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue.machine import client, protocol
from tests.machine.system import ClientProcess, kill_all, spawn
from tests.polling import until

# A client process: connect (starting the service if need be), submit one group, print each
# message about it as a JSON line; stdin says "release", "requeue" or "list". It never stops on
# a preempt unless told: a holder that does not answer.
ACTOR = r"""
import asyncio, json, sys
from kernel_queue.machine import client, protocol

QUOTA = protocol.Quota(("0",), 4000, 2**30, ("default",), {"low": -100, "high": 100})

async def main(group, priority, klass, grace):
    machine = await client.MachineClient.connect(QUOTA)
    print(json.dumps({"type": "connected", "pid": machine.service.pid}), flush=True)
    await machine.submit(protocol.Submit(
        group, group + "-kernel-id", "default", int(priority), {"gpu": 1}, float(grace),
        klass or None, "1 GPU"))

    async def show():
        async for message in machine.messages(group):
            sys.stdout.write(protocol.encode(message).decode())
            sys.stdout.flush()

    shown = asyncio.create_task(show())
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = line.strip()
        if command == "release":
            await machine.release(group)
        elif command == "requeue":
            await machine.requeue(group)
        elif command == "list":
            sys.stdout.write(protocol.encode(await machine.listing()).decode())
            sys.stdout.flush()
    await machine.aclose()
    shown.cancel()

asyncio.run(main(*sys.argv[1:]))
"""

QUOTA = protocol.Quota(("0",), 4000, 2**30, ("default",), {"low": -100, "high": 100})
WITHIN = 30.0


class Actor(ClientProcess):
    """One client process of a user's own queue service."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        super().__init__(process, within=WITHIN)
        self.service = 0
        """The pid of the service it connected to (0: not yet seen)."""


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Path:
    # Short: a Unix socket path must fit in 108 bytes.
    directory = Path(tempfile.mkdtemp(prefix="kq-", dir="/tmp"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(directory))
    # Never the machine's real system service (/run/kernel-queue): none answers here.
    monkeypatch.setenv(client.SYSTEM_SOCKET_ENV, str(directory / "no-system.sock"))
    return directory


class Machine:
    """The test's client processes and the services they named; `async with` ends them all."""

    def __init__(self) -> None:
        self.started: list[Actor] = []
        self.services: set[int] = set()

    async def __call__(
        self,
        group: str,
        priority: int = 0,
        klass: str = "",
        grace: float = 30.0,
        *,
        connect: bool = True,
    ) -> Actor:
        """A client of `group`, connected to a service (its pid in `service`) unless not
        `connect`."""
        actor = Actor(await spawn(ACTOR, group, str(priority), klass, str(grace)))
        self.started.append(actor)
        if connect:
            await self.connected(actor)
        return actor

    async def admitted(self, group: str, **options: Any) -> Actor:
        """A client of `group`, connected and its group admitted."""
        actor = await self(group, **options)
        await actor.expect("admit")
        return actor

    async def preempted(self, grace: float) -> tuple[Actor, Actor, dict[str, Any]]:
        """`kq-low` holding the GPU with `grace` s to give it back, preempted by `kq-high`:
        both, and the preempt message `kq-low` got."""
        low = await self.admitted("kq-low", priority=-100, klass="low", grace=grace)
        high = await self("kq-high", priority=100, klass="high")
        return low, high, await low.expect("preempt")

    async def connected(self, actor: Actor) -> int:
        """The pid of the service `actor` connected to."""
        actor.service = int((await actor.expect("connected"))["pid"])
        self.services.add(actor.service)
        return actor.service

    async def __aenter__(self) -> Machine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await kill_all(actor.process for actor in self.started)
        for pid in self.services:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of this test process is gone too
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)
    return done == 0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


async def handed_over(to: Actor, by: Actor) -> None:
    """The GPU went to `to`, and `by` waits first in line."""
    assert (await to.expect("admit"))["devices"] == ["0"]
    place = await by.expect("position")
    assert (place["position"], place["length"]) == (1, 1)


async def test_the_second_client_waits_behind_the_first_and_gets_the_gpu_at_release(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        first = await actors("kq-first")
        assert (await first.expect("admit"))["devices"] == ["0"]
        second = await actors("kq-second")
        place = await second.expect("position")
        assert (place["queue"], place["position"], place["length"]) == ("default", 1, 1)
        await first.say("release")
        assert (await second.expect("admit"))["devices"] == ["0"]


async def test_a_higher_priority_client_preempts_and_the_gpu_is_reclaimed_after_the_grace(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        low, high, preempt = await actors.preempted(grace=1.0)
        assert preempt["by"] == "kq-high"
        assert preempt["message"] == (
            "preempted by higher-priority kernel kqhighke (priority 'high'), which needs 1 GPU"
        )
        # The low client never answers: after its grace the GPU goes to the high one anyway, and
        # the low group is back in the queue.
        await handed_over(high, low)


async def test_a_sigkilled_client_frees_its_gpu_at_once_and_the_service_exits_after_the_last(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        holder = await actors.admitted("kq-holder")
        service = holder.service
        waiter = await actors("kq-waiter")
        await waiter.expect("position")
        holder.process.kill()
        assert (await waiter.expect("admit"))["devices"] == ["0"]
        assert _alive(service)
        listing = await waiter.listing()
        assert [(g["group"], g["state"]) for g in listing["groups"]] == [("kq-waiter", "admitted")]
        waiter.process.kill()
        await until(lambda: not _alive(service), "the service exit after its last client left")


async def test_clients_starting_together_make_one_service(runtime: Path) -> None:
    async with Machine() as actors:
        racers = [await actors(f"kq-racer{i}", connect=False) for i in range(4)]
        pids = {await actors.connected(racer) for racer in racers}
        assert len(pids) == 1
        assert sorted(p.name for p in (runtime / "kernel-queue").iterdir() if p.is_socket()) == [
            "queue.sock"
        ]
        for racer in racers:  # each one's group is in the queue
            await racer.expect("admit", "position")
        listing = await racers[0].listing()
        assert sorted(g["group"] for g in listing["groups"]) == [f"kq-racer{i}" for i in range(4)]
        assert [g["state"] for g in listing["groups"]].count("admitted") == 1


async def test_a_client_of_another_protocol_gets_the_sentence_and_queues_nothing(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        first = await actors("kq-first")
        service = first.service
        reader, writer = await asyncio.open_unix_connection(str(client.socket_path()))
        hello = {"type": "hello", "protocol": 99, "version": "9.9", "pid": 1, "quota": {}}
        writer.write(json.dumps(hello).encode() + b"\n")
        welcome = protocol.decode(await reader.readline())
        refused = protocol.decode(await reader.readline())
        assert await reader.read() == b""  # the service hung up
        writer.close()
        assert isinstance(welcome, protocol.Welcome)
        assert refused == protocol.Refused(
            f"the machine's kernel-queue service (pid {service}, version {welcome.version}, "
            "protocol 2) speaks another protocol than this server (version 9.9, protocol 99); stop "
            f"it with `kill {service}` (its kernels keep running until their servers stop them) or "
            f"restart this server with version {welcome.version}"
        )
        listing = await first.listing()
        assert [g["group"] for g in listing["groups"]] == ["kq-first"]


async def test_a_service_of_another_protocol_tells_this_client_how_to_fix_it(
    runtime: Path,
) -> None:
    path = runtime / "other.sock"
    hung_up = asyncio.Event()

    async def other_service(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b'{"type": "welcome", "version": "2.0", "pid": 321, "protocol": 3}\n')
        await writer.drain()
        await reader.read()  # the client hangs up
        writer.close()
        await writer.wait_closed()
        hung_up.set()

    server = await asyncio.start_unix_server(other_service, path=str(path))
    async with server:
        with pytest.raises(errors.LaunchFailed) as failed:
            await client.MachineClient.connect(QUOTA, path=path, version="0.1.0")
        await hung_up.wait()
    assert str(failed.value) == (
        "the machine's kernel-queue service (pid 321, version 2.0, protocol 3) speaks another "
        "protocol than this server (version 0.1.0, protocol 2); stop it with `kill 321` (its "
        "kernels keep running until their servers stop them) or restart this server with "
        "version 2.0"
    )


async def test_a_client_with_another_quota_is_told_the_difference(runtime: Path) -> None:
    async with Machine() as actors:
        first = await actors("kq-first")
        other = protocol.Quota(("0", "1"), 4000, 2**30, ("default",), {"low": -100, "high": 100})
        with pytest.raises(errors.ConfigError) as refused:
            await client.MachineClient.connect(other)
        assert str(refused.value) == (
            "this server's local-backend quota differs from the one the machine's kernel-queue "
            f"service (pid {first.service}) enforces for every server of this user: gpus "
            "['0', '1'] here, ['0'] in force. Give every server the same c.LocalBackend settings, "
            "or stop the other servers first."
        )


async def test_the_socket_is_private_and_a_stale_one_is_replaced(runtime: Path) -> None:
    async with Machine() as actors:
        first = await actors("kq-first")
        service = first.service
        sock = client.socket_path()
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        first.process.kill()
        os.kill(service, signal.SIGKILL)  # leaves its socket file behind
        await until(lambda: not _alive(service), "the killed service gone")
        assert sock.is_socket()

        def refuses() -> bool:
            # Its listener is released a few ms after the process is gone (seen here: 1 to 3
            # connects still accepted), so the file is stale once a connect is refused.
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(sock))
                except ConnectionRefusedError:
                    return True
            return False

        await until(refuses, "the killed service's socket refusing connections")
        second = await actors("kq-second")
        replacement = second.service
        assert replacement != service
        assert (await second.expect("admit"))["devices"] == ["0"]
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600


async def test_a_preempted_holder_that_stops_and_requeues_hands_the_gpu_over_at_once(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        low, high, _ = await actors.preempted(grace=600.0)
        listing = await high.listing()
        states = {g["group"]: g["state"] for g in listing["groups"]}
        assert states == {"kq-low": "evicting", "kq-high": "queued"}
        await low.say("requeue")  # its kernel stopped: long before the 600 s grace
        await handed_over(high, low)


async def test_a_submit_the_machine_can_never_hold_is_refused_in_a_sentence(
    runtime: Path,
) -> None:
    async with Machine() as actors:
        await actors("kq-first")
        machine = await client.MachineClient.connect(QUOTA)
        try:
            await machine.submit(protocol.Submit("kq-big", "big", "default", 0, {"gpu": 2}, 1))
            await machine.submit(protocol.Submit("kq-nowhere", "n", "batch", 0, {"gpu": 1}, 1))
            big = await anext(aiter(machine.messages("kq-big")))
            nowhere = await anext(aiter(machine.messages("kq-nowhere")))
        finally:
            await machine.aclose()
        assert big == protocol.Refused("requests 2 gpu but the largest flavor offers 1", "kq-big")
        assert nowhere == protocol.Refused(
            "queue 'batch' does not exist on this machine; known queues: default", "kq-nowhere"
        )


async def test_a_client_whose_service_dies_is_told_the_connection_ended(runtime: Path) -> None:
    async with Machine() as actors:
        holder = await actors.admitted("kq-holder")
        service = holder.service
        os.kill(service, signal.SIGKILL)
        gone = await holder.expect("gone")
        assert gone["message"] == (
            f"the machine's kernel-queue service (pid {service}) closed the connection"
        )


async def test_a_listing_shows_what_the_messages_before_it_decided(runtime: Path) -> None:
    async with Machine() as actors:
        first = await actors("kq-first")
        service = first.service
        await first.say("release")
        await first.say("list")
        assert (await first.expect("listing"))["groups"] == []
        reader, writer = await asyncio.open_unix_connection(str(client.socket_path()))
        lines = [
            protocol.Hello(protocol.PROTOCOL, "0.1.0", os.getpid(), QUOTA),
            protocol.Submit("kq-raw", "raw", "default", 0, {"gpu": 1}, 1),
            protocol.List(),
        ]
        writer.write(b"".join(protocol.encode(m) for m in lines))  # read in one turn
        answers = [protocol.decode(await reader.readline()) for _ in range(3)]
        writer.close()
        await writer.wait_closed()
        assert answers[0] == protocol.Welcome(answers[0].version, service, protocol.PROTOCOL, QUOTA)  # type: ignore[attr-defined]
        assert answers[1] == protocol.Admit("kq-raw", ("0",))
        assert isinstance(answers[2], protocol.Listing)
        assert [(g.group, g.state, g.devices) for g in answers[2].groups] == [
            ("kq-raw", "admitted", ("0",))
        ]


async def test_a_restarted_service_holds_a_running_lease_for_its_client_to_take_back(
    runtime: Path,
) -> None:
    """A restart is no outage: the new service keeps the GPU of a lease on record for its
    client (still alive), so a newcomer waits; the client's `submit` with `holds` takes it
    back, and its release hands it on as ever."""
    async with Machine() as actors:
        holder = await actors.admitted("kq-holder")
        first = holder.service
        record = Path(str(client.socket_path()) + ".leases.json")
        assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
        os.kill(first, signal.SIGKILL)
        await holder.expect("gone")
        newcomer = await actors("kq-newcomer")
        second = newcomer.service
        assert second != first
        assert (await newcomer.expect("position", "admit"))["type"] == "position"
        reader, writer = await asyncio.open_unix_connection(str(client.socket_path()))
        lines = [
            protocol.Hello(protocol.PROTOCOL, "0.1.0", os.getpid(), QUOTA),
            protocol.Submit(
                "kq-holder", "kq-holder-kernel-id", "default", 0, {"gpu": 1}, 30.0, holds=("0",)
            ),
        ]
        writer.write(b"".join(protocol.encode(m) for m in lines))
        answers = [protocol.decode(await reader.readline()) for _ in range(2)]
        assert answers[1] == protocol.Admit("kq-holder", ("0",))
        writer.write(protocol.encode(protocol.Release("kq-holder")))
        assert (await newcomer.expect("admit"))["devices"] == ["0"]
        writer.close()
        await writer.wait_closed()


async def test_a_holds_without_a_lease_on_record_jumps_no_queue(runtime: Path) -> None:
    """A client may say it holds GPUs the service never leased (the record lost): it gets them
    only where they are free and nobody waits; here another holds them: it is preempted and
    saves."""
    async with Machine() as actors:
        holder = await actors.admitted("kq-holder")
        service = holder.service
        waiter = await actors("kq-waiter")
        await waiter.expect("position")
        reader, writer = await asyncio.open_unix_connection(str(client.socket_path()))
        lines = [
            protocol.Hello(protocol.PROTOCOL, "0.1.0", os.getpid(), QUOTA),
            protocol.Submit("kq-claims", "claims-id", "default", 0, {"gpu": 1}, 1.0, holds=("0",)),
        ]
        writer.write(b"".join(protocol.encode(m) for m in lines))
        answers = [protocol.decode(await reader.readline()) for _ in range(2)]
        assert isinstance(answers[1], protocol.Preempt), answers
        assert "gave its GPUs to another kernel" in answers[1].message
        writer.close()
        await writer.wait_closed()
        assert _alive(service)


async def test_a_system_socket_nobody_serves_says_how_to_start_the_service(
    runtime: Path,
) -> None:
    """A server pinned to the machine's system queue while the service is down: a sentence
    naming the socket and systemd's commands (it said the service "hung up at hello" and
    pointed at a per-user log the system service never writes)."""
    system = client.system_socket()
    with pytest.raises(errors.LaunchFailed) as failed:
        await client.MachineClient.connect(QUOTA, path=system)
    assert str(failed.value) == (
        f"no kernel-queue service answers on {system}, the machine's system queue: start it "
        "(`sudo systemctl start kernel-queue`; `journalctl -u kernel-queue` says why it stopped)"
    )
