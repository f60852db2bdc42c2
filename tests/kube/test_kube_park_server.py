"""Parking on the kubernetes backend through a real jupyter_server: the provisioner's
`park_kernel` parks a kernel whose pod saves to the checkpoint claim, its GPU goes to the
kernel waiting in the queue, it stays listed as parked with what it saved; `resume_kernel`
queues it with its position, and once the GPU is free a cell runs once, with its output and
its variables; a shutdown then leaves nothing in the cluster."""

from __future__ import annotations

from kernel_queue.server import kernels
from kernel_queue.session import KernelSession
from tests.conftest import EventLog, KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import CHECKPOINT, checkpointed, labelled, wait_clean


def _session(server: Server, kernel_id: str) -> KernelSession:
    session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel_id))
    assert session is not None, f"kernel {kernel_id} has no session"
    return session


async def test_a_parked_kernel_gives_its_gpu_to_the_next_and_wakes_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: EventLog
) -> None:
    name = checkpointed(plane, kernelspec)
    parked = await server.start(name)
    assert (await server.execute(parked, "x = 41; words = ['a', 'b']"))["status"] == "ok"
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")

    await _session(server, parked).park()
    model = await server.wait_reason(parked, "GPU released")
    assert model["reason"].startswith("parked on request; GPU released; your next cell brings")
    assert "saved 2 variables" in model["reason"], model["reason"]
    assert _session(server, parked).parked
    assert (await server.execute(waiting, "1 + 1"))["data"] == "2"  # it has the GPU now
    listed = (await server.fetch("api", "kernel-queue", "kernels")).body
    assert b'"state": "parked"' in listed
    assert labelled(plane, parked)["workloads"]  # the parked group keeps its Workload

    await _session(server, parked).resume()
    # (the position and Kueue's pending message come in either order)
    model = await server.wait_reason(parked, "position 1 of 1, needs 1 GPU; waiting for 1 more")
    assert model["reason"] == (
        "waking from parked: queued in 'user-queue', position 1 of 1, needs 1 GPU; waiting for 1 "
        "more nvidia.com/gpu to free up in ClusterQueue 'cluster-queue'"
    ), model["reason"]

    await server.shutdown_and_wait(waiting)
    back = await server.execute(parked, "print('once'); x + 1, words", within=120)
    assert back["data"] == "(42, ['a', 'b'])", back
    assert back["stream"].count("once") == 1, back["stream"]
    states = event_log.states(parked)
    assert states[-4:] == ["parked", "requeued", "admitted", "resumed"], states
    await server.shutdown_and_wait(parked)
    await wait_clean(server, plane, parked, waiting)


async def test_a_parked_kernel_shut_down_leaves_nothing_in_the_cluster(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start(checkpointed(plane, kernelspec))
    assert (await server.execute(kernel, "y = 1"))["status"] == "ok"
    await _session(server, kernel).park(idle_seconds=1800)
    model = await server.wait_reason(kernel, "GPU released")
    assert model["reason"].startswith("parked after 30 min idle; GPU released;"), model["reason"]
    await server.shutdown_and_wait(kernel)
    await wait_clean(server, plane, kernel)
    claim = plane.claim_dir("default", str(CHECKPOINT["claim"]))
    assert not (claim / kernel).exists()  # its checkpoints are gone from the claim too


async def test_a_restart_of_a_parked_kernel_wakes_it(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start(checkpointed(plane, kernelspec))
    assert (await server.execute(kernel, "v = 7"))["status"] == "ok"
    await _session(server, kernel).park()
    await server.wait_reason(kernel, "GPU released")
    await server.fetch("api", "kernels", kernel, "restart", method="POST", body="{}")
    assert (await server.execute(kernel, "1 + 1", within=120))["data"] == "2"
    await server.shutdown_and_wait(kernel)
    await wait_clean(server, plane, kernel)
