"""Shared by the parking tests of the kubernetes backend: a backend on the test's plane as a
(possibly restarted) server makes it, running code in a group's kernel, a kernel running or
parked through the backend's API, and the check that nothing of it is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends.kubernetes import KubernetesBackend
from kernel_queue.kube import kueue
from kernel_queue.model import GroupPhase, GroupRef, StopCause
from tests.contract import Contract, Followed, client_of
from tests.kube.planes import Plane
from tests.kube.support import CHECKPOINT, CLAIM, OWNER, labelled
from tests.polling import until


def backend(plane: Plane, root: Path, **settings: Any) -> KubernetesBackend:
    """The backend a server of this test makes (a second call: a restarted server), with the
    credentials etc/kubernetes/rbac.yaml grants the server; its kubeconfig goes in `root`."""
    kubeconfig = plane.server_kubeconfig(root)
    options = {"position_interval": 0.2, "owner_id": OWNER, "reap_interval": 0, **settings}
    return KubernetesBackend(kubeconfig=str(kubeconfig), namespace="default", **options)


def contract(made: KubernetesBackend) -> Contract:
    """Kernels with checkpoints to the claim, one GPU each, in `user-queue`."""
    return Contract(made, "user-queue", image="kernel-queue/test-kernel", checkpoint=CHECKPOINT)


async def execute(ref: GroupRef, followed: Followed, code: str) -> str:
    """Run `code` in the group's kernel; what it printed."""
    address = followed.statuses[-1].address or ref.connection.ip
    client = await client_of(ref, address)
    printed: list[str] = []

    def output(message: dict[str, Any]) -> None:
        if message["header"]["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    try:
        reply = await client.execute_interactive(code, timeout=60, output_hook=output)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    return "".join(printed)


def workload(plane: Plane, name: str) -> dict[str, Any]:
    found = plane.get(kueue.KUEUE_GROUP, "workloads", "default", name)
    assert found is not None, f"no Workload {name}"
    return found


RETRYING_FOR_A_SECOND = pytest.mark.parametrize("backend_settings", [{"api_retry_seconds": 1.0}])
"""The test's backend retries a refused request for a second only, then says so."""


async def woken(tested: Contract, ref: GroupRef, followed: Followed) -> None:
    """Wake a parked kernel `running` made: it runs again, `x` restored."""
    await tested.backend.resume(ref)
    await followed.running(ref)
    assert restored(await execute(ref, followed, "print(x + 1)"), "42\n")


async def released(tested: Contract, plane: Plane, ref: GroupRef) -> None:
    """Release a kernel through the backend; nothing of it is left in the cluster."""
    await tested.backend.release(ref)
    await nothing_left(plane, ref)


async def running(tested: Contract) -> tuple[GroupRef, Followed]:
    """A low-priority kernel submitted through the backend, running, with `x = 41` run in it."""
    ref = await tested.backend.submit(tested.spec("low"))
    followed = tested.follow(ref)
    await followed.running(ref)
    await execute(ref, followed, "x = 41")
    return ref, followed


async def being_parked(tested: Contract) -> tuple[GroupRef, Followed]:
    """A kernel as `running` makes it, asked to park and seen parking (its save under way)."""
    ref, followed = await running(tested)
    await tested.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is GroupPhase.PARKING)
    return ref, followed


async def parked(tested: Contract) -> tuple[GroupRef, Followed]:
    """A kernel as `running` makes it, then parked."""
    ref, followed = await running(tested)
    await tested.backend.park(ref, grace=30)
    await followed.until(lambda f: f.phase is GroupPhase.PARKED)
    return ref, followed


async def shut_down(tested: Contract, ref: GroupRef) -> None:
    """As the server shuts a kernel down: stop it (its checkpoints go with it), release it."""
    await tested.backend.stop(ref, grace=30, cause=StopCause.SHUTDOWN)
    await tested.backend.release(ref)


def restored(printed: str, output: str) -> bool:
    """The first cell after a restore prints what was restored, then its own output."""
    return printed.startswith("restored 1 variable") and printed.endswith("\n" + output)


async def nothing_left(plane: Plane, *refs: GroupRef, parked: bool = False) -> None:
    """Nothing of the kernels in the cluster; `parked`: ended while parked, their checkpoints
    are gone too (the cleanup pod's; a running kernel's are its own launcher's to delete)."""
    await until(
        lambda: not any(labelled(plane, ref.kernel_id) for ref in refs),
        "nothing of the kernels left in the cluster",
        within=30,
        detail=lambda: [labelled(plane, ref.kernel_id) for ref in refs],
    )
    claim = plane.claim_dir("default", CLAIM)
    assert not parked or not any((claim / ref.kernel_id).exists() for ref in refs)
