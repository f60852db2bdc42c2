"""Preemption becomes a pause, on both planes: the kernel's pod saves to the checkpoint claim,
the pod group's Workload is requeued (not Finished, because the kernel exits non-zero), and the
replacement pod restores the variables."""

from __future__ import annotations

import asyncio
from typing import Any

from kernel_queue.kube import kueue
from tests.checkpoint_scenario import (
    CHECK,
    EXPECTED,
    LOOP,
    NOT_RESTORED,
    NOT_SAVED,
    NOTICE,
    RESTORED,
    SAVED,
    SETUP,
    private_modes,
)
from tests.conftest import KernelspecFactory, Listener, Server
from tests.kube.planes import Plane
from tests.kube.support import (
    CHECKPOINT,
    CLAIM,
    PVC,
    checkpointed,
    kube_spec,
    labelled,
    ours,
    wait_clean,
)

UNBOUND_PVC = PVC.replace("spec:\n", "spec:\n  storageClassName: rwx-nobody-provides\n")
"""The claim, naming a StorageClass no provisioner serves: it stays Pending on both planes."""


def workload(plane: Plane, name: str) -> dict[str, Any]:
    obj = plane.get(kueue.KUEUE_GROUP, "workloads", "default", name)
    assert obj is not None, f"no Workload {name}"
    return obj


async def test_a_preempted_pod_saves_to_the_claim_and_its_replacement_restores(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    low = await server.start(checkpointed(plane, kernelspec, "low", priority_class="low"))
    assert (await server.execute(low, SETUP))["status"] == "ok"
    (group,) = labelled(plane, low)["workloads"]
    listener = await Listener.open(server, low)
    try:
        high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))

        async def told() -> bool:
            return NOTICE in listener.text() and NOT_SAVED in listener.text()

        await server.wait_for(told, within=60)
    finally:
        listener.close()
    model = await server.wait_reason(low, SAVED)  # from the pod's termination message
    assert "; requeued in 'user-queue'" in model["reason"], model["reason"]
    assert (await server.execute(high, "1+1"))["data"] == "2"

    # Kueue requeued the group: the kernel exited 143, so the Workload is not Finished.
    requeued = workload(plane, group)
    assert kueue.condition(requeued, kueue.FINISHED) is None
    assert (kueue.condition(requeued, "Requeued") or {}).get("status") == "True"
    store = plane.claim_dir("default", CLAIM) / low
    assert private_modes(store) == ({0o700}, {0o600})

    await server.shutdown(high)
    first = await server.execute(low, CHECK, within=120)
    assert first["data"] == EXPECTED
    assert RESTORED in first["stream"]
    assert NOT_RESTORED in first["stream"]
    assert event_log.states(low)[-4:] == ["preempted", "requeued", "admitted", "resumed"]

    await server.shutdown(low)
    await wait_clean(server, plane, low, high)
    assert not store.exists()  # deleted at shutdown (checkpoint.keep is off)


async def test_a_running_loop_is_stopped_on_its_cell_and_its_progress_is_kept(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    low = await server.start(checkpointed(plane, kernelspec, "low", priority_class="low"))
    listener = await Listener.open(server, low)
    running = asyncio.ensure_future(server.execute(low, LOOP, within=120))
    try:

        async def looping() -> bool:
            return "looping" in listener.text()

        await server.wait_for(looping, within=60)
        high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
        stopped = await running
    finally:
        running.cancel()
        listener.close()
    assert stopped["status"] == "error"
    assert stopped["error"] == "Preempted"  # the user sees it on the cell that was running
    assert "looping" in stopped["stream"]
    model = await server.wait_reason(low, "saved 1 variable")  # from the termination message
    assert "; requeued in 'user-queue'" in model["reason"], model["reason"]
    assert (await server.execute(high, "1+1"))["data"] == "2"

    await server.shutdown(high)
    await wait_clean(server, plane, high)
    back = await server.execute(low, "i > 1000", within=120)
    assert back["data"] == "True", back
    assert "restored 1 variable" in back["stream"]
    assert "mid-update" not in back["stream"]  # saved at the cell boundary, not concurrently
    await server.shutdown(low)
    await wait_clean(server, plane, low, high)


async def test_a_missing_checkpoint_claim_is_refused_before_anything_is_created(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start(kube_spec(kernelspec, checkpoint=CHECKPOINT))

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead, within=60)
    reason = (await server.model(kernel))["reason"]
    assert f"checkpoint claim {CLAIM!r} does not exist in namespace 'default'" in reason
    assert "create the PersistentVolumeClaim" in reason
    assert ours(plane) == {}


async def test_a_checkpoint_claim_left_unbound_fails_the_kernel_in_a_sentence_naming_it(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    """A ReadWriteMany claim the cluster's storage cannot give stays Pending (here: it names a
    StorageClass nobody provides): the pod is never scheduled, and the kernel fails within
    startup_timeout naming the claim and the fix."""
    plane.apply(UNBOUND_PVC)
    kernel = await server.start(kube_spec(kernelspec, checkpoint=CHECKPOINT, startup_timeout=3))

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead, within=60)
    reason = (await server.model(kernel))["reason"]
    assert "did not start within startup_timeout" in reason
    assert f"Its PersistentVolumeClaim {CLAIM!r} is not bound to a volume" in reason
    assert "a StorageClass that provides ReadWriteMany" in reason
    await wait_clean(server, plane, kernel)


PEEK = """
import os
mine = os.environ.get("KUBE_FAKE_MOUNT_CHECKPOINTS") or "/checkpoints"
open(os.path.join(mine, "planted-by-" + os.environ["KERNEL_ID"][:8]), "w").write("x")
sorted(os.listdir(mine))
"""


async def test_kernels_sharing_a_claim_see_only_their_own_directory(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    name = checkpointed(plane, kernelspec, "kube", gpus=0)
    first, second = await server.start(name), await server.start(name)
    seen = {k: (await server.execute(k, PEEK))["data"] for k in (first, second)}
    for kernel in (first, second):
        assert seen[kernel] == repr([f"planted-by-{kernel[:8]}"])  # nothing of the other's
    claim = plane.claim_dir("default", CLAIM)
    assert sorted(p.name for p in claim.iterdir()) == sorted([first, second])
    planted = [p.name for p in (claim / first).iterdir() if p.name.startswith("planted-by-")]
    assert planted == [f"planted-by-{first[:8]}"]  # beside the kernel's own checkpoints
    await server.shutdown(first)
    await server.shutdown(second)
    await wait_clean(server, plane, first, second)
