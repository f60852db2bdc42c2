"""The machine queue service under load: 200 groups from 4 clients on 4 pretend GPUs.

Four `MachineClient` connections (in this process) start one service (its own process, in a
fresh runtime directory) and submit groups round-robin, one at a time: a submit's latency is
from sending it to its first answer (`admit` or `position`). Then admitted groups are released
one by one: a position update's latency is from the release to the moment every waiting group
was told its new place (one `admission.schedule` pass and its messages to all clients). The
service's RSS is read from /proc at the end. It never fails; it prints beside the targets
(issue 17: each submit/position update <= 5 ms median, the service <= 30 MiB), and the time of
the `admission.schedule` pass alone over the same groups (timed in this process), the part of
an update that is the engine's; the rest is the service's messages and the clients reading them.
`--preemption Never` runs the same load without preemption planning.
Usage: python benchmarks/machine_queue.py [--groups 200] [--clients 4] [--releases 40]
[--preemption Never]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from kernel_queue import admission
from kernel_queue.machine import client, protocol

GPUS = ("0", "1", "2", "3")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pass_ms(groups: int, preemption: str) -> float:
    """The median time of one admission pass over `groups` groups, 4 of them admitted."""
    quota = protocol.Quota(GPUS, 64000, 2**40, ("default",), {}, preemption=preemption)
    requests = [
        admission.Request(f"kq-bench-{i:04d}", "default", {"gpu": 1}, 0, float(i))
        for i in range(groups)
    ]
    held = [admission.Admitted(r, {"gpu": protocol.FLAVOR}, r.created) for r in requests[:4]]
    cq = quota.cluster_queue()
    times = []
    for _ in range(50):
        start = time.perf_counter()
        admission.schedule(cq, requests[4:], held)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _told(message: protocol.Message | None, place: int) -> bool:
    if place == 0:
        return isinstance(message, protocol.Admit)
    return isinstance(message, protocol.Position) and message.position == place


async def run(groups: int, clients: int, releases: int, preemption: str) -> dict[str, float]:
    runtime = Path(tempfile.mkdtemp(prefix="kq-bench-", dir="/tmp"))
    path = runtime / "kernel-queue" / "queue.sock"
    quota = protocol.Quota(GPUS, 64000, 2**40, ("default",), {}, preemption=preemption)
    machines = [await client.MachineClient.connect(quota, path=path) for _ in range(clients)]
    latest: dict[str, protocol.Message] = {}
    changed = asyncio.Event()

    async def follow(machine: client.MachineClient, name: str) -> None:
        async for message in machine.messages(name):
            latest[name] = message
            changed.set()

    async def until(done: object) -> None:
        while not done():  # type: ignore[operator]
            changed.clear()
            await changed.wait()

    owner: dict[str, client.MachineClient] = {}
    followers = []
    submits = []
    for i in range(groups):
        name = f"kq-bench-{i:04d}"
        machine = machines[i % clients]
        owner[name] = machine
        followers.append(asyncio.create_task(follow(machine, name)))
        start = time.perf_counter()
        await machine.submit(protocol.Submit(name, name, "default", 0, {"gpu": 1}, 30.0))
        await until(lambda name=name: name in latest)
        submits.append(time.perf_counter() - start)

    updates = []
    for _ in range(releases):
        holder = next(n for n, m in latest.items() if isinstance(m, protocol.Admit))
        waiting = sorted(n for n, m in latest.items() if isinstance(m, protocol.Position))
        del latest[holder]
        start = time.perf_counter()
        await owner[holder].release(holder)
        # The first in line is admitted, every other one is told a place one nearer.
        await until(
            lambda waiting=waiting: all(_told(latest.get(n), i) for i, n in enumerate(waiting))
        )
        updates.append(time.perf_counter() - start)
    pid = machines[0].service.pid
    rss = rss_mib(pid)
    for machine in machines:
        await machine.aclose()
    for task in followers:
        task.cancel()
    return {
        "submit_ms": statistics.median(submits) * 1000,
        "update_ms": statistics.median(updates) * 1000,
        "rss_mib": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--releases", type=int, default=40)
    parser.add_argument(
        "--preemption",
        default="LowerPriority",
        help="the policy (LocalBackend's default; 'Never' shows the cost without its planning)",
    )
    args = parser.parse_args()
    result = asyncio.run(run(args.groups, args.clients, args.releases, args.preemption))
    print(
        f"{args.groups} groups from {args.clients} clients on {len(GPUS)} pretend GPUs, "
        f"preemption {args.preemption}"
    )
    print(f"{'measure':<42}{'value':>10}{'target':>10}")
    print(f"{'submit -> first answer, median (ms)':<42}{result['submit_ms']:>10.2f}{'<= 5':>10}")
    print(
        f"{'release -> all places told, median (ms)':<42}{result['update_ms']:>10.2f}{'<= 5':>10}"
    )
    print(f"{'service RSS (MiB)':<42}{result['rss_mib']:>10.1f}{'<= 30':>10}")
    engine = pass_ms(args.groups, args.preemption)
    print(f"{'of an update: admission pass alone (ms)':<42}{engine:>10.2f}{'':>10}")


if __name__ == "__main__":
    main()
