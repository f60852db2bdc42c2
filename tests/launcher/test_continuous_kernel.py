"""Continuous checkpoints end to end: a real launcher and kernel save after each cell in a forked
child; a kernel killed without warning comes back, under a new launcher, as of its last saved
cell; a save in flight neither delays the next cell nor is lost at SIGTERM."""

from __future__ import annotations

import os
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import checkpoint
from kernel_queue.checkpoint import candidates
from kernel_queue.launcher import continuous, page_writes
from tests.launcher.kernels import (
    Kernel,
    StartKernel,
    run,
)
from tests.launcher.processes import WAIT, execute, is_gone, value_of
from tests.polling import until_sync

pytestmark = pytest.mark.timeout(180)

CELLS = [
    "import numpy as np\nx = 1",
    "a = np.zeros(2**18)\nb = np.ones(2**18)",
    "x = 3\nnames = ['a', 'b']",
    "a[0] = 7.0",  # in place: the same object, other bytes
    "x = 5\nsquare = lambda v: v * v",
]
SLOW = """
import os, pathlib, time
KERNEL = os.getpid()
class Slow:
    '''Pickles slowly in a save child, on its `calls`th pickling, until RELEASE exists.'''
    calls = 0
    def __init__(self, release, block_on=1):
        self.release, self.block_on = release, block_on
    def __getstate__(self):
        Slow.calls += 1
        if os.getpid() != KERNEL and Slow.calls >= self.block_on:
            pathlib.Path(self.release + ".waiting").touch()
            for _ in range(1200):
                if os.path.exists(self.release):
                    break
                time.sleep(0.05)
        return {"release": self.release, "block_on": self.block_on}
"""


def committed(store: Path) -> list[checkpoint.Checkpoint]:
    return checkpoint.DirectoryStore(store).committed()


def newest_cell(store: Path) -> object:
    found = committed(store)
    return found[-1].manifest.get("cell") if found else None


def kernel_pid(kernel: Kernel) -> int:
    event = kernel.status.next()
    assert event["event"] == "started", event
    return int(event["pid"])


def started(start_kernel: StartKernel, store: Path, **env: str) -> tuple[Kernel, int, Any]:
    """A launcher and kernel on ``store``: the kernel, its pid, and a client of it."""
    kernel = start_kernel(store, **env)
    pid = kernel_pid(kernel)
    return kernel, pid, kernel.client()


def run_and_save(client: Any, store: Path, *cells: str, what: str) -> None:
    """Run ``cells`` in a kernel fresh on ``store``, each without error, and wait for the
    checkpoint of the last (`what`)."""
    for cell in cells:
        assert run(client, cell).reply["status"] == "ok"
    until_sync(lambda: newest_cell(store) == len(cells), what, within=WAIT)


def save_child(pid: int) -> int | None:
    """The kernel's save child, if one runs (the kernel's only child process)."""
    found = [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    return found[0] if found else None


def restored_as_of(store: Path, start_kernel: StartKernel) -> tuple[str, str]:
    """Start a new launcher on ``store`` (what the backend's restart does after a kill); the
    restore sentence its first cell shows, and ``x`` then."""
    kernel = start_kernel(store)
    client = kernel.client()
    cell = run(client, "x")
    text = "".join(cell.streams())
    return text, value_of(client, "(x, float(a[0]), float(b[1]), square(3))")


def test_a_kernel_killed_after_five_cells_comes_back_as_of_the_fifth(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first, pid, client = started(start_kernel, store)
    run_and_save(client, store, *CELLS, what="the fifth cell's checkpoint")

    os.kill(pid, signal.SIGKILL)  # no SIGTERM, no save: as an OOM kill or a lost node

    assert first.proc.wait(timeout=WAIT) == 128 + signal.SIGKILL
    text, values = restored_as_of(store, start_kernel)
    assert "as of cell [5]" in text, text
    assert "the kernel then stopped without warning" in text, text
    assert "Restored: a, b, names, square, x." in text, text
    assert values == "(5, 7.0, 1.0, 9)"  # cell 4's in-place change included


def test_a_kill_while_the_next_save_is_in_flight_restores_the_previous_cell(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store, release = tmp_path / "store", tmp_path / "release"
    first, pid, client = started(start_kernel, store)
    run_and_save(client, store, *CELLS, what="the fifth cell's checkpoint")
    slow = f"{SLOW}\nslow = Slow({str(release)!r}, block_on=2)\nx = 6"
    assert run(client, slow).reply["status"] == "ok"
    until_sync(lambda: Path(f"{release}.waiting").exists(), "the save child writing", within=WAIT)
    child = save_child(pid)
    assert child is not None
    # Read now, with the slow save the only one in flight (one save child at a time): in a
    # clean-clone CI run one more save committed after the checkpoint first read as cell [5].
    before = committed(store)[-1]
    assert before.manifest.get("cell") == 5

    os.kill(pid, signal.SIGKILL)  # the kernel dies mid-save; its child dies with it

    assert first.proc.wait(timeout=WAIT) == 128 + signal.SIGKILL
    until_sync(lambda: is_gone(child), "the save child gone with the kernel", within=WAIT)
    assert committed(store)[-1] == before  # the previous checkpoint intact, the partial unseen
    text, values = restored_as_of(store, start_kernel)
    assert "as of cell [5] (saved" in text, text
    assert "before the kernel stopped without warning; later cells were lost" in text, text
    assert values == "(5, 7.0, 1.0, 9)"


def test_a_cell_that_ends_while_a_coalesced_save_waits_to_start_is_saved_once(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    """A save that cells asked for while another ran starts once the kernel's loop is free; a
    cell ending first starts its own save, and the one still queued then started a second save
    of the same cell (seen failing first: four saves, of cells 1, 3, 3 and 4)."""
    store, release = tmp_path / "store", tmp_path / "release"
    _, _, client = started(start_kernel, store)
    assert run(client, f"{SLOW}\nslow = Slow({str(release)!r})").reply["status"] == "ok"
    until_sync(lambda: Path(f"{release}.waiting").exists(), "the slow save started", within=WAIT)
    assert run(client, "y = 2").reply["status"] == "ok"  # one more save is due after it
    # The slow save ends while this cell runs: the save due waits for the loop, behind it.
    releasing = f"pathlib.Path({str(release)!r}).touch()\ntime.sleep(2)\ny = 3"
    assert run(client, releasing).reply["status"] == "ok"
    until_sync(lambda: newest_cell(store) == 3, "the save of cell [3]", within=WAIT)
    assert run(client, "y = 4").reply["status"] == "ok"
    until_sync(lambda: newest_cell(store) == 4, "the save of cell [4]", within=WAIT)
    # The store keeps the newest two; a checkpoint's number counts every save before it.
    saved = [(candidates.seq(c.path.name), c.manifest.get("cell")) for c in committed(store)]
    assert saved == [(2, 3), (3, 4)], f"(save, cell): {saved}"


def test_the_next_cell_never_waits_for_a_slow_save(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store, release = tmp_path / "store", tmp_path / "release"
    _, pid, client = started(start_kernel, store)
    assert run(client, f"{SLOW}\nslow = Slow({str(release)!r})").reply["status"] == "ok"
    until_sync(lambda: Path(f"{release}.waiting").exists(), "the slow save started", within=WAIT)
    cells = [run(client, f"y = {n}") for n in range(3)]  # each ends while the save runs
    assert [c.reply["status"] for c in cells] == ["ok"] * 3
    assert committed(store) == [] and save_child(pid) is not None  # the save still runs

    release.touch()

    # the cells that ended meanwhile made one more save, of the last of them
    until_sync(lambda: newest_cell(store) == 4, "the coalesced save of cell [4]", within=WAIT)
    cells_saved = [c.manifest.get("cell") for c in committed(store)]
    assert cells_saved == [1, 4], cells_saved
    restored = types.ModuleType("__main__")
    checkpoint.restore(restored, committed(store)[-1])
    assert restored.y == 2


def test_sigterm_during_a_save_waits_for_it_then_flushes_only_the_rest(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store, release = tmp_path / "store", tmp_path / "release"
    kernel, _, client = started(start_kernel, store, KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE="60")
    big = "import numpy as np\nbig = np.arange(2**20, dtype=np.float64)"
    run_and_save(client, store, big, what="the first cell's checkpoint")
    assert run(client, f"{SLOW}\nslow = Slow({str(release)!r})").reply["status"] == "ok"
    until_sync(lambda: Path(f"{release}.waiting").exists(), "the slow save started", within=WAIT)

    kernel.proc.send_signal(signal.SIGTERM)
    until_sync(lambda: continuous.read_activity(store) is not None, "activity", within=WAIT)
    release.touch()  # the save in flight may end now; the flush waited for it

    assert kernel.proc.wait(timeout=WAIT) == 143
    event = kernel.checkpoint_event()
    assert event["checkpoint"] is not None, event
    last, previous = committed(store)[-1], committed(store)[-2]
    assert previous.manifest["trigger"] == "continuous" and previous.manifest["cell"] == 2
    assert last.manifest["trigger"] == "idle" and last.manifest["base"] == previous.id
    reused = [e for e in last.manifest["payload"] if e.get("reused")]
    assert [e["kind"] for e in reused] == ["ndarray"]  # big was linked, not written again
    assert "of it changed" in event["summary"], event["summary"]


COUNT_HASHES = """
from kernel_queue.checkpoint import payloads
digest_of = payloads.digest_of
def counted(array):
    with open({path!r}, "a") as file:
        file.write(f"{{array.nbytes}}\\n")
    return digest_of(array)
payloads.digest_of = counted
"""


@pytest.mark.parametrize(
    "beside",
    [
        pytest.param("", id="alone"),
        pytest.param(
            "import threading\n"
            "threading.Thread(target=threading.Event().wait, daemon=True).start()",
            id="beside-a-thread-of-the-users",  # as tqdm's monitor: the fork may race a write
        ),
    ],
)
def test_after_a_cell_changed_one_array_in_place_the_next_save_hashes_no_array(
    start_kernel: StartKernel, tmp_path: Path, beside: str
) -> None:
    # The save knows from the kernel's page tracking which arrays the cell wrote: the others
    # are linked without reading them, the changed one written without a look for its old file.
    if page_writes.PageWrites.open()[0] is None:
        pytest.skip(f"no page tracking here: {page_writes.PageWrites.open()[1]}")
    store, hashes = tmp_path / "store", tmp_path / "hashes"
    kernel, _, client = started(start_kernel, store)
    arrays = "import numpy as np\na, b, c = np.ones(2**18), np.ones(2**18), np.ones(2**18)"
    setup = f"exec({COUNT_HASHES.format(path=str(hashes))!r}, {{}})\n{arrays}\n{beside}"
    run_and_save(client, store, setup, what="the first cell's checkpoint")

    assert run(client, "b[0] = 5.0").reply["status"] == "ok"
    until_sync(lambda: newest_cell(store) == 2, "the second cell's checkpoint", within=WAIT)

    assert not hashes.exists(), hashes.read_text()  # before: each of a, b, c hashed
    last = committed(store)[-1]
    reused = [e for e in last.manifest["payload"] if e.get("reused")]
    assert len(reused) == 2 and last.manifest["cell"] == 2
    assert kernel.sigterm()[0] == 143
    assert value_of(start_kernel(store).client(), "(float(b[0]), float(b[1]))") == "(5.0, 1.0)"


def test_after_a_user_restart_a_kill_brings_back_a_fresh_kernel_not_the_old_cells(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    kernel, _, client = started(start_kernel, store)
    run_and_save(client, store, "x = 1", what="the cell's checkpoint")

    client.shutdown(restart=True)  # the user asked for a fresh kernel
    assert kernel.status.next()["status"] == 75
    restarted = kernel.status.next()
    assert restarted["generation"] == 1
    client.wait_for_ready(timeout=WAIT)
    os.kill(int(restarted["pid"]), signal.SIGKILL)
    assert kernel.proc.wait(timeout=WAIT) == 128 + signal.SIGKILL

    again = start_kernel(store).client()
    cell = run(again, "'x' in dir()")
    assert "restored" not in "".join(cell.streams())
    assert value_of(again, "'x' in dir()") == "False"


def test_sigterm_after_a_silent_request_changed_an_array_flushes_the_change(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    # A silent request runs no cell events, so no checkpoint follows it; the flush must not
    # trust the last checkpoint's digests then, or it would link the stale file.
    store = tmp_path / "store"
    kernel, _, client = started(start_kernel, store)
    run_and_save(
        client, store, "import numpy as np\nbig = np.zeros(2**18)", what="the cell's checkpoint"
    )
    assert execute(client, "big[0] = 5.0", silent=True)["status"] == "ok"

    assert kernel.sigterm()[0] == 143

    assert len(committed(store)) == 2  # the cell's, then the flush's
    assert value_of(start_kernel(store).client(), "float(big[0])") == "5.0"


def test_a_change_by_a_thread_left_running_after_the_last_cell_is_flushed_too(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    # No request comes after the cell: only the user's live thread says the namespace may have
    # changed since the cell's checkpoint.
    store, go, changed = tmp_path / "store", tmp_path / "go", tmp_path / "changed"
    kernel, _, client = started(start_kernel, store)
    code = (
        "import os, pathlib, threading, time, numpy as np\nbig = np.zeros(2**18)\n"
        f"def later():\n    while not os.path.exists({str(go)!r}):\n        time.sleep(0.01)\n"
        f"    big[0] = 9.0\n    pathlib.Path({str(changed)!r}).touch()\n"
        "    threading.Event().wait(120)\n"
        "worker = threading.Thread(target=later, daemon=True)\nworker.start()"
    )
    run_and_save(client, store, code, what="the cell's checkpoint")
    go.touch()
    until_sync(changed.exists, "the thread's change", within=WAIT)

    assert kernel.sigterm()[0] == 143

    assert value_of(start_kernel(store).client(), "float(big[0])") == "9.0"


def test_a_kernel_killed_after_restoring_but_before_any_request_restores_again(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    # e.g. a replacement pod replaced once more before the user's next cell reached it
    store = tmp_path / "store"
    first = start_kernel(store)
    kernel_pid(first)
    assert run(first.client(), "x = 5").reply["status"] == "ok"
    until_sync(lambda: newest_cell(store) == 1, "the cell's checkpoint", within=WAIT)
    assert first.sigterm()[0] == 143
    second = start_kernel(store)
    pid = kernel_pid(second)
    second.client()  # kernel_info only: no code ran, so the state is still the checkpoint's

    os.kill(pid, signal.SIGKILL)

    assert second.proc.wait(timeout=WAIT) == 128 + signal.SIGKILL
    third = start_kernel(store).client()
    assert "restored 1 variable" in "".join(run(third, "x").streams())
    assert value_of(third, "x") == "5"
    assert (committed(store)[-1].path / "restored").exists()  # marked by the request that ran


def test_where_a_gpu_context_forbids_fork_the_saves_pause_with_one_note(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    kernel, _, client = started(start_kernel, store)
    fake_torch = (
        "import sys, types\ntorch = types.ModuleType('torch')\n"
        "torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
        "sys.modules['torch'] = torch\nx = 1"
    )
    first = run(client, fake_torch)
    second = run(client, "x = 2")
    assert first.reply["status"] == second.reply["status"] == "ok"
    assert first.streams() == [  # under the cell after which the saves paused
        "kernel-queue: checkpoints after each cell are paused because torch has initialised CUDA "
        "(a GPU context cannot be copied by fork); a preemption still saves the variables, but if "
        "the kernel is killed without warning, what changed since its last checkpoint is lost\n"
    ]
    assert second.streams() == []  # said once
    assert committed(store) == []  # no background save, and one note only

    assert kernel.sigterm()[0] == 143  # the SIGTERM save still runs, in the kernel itself
    assert committed(store)[-1].manifest["trigger"] == "idle"
