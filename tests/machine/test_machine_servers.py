"""One queue per machine: real Jupyter servers and an nbconvert run of one user share one
pretend GPU through the machine's queue service (issue 17's tests)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import polling
from tests.machine_servers import Machine, ServerProcess


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    machine = Machine(tmp_path)
    try:
        yield machine
    finally:
        machine.close()


def processes_of(kernel_id: str) -> list[int]:
    """Processes whose command line names `kernel_id` (its launcher and kernel)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if kernel_id.encode() in cmdline:
                found.append(int(entry.name))
    return found


async def running(server: ServerProcess, kernel_id: str) -> None:
    assert (await server.execute(kernel_id, "import os; os.environ['CUDA_VISIBLE_DEVICES']"))[
        "data"
    ] == "'0'"


async def test_two_servers_and_nbconvert_take_turns_on_one_gpu_in_one_order(
    machine: Machine,
) -> None:
    first, second = await machine.server(), await machine.server()
    holder = await first.start("low")
    await running(first, holder)
    waiting = await second.start("low")
    assert await second.reason(waiting, "position 1 of 1") == (
        "queued in 'gpu', position 1 of 1, needs 1 GPU"
    )
    notebook = machine.notebook(
        "batch.ipynb", "import os\nprint(os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    batch = await machine.nbconvert(notebook, "low")
    # The batch run queues behind the second server's kernel, so that one is now 1 of 2.
    await second.reason(waiting, "position 1 of 2")
    assert await first.state(holder) == "running"
    await first.shutdown(holder)
    await running(second, waiting)
    assert batch.returncode is None  # still waiting: the GPU is the second server's
    await second.shutdown(waiting)
    async with asyncio.timeout(polling.WITHIN):
        _, errors = await batch.communicate()
    assert batch.returncode == 0, errors.decode()[-3000:]
    executed = json.loads((machine.root / "batch-out.ipynb").read_text())
    assert "".join(executed["cells"][0]["outputs"][0]["text"]) == "0\n"


async def test_a_high_priority_kernel_in_one_server_preempts_a_low_one_in_another(
    machine: Machine,
) -> None:
    first, second = await machine.server(), await machine.server()
    low = await first.start("low")
    assert (await first.execute(low, "x = 41; x + 1"))["data"] == "42"
    high = await second.start("high")
    await running(second, high)
    reason = await first.reason(low, "requeued")
    assert reason.startswith("preempted by higher-priority kernel") or "requeued in 'gpu'" in reason
    await second.shutdown(high)
    back = await first.execute(low, "x + 1")
    assert back["data"] == "42", back  # restored from the checkpoint it wrote when preempted


async def test_a_server_killed_frees_its_gpu_and_leaves_no_launcher(machine: Machine) -> None:
    first, second = await machine.server(), await machine.server()
    holder = await first.start("low")
    await running(first, holder)
    waiting = await second.start("low")
    await second.reason(waiting, "position 1 of 1")
    first.kill()
    await running(second, waiting)  # its lease ended with the killed server's connection

    def gone() -> bool:
        return not processes_of(holder)

    await polling.until(gone, "the killed server's launcher and kernel gone", within=30)


async def test_the_service_starts_on_first_use_and_exits_after_the_last_client(
    machine: Machine,
) -> None:
    server = await machine.server()
    assert machine.service_pid() is None  # a server alone starts nothing
    kernel = await server.start("low")
    await running(server, kernel)
    pid = machine.service_pid()
    assert pid is not None
    os.kill(pid, 0)
    server.stop()

    def exited() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return not machine.socket.exists()
        return False

    await polling.until(exited, "the service gone after its last client", within=30)


async def test_a_service_of_another_protocol_is_named_in_the_kernel_reason(
    machine: Machine,
) -> None:
    machine.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = await asyncio.start_unix_server(_answer_as_protocol_0, path=str(machine.socket))
    try:
        server = await machine.server()
        kernel = await server.start("low")
        reason = await server.reason(kernel, "speaks another protocol")
        assert "version 0.0.1, protocol 0" in reason
        assert "restart this server with version 0.0.1" in reason
    finally:
        old.close()


async def _answer_as_protocol_0(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    welcome = {"type": "welcome", "version": "0.0.1", "pid": os.getpid(), "protocol": 0}
    writer.write(json.dumps(welcome).encode() + b"\n")
    await writer.drain()
    writer.close()


async def test_each_server_lists_the_whole_machine_queue_marking_its_own_kernels(
    machine: Machine,
) -> None:
    first, second = await machine.server(), await machine.server()
    assert (await first.request("GET", "api/kernel-queue/machine"))["service"] is None
    holder = await first.start("low")
    await running(first, holder)
    waiting = await second.start("low")
    await second.reason(waiting, "position 1 of 1")
    for server, mine, theirs in ((first, holder, waiting), (second, waiting, holder)):
        listing = await server.request("GET", "api/kernel-queue/machine")
        assert listing["gpus"] == ["0"]
        assert listing["service"]["pid"] == machine.service_pid()
        kernels = {k["kernel_id"]: k for k in listing["kernels"]}
        assert set(kernels) == {holder, waiting}
        assert (kernels[mine]["here"], kernels[theirs]["here"]) == (True, False)
        assert (kernels[holder]["state"], kernels[holder]["devices"]) == ("admitted", ["0"])
        assert (kernels[waiting]["state"], kernels[waiting]["position"]) == ("queued", 1)
