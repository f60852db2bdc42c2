"""A kernel pod deleted with grace 0 (no SIGTERM reaches the kernel: a lost node, a forced delete)
comes back, through Jupyter's restarter, as of the last cell its continuous checkpoints saved;
an evicted one (a graceful delete: its SIGTERM lets it save) as of that save."""

from __future__ import annotations

from typing import Any

import kernel_queue.checkpoint as kc
from tests.conftest import KernelspecFactory, Server
from tests.continuous import CELLS, run
from tests.kube.planes import Plane
from tests.kube.support import CLAIM, checkpointed, labelled, wait_clean


async def test_a_pod_deleted_at_grace_0_after_five_cells_comes_back_as_of_the_fifth(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    kernel_id = await server.start(checkpointed(plane, kernelspec, "low"))
    for number, cell in enumerate(CELLS, 1):
        reply = await run(server, kernel_id, cell)
        assert (reply["status"], reply["count"]) == ("ok", number)
    store = plane.claim_dir("default", CLAIM) / kernel_id

    def fifth_saved() -> bool:
        found = kc.DirectoryStore(store).committed()
        return bool(found) and found[-1].manifest.get("cell") == len(CELLS)

    await server.wait_for(fifth_saved, what="the last cell's checkpoint")
    (pod,) = labelled(plane, kernel_id)["pods"]

    plane.delete("", "pods", "default", pod, grace=0)  # no SIGTERM, no save

    def running_again() -> bool:
        states = event_log.states(kernel_id)
        return "finished" in states and "running" in states[states.index("finished") :]

    await server.wait_for(running_again, what="the kernel running again", within=120)
    first = await run(server, kernel_id, "(x, float(a[0]), float(b[1]))")
    assert first["data"] == "(5, 7.0, 1.0)", first
    assert "restored 3 variables (4.2 MB) as of cell [5]" in first["stream"], first["stream"]
    assert "the kernel then stopped without warning" in first["stream"], first["stream"]
    await server.shutdown(kernel_id)
    await wait_clean(server, plane, kernel_id)
    assert not store.exists()  # deleted at shutdown (checkpoint.keep is off)


async def test_an_evicted_pod_saves_and_comes_back_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    """An eviction (a drain, the node's pressure) is a graceful delete: the kernel is told by its
    SIGTERM, saves, and comes back as of that save, its first cell saying so."""
    kernel_id = await server.start(checkpointed(plane, kernelspec, "low"))
    assert (await run(server, kernel_id, "y = 41"))["status"] == "ok"
    assert (await run(server, kernel_id, "y += 1"))["status"] == "ok"
    (pod,) = labelled(plane, kernel_id)["pods"]

    plane.evict("default", pod)

    def running_again() -> bool:
        states = event_log.states(kernel_id)
        later = states[states.index("running") + 1 :] if "running" in states else []
        return "running" in later

    await server.wait_for(running_again, what="the kernel running again", within=120)
    first = await run(server, kernel_id, "y")
    assert first["data"] == "42", first
    assert first["stream"].startswith("restored 1 variable"), first["stream"]
    assert "Restored: y." in first["stream"], first["stream"]
    await server.shutdown(kernel_id)
    await wait_clean(server, plane, kernel_id)
