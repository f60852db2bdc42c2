"""A multi-pod kernel as its notebook uses it, on both planes: the head knows its group (rank,
world size, every pod's stable name, torch.distributed's variables), reaches its worker by the
name the product gives, and after a preemption the group comes back with the same names,
resolving to the new pods; a shutdown leaves nothing, its headless Service included. A cell
drives the worker pods through Dask (the README's recipe: each worker pod's `worker_command` is
a Dask worker, the head's cell starts the scheduler), before and after a preemption, and no
worker process outlives the kernel; a worker command that ends leaves its pod, and the group,
running.

Without a `worker_command` the worker pods listen on nothing; the first test stands in for
a program of the worker with a listener bound to the worker pod's own address (on both planes a
pod's address is a loopback address of this machine, which the test process can bind), so what
the cell reaches at the worker's name is the worker pod's address and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kernel_queue_fake_cluster.node import dns

from kernel_queue.server import kernels
from tests.conftest import KernelspecFactory, Server, skip_unless_ci
from tests.kube.planes import Plane
from tests.kube.support import CHECKPOINT, GPU_QUOTA, PVC, kube_spec, wait_clean

PORT = 29500
"""The port the worker's stand-in listens on: torch.distributed's default, which the kernels'
NetworkPolicy opens between the pods of a namespace's kernels."""

GROUP_CELL = """
import json, os, socket
names = ("KERNEL_QUEUE_RANK", "KERNEL_QUEUE_WORLD_SIZE", "KERNEL_QUEUE_HEAD_ADDRESS",
         "KERNEL_QUEUE_ADDRESSES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
         "LOCAL_RANK")
addresses = os.environ["KERNEL_QUEUE_ADDRESSES"].split(",")
print(json.dumps({
    "env": {name: os.environ.get(name) for name in names},
    "pod_ip": os.environ["POD_IP"],
    "resolved": [socket.gethostbyname(name) for name in addresses],
}))
"""
"""What the head's cell sees of its group: the variables, its own address, and where each
pod's name resolves."""

REACH_CELL = """
import os, socket, time
worker = os.environ["KERNEL_QUEUE_ADDRESSES"].split(",")[1]
deadline = time.monotonic() + 30
while True:
    try:
        with socket.create_connection((worker, {port}), timeout=5) as connection:
            print(connection.recv(200).decode())
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
"""
"""The head's cell opening a connection to its worker by the worker's name, printing what the
worker says."""


def pods_of(plane: Plane, kernel: str) -> dict[str, Any]:
    """The kernel's running pods by role (the newest of each)."""
    found: dict[str, Any] = {}
    for pod in plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={kernel}"):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        found[meta["labels"]["kernel-queue.dev/role"]] = pod
    return found


@contextlib.asynccontextmanager
async def listening(pod: Any) -> AsyncIterator[None]:
    """A stand-in for a program of the worker pod: it answers each connection to the pod's own
    address and `PORT` with the pod's name."""
    name = pod["metadata"]["name"].encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(name)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, pod["status"]["podIP"], PORT)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def group_seen(server: Server, kernel: str) -> dict[str, Any]:
    result = await server.execute(kernel, GROUP_CELL)
    assert result.get("error") is None, result
    return dict(json.loads(result["stream"]))


async def reached(server: Server, kernel: str, worker: Any) -> str:
    """What the head's cell reads at its worker's name while the worker pod listens."""
    async with listening(worker):
        result = await server.execute(kernel, REACH_CELL.format(port=PORT))
    assert result.get("error") is None, result
    return str(result["stream"]).strip()


async def test_a_two_pod_kernel_knows_its_group_reaches_its_worker_by_name_and_keeps_the_names(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    if dns.find_library() is None:
        skip_unless_ci(f"{dns.LIBRARY} is missing: pods cannot resolve names ({dns.INSTALL})")
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    spec = kube_spec(kernelspec, "gang", pod_group_size=2, gpus=1, priority_class="low")
    kernel = await server.start(spec)
    service = f"kq-{kernel.replace('-', '')}-group"
    head, worker = (f"{host}.{service}.default.svc" for host in ("head", "w1"))

    seen = await group_seen(server, kernel)
    assert seen["env"] == {
        "KERNEL_QUEUE_RANK": "0",
        "KERNEL_QUEUE_WORLD_SIZE": "2",
        "KERNEL_QUEUE_HEAD_ADDRESS": head,
        "KERNEL_QUEUE_ADDRESSES": f"{head},{worker}",
        "MASTER_ADDR": head,
        "MASTER_PORT": "29500",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
    }
    pods = pods_of(plane, kernel)
    first = [pods["head"]["status"]["podIP"], pods["worker"]["status"]["podIP"]]
    assert seen["resolved"] == first
    assert seen["pod_ip"] == first[0]
    assert await reached(server, kernel, pods["worker"]) == pods["worker"]["metadata"]["name"]
    assert plane.get("", "services", "default", service) is not None

    # preempted by a kernel of higher priority, then back once it ends
    high = await server.start(kube_spec(kernelspec, "high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    await server.wait_reason(kernel, "preempted; requeued in 'user-queue'")
    await server.shutdown(high)
    again = await group_seen(server, kernel)
    assert again["env"] == seen["env"]  # the same names, current
    pods = pods_of(plane, kernel)
    now = [pods["head"]["status"]["podIP"], pods["worker"]["status"]["podIP"]]
    assert again["resolved"] == now == [again["pod_ip"], now[1]]
    assert now[1] != first[1]  # a new worker pod, at a new address, under the same name
    assert await reached(server, kernel, pods["worker"]) == pods["worker"]["metadata"]["name"]

    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel, high)
    assert plane.get("", "services", "default", service) is None


DASK_PORT = 8786
"""The Dask scheduler's port on the head (Dask's default), which the workers' command names."""

SCHEDULER_CELL = """
import os
from distributed import Client, LocalCluster
cluster = LocalCluster(n_workers=0, host=os.environ["POD_IP"], scheduler_port=8786,
                       dashboard_address=None)
client = Client(cluster)
client.wait_for_workers(int(os.environ["WORLD_SIZE"]) - 1, timeout=60)
"""
"""The README's cell: a Dask scheduler in the head kernel (no workers of its own), a client,
and a wait for every worker pod."""

RUN_CELL = """
import json, os
def where():
    return os.environ["RANK"], os.environ["HOSTNAME"]
print(json.dumps({"workers": sorted(client.run(where).values()), "head": where(),
                  "task": client.submit(where).result()}))
"""
"""The README's cell running a function on every worker pod and on the head, and a task, which
the scheduler gives to a worker pod."""


WORKER_COMMAND = [
    "dask",
    "worker",
    f"tcp://$(MASTER_ADDR):{DASK_PORT}",
    "--name",
    "w$(RANK)",
    "--host",
    "$(POD_IP)",
    "--no-nanny",
    "--no-dashboard",
    "--nthreads",
    "1",
]
"""The README's worker command: a Dask worker of the head's scheduler, named for its rank."""


def dask_kernelspec(
    kernelspec: KernelspecFactory, kernels: Path, scratch: Path, **config: Any
) -> str:
    """A two-pod kernelspec whose workers run `WORKER_COMMAND`; Dask's scratch files (the head's
    scheduler and each worker make some) go to `scratch` through the kernelspec's `env` (a pod
    here is a process of this machine, whose /tmp would keep them)."""
    name = kube_spec(kernelspec, "dask", pod_group_size=2, worker_command=WORKER_COMMAND, **config)
    path = kernels / name / "kernel.json"
    written = json.loads(path.read_text())
    written["env"] = {"DASK_TEMPORARY_DIRECTORY": str(scratch)}
    path.write_text(json.dumps(written))
    return name


def processes_naming(text: str) -> list[str]:
    """Command lines of this machine's live processes that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line:
            found.append(line)
    return found


async def test_a_cell_drives_the_worker_pods_through_dask_and_a_shutdown_leaves_nothing(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    tmp_path: Path,
    jp_kernel_dir: Path,
) -> None:
    if dns.find_library() is None:
        skip_unless_ci(f"{dns.LIBRARY} is missing: pods cannot resolve names ({dns.INSTALL})")
    plane.set_quota("cluster-queue", "default-flavor", {"cpu": 8, "memory": "32Gi"})
    scratch = tmp_path / "dask-scratch"
    kernel = await server.start(dask_kernelspec(kernelspec, jp_kernel_dir, scratch, gpus=0))
    head = f"tcp://head.kq-{kernel.replace('-', '')}-group.default.svc:{DASK_PORT}"
    started = await server.execute(kernel, SCHEDULER_CELL)
    assert started.get("error") is None, started

    result = await server.execute(kernel, RUN_CELL)
    assert result.get("error") is None, result
    assert json.loads(result["stream"]) == {
        "workers": [["1", "w1"]],
        "head": ["0", "head"],
        "task": ["1", "w1"],
    }
    assert len(processes_naming(head)) == 2  # the worker pod's launcher and its Dask worker
    assert (scratch / "dask-scratch-space").is_dir()

    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)
    assert processes_naming(head) == []


async def test_after_a_preemption_the_scheduler_cell_again_drives_the_new_worker_pods(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    tmp_path: Path,
    jp_kernel_dir: Path,
) -> None:
    if dns.find_library() is None:
        skip_unless_ci(f"{dns.LIBRARY} is missing: pods cannot resolve names ({dns.INSTALL})")
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    plane.apply(PVC)
    scratch = tmp_path / "dask-scratch"
    spec = dask_kernelspec(
        kernelspec, jp_kernel_dir, scratch, priority_class="low", checkpoint=CHECKPOINT
    )
    kernel = await server.start(spec)
    head = f"tcp://head.kq-{kernel.replace('-', '')}-group.default.svc:{DASK_PORT}"
    assert (await server.execute(kernel, SCHEDULER_CELL)).get("error") is None
    first = pods_of(plane, kernel)["worker"]["metadata"]["name"]

    high = await server.start(kube_spec(kernelspec, "high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    model = await server.wait_reason(kernel, "; requeued in 'user-queue'")
    assert "not saved: cluster (LocalCluster: " in model["reason"], model["reason"]
    assert "client (Client: " in model["reason"]  # skipped, said, and the save went on
    await server.shutdown(high)

    # the head's variables come back, the live client and cluster do not (the save said so)
    again = await server.execute(kernel, SCHEDULER_CELL, within=120)
    assert again.get("error") is None, again
    assert "not restored: " in again["stream"], again["stream"]
    assert "client (Client" in again["stream"] and "cluster (LocalCluster" in again["stream"]
    result = await server.execute(kernel, RUN_CELL)
    assert result.get("error") is None, result
    assert json.loads(result["stream"]) == {
        "workers": [["1", "w1"]],
        "head": ["0", "head"],
        "task": ["1", "w1"],
    }
    assert pods_of(plane, kernel)["worker"]["metadata"]["name"] != first  # a new worker pod

    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel, high)
    assert processes_naming(head) == []


async def test_a_worker_command_that_ends_leaves_its_pod_and_the_group_running(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.set_quota("cluster-queue", "default-flavor", {"cpu": 8, "memory": "32Gi"})
    ends = ["python", "-c", "raise SystemExit(3)"]
    spec = kube_spec(kernelspec, "ends", gpus=0, pod_group_size=2, worker_command=ends)
    kernel = await server.start(spec)

    async def worker_running() -> bool:
        return "worker" in pods_of(plane, kernel)

    await server.wait_for(worker_running, within=30)
    worker = pods_of(plane, kernel)["worker"]
    await asyncio.sleep(1.0)  # the command has long ended: the worker mode holds the pod

    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    now = plane.get("", "pods", "default", worker["metadata"]["name"])
    assert now is not None and now["status"]["phase"] == "Running", now
    assert set(pods_of(plane, kernel)) == {"head", "worker"}

    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


async def test_a_parked_group_gives_back_both_pods_and_wakes_whole_with_the_same_names(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    """Parking a multi-pod kernel stops every pod of it (the group's GPUs go back), and its
    wake brings the group back whole: new pods under the same names, the head's variables
    restored beside the group's."""
    if dns.find_library() is None:
        skip_unless_ci(f"{dns.LIBRARY} is missing: pods cannot resolve names ({dns.INSTALL})")
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    plane.apply(PVC)
    spec = kube_spec(kernelspec, "parks", pod_group_size=2, gpus=1, checkpoint=CHECKPOINT)
    kernel = await server.start(spec)
    assert (await server.execute(kernel, "x = 41"))["status"] == "ok"
    seen = await group_seen(server, kernel)
    before = pods_of(plane, kernel)

    session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel))
    assert session is not None
    await session.park()
    model = await server.wait_reason(kernel, "GPUs released")
    assert model["reason"].startswith("parked on request; 2 GPUs released;"), model["reason"]
    assert pods_of(plane, kernel) == {}  # no pod of the group runs while it is parked

    await session.resume()
    back = await server.execute(kernel, "x + 1", within=120)
    assert back["data"] == "42", back
    again = await group_seen(server, kernel)
    assert again["env"] == seen["env"]
    after = pods_of(plane, kernel)
    assert set(after) == {"head", "worker"}
    assert again["resolved"] == [
        after["head"]["status"]["podIP"],
        after["worker"]["status"]["podIP"],
    ]
    for role in ("head", "worker"):
        assert after[role]["metadata"]["name"] != before[role]["metadata"]["name"]

    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)
