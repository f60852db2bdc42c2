"""End to end on both planes: real jupyter_server, the kubernetes backend over HTTP with RBAC
from etc/kubernetes/rbac.yaml, Kueue admitting pod groups, kernels run by the node agent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import GPU_QUOTA, kube_spec, wait_clean, waits_then_runs

WAITING_FOR_THE_GPU = "waiting for 1 more nvidia.com/gpu to free up in ClusterQueue 'cluster-queue'"
"""What Kueue's condition says of a kernel waiting behind the one that holds the only GPU."""


async def test_a_kernel_waits_for_the_gpu_then_runs_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    # The position and Kueue's reason arrive separately: wait for the whole sentence.
    whole = f"queued in 'user-queue', position 1 of 1, needs 1 GPU; {WAITING_FOR_THE_GPU}"
    first, second, waited = await waits_then_runs(server, plane, kube_spec(kernelspec), whole)
    assert waited == whole
    # Nothing of any kind the API server serves carries either kernel's label.
    for kernel in (first, second):
        assert plane.everything("default", f"kernel-queue.dev/kernel-id={kernel}") == {}


async def test_a_two_pod_group_waits_whole_and_is_admitted_whole(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    holder = await server.start_running(kube_spec(kernelspec, "holder"))
    gang = await server.start(kube_spec(kernelspec, "gang", pod_group_size=2, gpus=1))
    # the group's words count the whole group
    await server.wait_reason(gang, "position 1 of 1, needs 2 GPUs: 2 pods of 1 GPU")
    pods = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={gang}")
    assert len(pods) == 2
    for pod in pods:  # both wait, gated, none runs: the group is admitted whole or not at all
        assert pod["status"]["phase"] == "Pending", pod["status"]
        assert {"name": "kueue.x-k8s.io/admission"} in pod["spec"].get("schedulingGates", [])
    await server.shutdown(holder)
    assert (await server.execute(gang, "3*3"))["data"] == "9"
    pods = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={gang}")
    assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
    await server.shutdown(gang)
    await wait_clean(server, plane, holder, gang)


async def test_a_two_pod_group_is_admitted_as_a_gang(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 2})
    kernel = await server.start(kube_spec(kernelspec, pod_group_size=2, gpus=1))
    result = await server.execute(kernel, "import os; os.environ['KERNEL_ID'][:8]")
    assert result["data"] == repr(kernel[:8])
    pods = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={kernel}")
    assert sorted(p["metadata"]["labels"]["kernel-queue.dev/role"] for p in pods) == [
        "head",
        "worker",
    ]
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    workloads = plane.objects("kueue.x-k8s.io", "workloads", "default")
    (workload,) = [w for w in workloads if w["metadata"]["name"].startswith(f"kq-{kernel[:8]}")]
    assert sum(ps["count"] for ps in workload["spec"]["podSets"]) == 2
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


async def test_a_higher_priority_kernel_preempts_and_the_victim_comes_back(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    low = await server.start(kube_spec(kernelspec, "low", priority_class="low"))
    assert (await server.execute(low, "x = 41; x + 1"))["data"] == "42"
    address = server.app.kernel_manager.get_kernel(low).get_connection_info()["ip"]
    high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    requeued = "preempted; requeued in 'user-queue', position 1 of 1, needs 1 GPU"
    model = await server.wait_reason(low, f"{requeued}; {WAITING_FOR_THE_GPU}")
    assert model["reason"] == f"{requeued}; {WAITING_FOR_THE_GPU}"
    await server.shutdown(high)
    back = await server.execute(low, "x")
    assert back["error"] == "NameError"  # no checkpoint yet: the kernel restarted fresh
    assert server.app.kernel_manager.get_kernel(low).get_connection_info()["ip"] == address
    states = event_log.states(low)
    assert states[-4:] == ["preempted", "requeued", "admitted", "resumed"]
    resumed = [e for e in event_log.events if e["kernel_id"] == low and e["state"] == "resumed"]
    assert "variables were not restored" in resumed[-1]["message"]
    await server.shutdown(low)
    await wait_clean(server, plane, low, high)


async def test_restart_happens_in_place_and_keeps_the_admission(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    name = kube_spec(kernelspec)
    running = await server.start(name)
    before = await server.execute(running, "import os; y = 1; os.getpid()")
    waiting = await server.start(name)
    await server.wait_reason(waiting, f"position 1 of 1, needs 1 GPU; {WAITING_FOR_THE_GPU}")
    pods_before = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={running}")
    workload_before = _workload(plane, running)
    await server.fetch("api", "kernels", running, "restart", method="POST", body="{}")
    after = await server.execute(running, "import os; os.getpid()")
    assert after["data"] != before["data"]  # a new kernel process
    assert (await server.execute(running, "y"))["error"] == "NameError"
    pods_after = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={running}")
    assert [p["metadata"]["uid"] for p in pods_after] == [p["metadata"]["uid"] for p in pods_before]
    # the same Workload, still admitted: the restart gave nothing back to the queue
    assert _workload(plane, running)["metadata"]["uid"] == workload_before["metadata"]["uid"]
    assert (await server.model(waiting))["reason"] == (
        f"queued in 'user-queue', position 1 of 1, needs 1 GPU; {WAITING_FOR_THE_GPU}"
    )
    await server.shutdown(waiting)
    await server.shutdown(running)
    await wait_clean(server, plane, running, waiting)


async def test_delete_of_a_queued_kernel_cancels_at_once_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    name = kube_spec(kernelspec)
    running, queued = await server.hold_and_queue(name)
    await server.shutdown(queued)  # the GPU never frees: waiting for admission would hang

    async def gone() -> bool:
        return queued not in await server.kernel_ids()

    await server.wait_for(gone, within=30)
    await wait_clean(server, plane, queued)
    assert (await server.execute(running, "2"))["data"] == "2"
    await server.shutdown(running)
    await wait_clean(server, plane, running)


async def test_a_new_server_reattaches_to_a_running_and_a_queued_kernel(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    import zmq.asyncio
    from jupyter_client import AsyncKernelClient

    from kernel_queue.provisioner import QueuedKernelProvisioner

    name = kube_spec(kernelspec)
    running = await server.start(name)
    assert (await server.execute(running, "z = 7"))["data"] is None
    queued = await server.start(name)
    await server.wait_reason(queued, "position 1 of 1")
    manager = server.app.kernel_manager
    saved = {
        k: await manager.get_kernel(k).provisioner.get_provisioner_info() for k in (running, queued)
    }

    def fresh(kernel_id: str) -> QueuedKernelProvisioner:
        # Another server: no parent kernel manager, so its own backend, informers and client.
        spec = manager.get_kernel(kernel_id).kernel_spec
        return QueuedKernelProvisioner(
            kernel_id=kernel_id, kernel_spec=spec, config=server.app.config
        )

    again = {k: fresh(k) for k in (running, queued)}
    for kernel_id in again:  # the first server is gone: it no longer watches or restarts them
        old = manager.get_kernel(kernel_id)
        old.stop_restarter()
        await old.provisioner._session.aclose()
    for kernel_id, provisioner in again.items():
        await provisioner.load_provisioner_info(saved[kernel_id])
        assert await provisioner.poll() is None  # alive: running, or waiting in the queue
    queued_session = again[queued].kernel_session
    assert queued_session is not None and queued_session.waiting

    # A context of the test's own, ended here: one the client made would be ended whenever the
    # client is collected, in a later test (a CI run once saw unraisable warnings here).
    context = zmq.asyncio.Context()
    client = AsyncKernelClient(context=context)
    client.load_connection_info(saved[running]["connection_info"])
    client.start_channels()
    try:
        reply = await client.execute_interactive("print(z)", timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"  # the same kernel, its variables intact
    finally:
        client.stop_channels()
        context.destroy(linger=0)

    await again[running].cleanup(restart=False)  # the new server ends the running kernel

    async def admitted() -> bool:
        return not queued_session.waiting and await again[queued].poll() is None

    await server.wait_for(admitted, within=60)
    await again[queued].cleanup(restart=False)
    await wait_clean(server, plane, running, queued)
    from kernel_queue import backends

    await backends.aclose_all(asyncio.get_running_loop())  # the other server's backend


async def test_connect_pod_ip_reaches_the_kernel_at_its_pod(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start(kube_spec(kernelspec, connect="pod-ip"))
    assert (await server.execute(kernel, "6*7"))["data"] == "42"
    ip = server.app.kernel_manager.get_kernel(kernel).get_connection_info()["ip"]
    pods = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={kernel}")
    assert ip == pods[0]["status"]["podIP"]
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


async def test_without_the_visibility_api_the_local_queue_count_is_shown(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.fail_next("get", "localqueues/pendingworkloads", status=503, count=10_000)
    name = kube_spec(kernelspec)
    running = await server.start_running(name)
    queued = await server.start(name)
    model = await server.wait_reason(
        queued, f"one of 1 waiting, needs 1 GPU; {WAITING_FOR_THE_GPU}"
    )
    assert model["reason"] == (
        f"queued in 'user-queue', one of 1 waiting, needs 1 GPU; {WAITING_FOR_THE_GPU}"
    )
    await server.shutdown(queued)
    await server.shutdown(running)
    await wait_clean(server, plane, running, queued)


def _workload(plane: Plane, kernel: str) -> dict[str, Any]:
    """The Workload of the kernel's group (one)."""
    workloads = plane.objects("kueue.x-k8s.io", "workloads", "default")
    (workload,) = [w for w in workloads if w["metadata"]["name"].startswith(f"kq-{kernel[:8]}")]
    return workload


async def test_a_kernel_runs_as_soon_as_it_listens_not_when_the_kubelet_next_probes(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    # The node agent probes readiness as a kubelet does: at the container's start, then every
    # periodSeconds (1 s), so a pod is Ready up to 1 s after its kernel listens. The server
    # reaches the kernel itself (every 10 ms) and connects through the Service, which
    # publishes the pod before it is Ready. Waiting for Ready, no kernel below would run before
    # it; with the server's own look, one misses it only when the kubelet's probe falls within
    # those few milliseconds.
    caplog.set_level(logging.DEBUG)
    name = kube_spec(kernelspec)
    kernels = []
    for _ in range(5):
        kernel = await server.start_running(name)
        kernels.append(kernel)
        await server.shutdown(kernel)
        await wait_clean(server, plane, kernel)
    early = [k for k in kernels if f"kernel {k[:8]} answers at " in caplog.text]
    assert early, "no kernel ran before its pod was Ready"
