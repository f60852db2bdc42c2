"""What the server's log says about queued kernels, on a real server: shutting down a waiting
kernel is an ordinary cancel (INFO, no traceback, no ERROR); a kernel that cannot start is one
ERROR line with its sentence (the traceback only at DEBUG), also when JupyterLab then connects
to it; no empty "kernel cc9ee094: " line."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from kernel_queue.server import kernelmanager
from tests import cancel_race
from tests.conftest import (
    KernelspecFactory,
    Server,
    errors_in,
    launcher_pids,
    tracebacks_in,
)

EMPTY = re.compile(r"^kernel [0-9a-f]{8}: *$")


async def test_shutting_down_a_waiting_kernel_logs_info_without_a_traceback(
    server: Server, kernelspec: KernelspecFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    name = kernelspec(gpus=2)
    holder = await server.start(name)
    assert (await server.execute(holder, "1+1"))["data"] == "2"
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")
    await server.shutdown_and_wait(waiting)

    said = [r for r in caplog.records if "shut down while waiting" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said), said
    assert errors_in(caplog) == []
    assert tracebacks_in(caplog) == []
    assert [m for r in caplog.records if EMPTY.match(m := r.getMessage())] == []
    await server.shutdown_and_wait(holder)


async def test_a_kernel_that_cannot_start_is_one_error_line_with_its_sentence(
    server: Server, kernelspec: KernelspecFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kernel = await server.start(kernelspec(gpus=3))
    model = await server.wait_reason(kernel, "could never start")
    assert model["execution_state"] == "dead"
    # JupyterLab connects to the kernel it opened: told dead, nothing more in the log.
    ws = await server.ws_fetch("api", "kernels", kernel, "channels")
    try:
        async with asyncio.timeout(30):
            while await ws.read_message() is not None:
                pass
    finally:
        ws.close()

    sentence = model["reason"]
    assert errors_in(caplog) == [f"kernel start failed: {sentence}"]
    assert tracebacks_in(caplog) == []
    debug = [r for r in caplog.records if r.exc_info and r.levelno == logging.DEBUG]
    assert debug, "the traceback at DEBUG"
    assert [m for r in caplog.records if EMPTY.match(m := r.getMessage())] == []
    await server.shutdown(kernel)


async def test_a_shutdown_that_goes_on_before_the_cancelled_start_ends_logs_no_error(
    server: Server,
    kernelspec: KernelspecFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    token: str,
) -> None:
    """A cancel slower than the shutdown's wait for it (a slow API server, a launcher slow to
    stop): jupyter's shutdown then goes on while the start still ends. It cancelled the start's
    future, so the start's own end logged asyncio's "invalid state" ERROR and a shutdown of a
    kernel that never started (seen failing first: 7 "invalid state" ERRORs in 15 starts)."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(kernelmanager, "_CANCEL_WAIT_SECONDS", 0.0)  # it never waits
    name = kernelspec(gpus=1)

    outcomes = await cancel_race.race(url, token, name, (*cancel_race.OFFSETS, 0.2), 3)

    assert [str(o) for o in outcomes if o.status != 204] == []
    await server.wait_gone(*(o.kernel_id for o in outcomes))
    assert not await server.kernel_ids()
    await server.wait_for(lambda: not launcher_pids(), what="no launcher left")
    assert errors_in(caplog) == []
    assert tracebacks_in(caplog) == []
