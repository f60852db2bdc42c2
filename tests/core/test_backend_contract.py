"""One contract, both real backends: the local backend and the kubernetes backend on the fake
cluster, driven through the `ClusterBackend` API alone (no Jupyter server). Submit, wait in the
queue, cancel, preempt, restart in place, release and reattach mean the same on each."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_queue import backends, heartbeat
from kernel_queue.machine.client import user_socket_path
from kernel_queue.model import GroupPhase, GroupRef, StopCause
from tests import leftovers
from tests.contract import ENDED, Contract, client_of, submitted
from tests.kube.conftest import cluster, cluster_options  # noqa: F401 - shared fixtures
from tests.kube.support import OWNER, SERVER_TOKEN


@pytest.fixture(params=["local", "kubernetes"])
def contract(
    request: pytest.FixtureRequest, tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Iterator[Contract]:
    backend: backends.ClusterBackend
    if request.param == "local":
        from kernel_queue.backends.local import LocalBackend

        backend = LocalBackend(gpus=["0"], log_dir=str(tmp_path / "logs"))
        tested = Contract(backend, "gpu")
    else:
        from kernel_queue.backends.kubernetes import KubernetesBackend

        fake = request.getfixturevalue("cluster")
        kubeconfig = fake.kubeconfig_for(SERVER_TOKEN, name="contract-kubeconfig")
        backend = KubernetesBackend(
            kubeconfig=str(kubeconfig),
            namespace="default",
            position_interval=0.2,
            owner_id=OWNER,
            reap_interval=0,
        )
        tested = Contract(backend, "user-queue", image="kernel-queue/test-kernel")
    yield tested
    jp_asyncio_loop.run_until_complete(tested.aclose())


def test_a_local_backend_outside_a_server_queues_in_its_workers_own_runtime_dir() -> None:
    """The local contract runs without pytest-jupyter's private Jupyter dirs: its queue service
    lives in the runtime dir the suite gives each xdist worker. In the user's own runtime dir two
    workers' kernels met in one queue (a waiting kernel was told place 2 of 2) and the user's
    queue log grew with the tests' kernels."""
    socket = user_socket_path()
    assert socket.is_relative_to(leftovers.files_root()), socket
    assert not socket.is_relative_to(Path.home()), socket


async def test_a_kernel_runs_restarts_in_place_is_reattached_and_released(
    contract: Contract,
) -> None:
    backend = contract.backend
    group = contract.spec("low")
    ref = await backend.submit(group)
    followed = contract.follow(ref)
    await followed.running(ref)
    assert await backend.submit(group) == ref  # submitted again while it runs: the same group

    again = contract.follow(GroupRef.from_dict(ref.to_dict()))  # a restarted server's ref
    await again.until(lambda f: f.phase is not None)
    assert again.phase is GroupPhase.RUNNING

    address = followed.statuses[-1].address or ref.connection.ip
    client = await client_of(ref, address)
    try:
        await client.execute_interactive("x = 1", timeout=60)
        seen = len(followed.statuses)
        client.shutdown(restart=True)  # the launcher restarts its kernel in place
        if backend.tracks_kernel_restarts:  # it reports the new kernel process
            await followed.until(lambda f: f.statuses[-1].generation == 1)
            await followed.until(lambda f: f.statuses[-1].kernel_alive)
        else:  # a pod: only the kernel's heartbeat tells
            port = ref.connection.hb_port
            assert await heartbeat.wait_for(address, port, alive=False, within=30)
            assert await heartbeat.wait_for(address, port, alive=True, within=60)
    finally:
        client.stop_channels()
    client = await client_of(ref, address)
    try:
        reply = await client.execute_interactive("assert 'x' not in dir()", timeout=60)
        assert reply["content"]["status"] == "ok"  # a fresh kernel process
    finally:
        client.stop_channels()
    # Not requeued: it keeps its admission. A pod's readiness probe may fail while its new
    # kernel process starts (3 s on a loaded machine), which reads as ADMITTED meanwhile.
    assert {s.phase for s in followed.statuses[seen:]} <= {GroupPhase.ADMITTED, GroupPhase.RUNNING}

    await backend.release(ref)
    await followed.until(lambda f: f.ended)
    assert followed.phase in ENDED
    await backend.release(ref)  # a second release finds nothing left to do
    late = contract.follow(GroupRef.from_dict(ref.to_dict()))  # a server that comes back late
    await late.until(lambda f: f.ended)
    assert [s.phase for s in late.statuses] == [GroupPhase.FINISHED]  # gone, at once


async def test_a_waiting_kernel_is_placed_and_cancelled_and_a_preempted_one_comes_back(
    contract: Contract,
) -> None:
    backend = contract.backend
    low, low_followed = await submitted(contract, "low")
    await low_followed.running(low)

    waiting, waiting_followed = await submitted(contract, "low")
    await waiting_followed.until(
        lambda f: f.phase is GroupPhase.QUEUED and f.statuses[-1].place is not None
    )
    place = waiting_followed.statuses[-1].place
    assert place is not None and (place.position, place.length) in ((1, 1), (0, 1))
    await backend.release(waiting)  # cancelled while it waits
    await waiting_followed.until(lambda f: f.ended)
    assert GroupPhase.RUNNING not in waiting_followed.phases()

    high, high_followed = await submitted(contract, "high")
    await low_followed.until(lambda f: GroupPhase.EVICTED in f.phases())
    await high_followed.running(high)
    await low_followed.until(lambda f: f.phase is GroupPhase.QUEUED)  # requeued, same group
    await backend.stop(high, grace=0, cause=StopCause.SHUTDOWN)
    await high_followed.until(lambda f: f.ended)
    await backend.release(high)
    await low_followed.running(low)  # back once the GPU is free
    phases = low_followed.phases()
    assert GroupPhase.QUEUED in phases[phases.index(GroupPhase.EVICTED) :]
    await backend.release(low)
    await low_followed.until(lambda f: f.ended)


def backend_tasks() -> list[str]:
    """The unfinished tasks running kernel-queue's own code (not the fake cluster's, not ours)."""
    package = Path(backends.__file__).parent.parent
    found = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and not task.done() and Path(code.co_filename).is_relative_to(package):
            found.append(f"{task.get_name()}: {code.co_qualname}")
    return found


async def test_aclose_ends_every_task_the_backend_started(contract: Contract) -> None:
    backend = contract.backend
    running, running_followed = await submitted(contract, "low")
    await running_followed.running(running)
    _, waiting_followed = await submitted(contract, "low")  # it waits for the one GPU
    await waiting_followed.until(lambda f: f.phase is GroupPhase.QUEUED)
    # A stop with a grace period: the local backend's kill after it is still pending.
    await backend.stop(running, grace=30, cause=StopCause.SHUTDOWN)
    for followed in contract.followed:
        await followed.aclose()
    contract.followed.clear()
    assert backend_tasks() != []  # the launcher's run, or a position reader and the informers
    await backend.aclose()
    assert backend_tasks() == []
