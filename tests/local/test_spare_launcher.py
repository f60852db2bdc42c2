"""The spare launcher (local backend): started ahead, it takes on the launch it is handed as a
launcher started with it would, and whatever happens to it leaves no process behind. Real
processes; the kernel here is a small Python command, not ipykernel."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends.local import launcher_process, spare_launcher
from kernel_queue.launcher import contract
from tests.conftest import KernelspecFactory, Server, launcher_pids, spare_launchers
from tests.launcher.processes import is_gone
from tests.polling import until

SCRIPT = (
    "import os, sys; print(os.getcwd()); print(os.environ.get('HANDED'));"
    " print('FROM_THE_SERVER' in os.environ); print(os.environ.get('KERNEL_ID')); sys.exit(3)"
)


def request(tmp_path: Path, **env: str) -> launcher_process.LaunchRequest:
    folder = tmp_path / "notebooks"
    folder.mkdir(exist_ok=True)
    return launcher_process.LaunchRequest(
        kernel_id="0b1f3c9a-2f6e-4c44-9d59-1a4a8c2f7e01",
        argv=(sys.executable, "-c", SCRIPT),
        env={**os.environ, "HANDED": "yes", **env},
        cwd=str(folder),
        launch=contract.Launch(grace_seconds=5, pod=False, ports=(1, 2, 3, 4, 5), key="k"),
        devices=("1",),
        log_path=tmp_path / "logs" / "kernel.log",
    )


def environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


async def run(req: launcher_process.LaunchRequest, spare: Any = None) -> tuple[int, list[Any]]:
    events: list[Any] = []
    process = launcher_process.LauncherProcess(events.append)
    code = await process.run(req, spare)
    return code, events


async def test_a_spare_takes_on_the_launch_it_is_handed(tmp_path: Path) -> None:
    req = request(tmp_path)
    (tmp_path / "logs").mkdir()
    spare = await spare_launcher.start({**os.environ, "FROM_THE_SERVER": "1"}, tmp_path / "logs")
    pid = spare.process.pid
    # nothing of the server's environment but what shapes Python's start (and ours)
    assert b"FROM_THE_SERVER=1" not in environ(pid)
    assert any(v.startswith(b"KERNEL_QUEUE_TEST_SESSION=") for v in environ(pid))
    events: list[Any] = []
    process = launcher_process.LauncherProcess(events.append)
    code = await process.run(req, spare)
    assert process.pid == pid  # the spare ran it
    assert code == 3  # the kernel's exit status, as from a launcher started for it
    assert [e["event"] for e in events] == ["started", "exited"]
    lines = req.log_path.read_text().splitlines()
    assert lines[:4] == [str(req.cwd), "yes", "False", req.kernel_id]
    assert "the kernel exited with status 3" in lines[-1]


async def test_a_spare_started_for_another_python_start_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    spare = await spare_launcher.start(dict(os.environ), tmp_path / "logs")
    try:
        assert spare.fits(dict(os.environ))
        assert spare.fits({**os.environ, "JPY_SESSION_NAME": "other.ipynb"})
        assert not spare.fits({**os.environ, "PYTHONPATH": str(tmp_path)})
        assert not spare.fits({**os.environ, "LD_PRELOAD": "libnss_wrapper.so"})
        assert not spare.fits({**os.environ, "HOME": str(tmp_path)})
    finally:
        await spare.close()
    assert is_gone(spare.process.pid) and spare.process.returncode == 0


async def test_a_spare_that_died_gives_way_to_a_launcher_started_then(tmp_path: Path) -> None:
    req = request(tmp_path)
    (tmp_path / "logs").mkdir()
    spare = await spare_launcher.start(dict(os.environ), tmp_path / "logs")
    spare.process.send_signal(signal.SIGKILL)
    await spare.process.wait()
    events: list[Any] = []
    process = launcher_process.LauncherProcess(events.append)
    assert await process.run(req, spare) == 3
    assert process.pid != spare.process.pid
    assert req.log_path.read_text().splitlines()[1] == "yes"


async def test_a_spare_stopped_as_it_is_handed_its_launch_never_leaves_the_launch_hanging(
    tmp_path: Path,
) -> None:
    """Stopped as its launch is handed over: either the hand-over fails and a launcher started
    then runs the kernel (3), or the spare took it and ended as a stopped launcher does (143)."""
    req = request(tmp_path)
    (tmp_path / "logs").mkdir()
    spare = await spare_launcher.start(dict(os.environ), tmp_path / "logs")
    await asyncio.sleep(0.05)
    spare.process.send_signal(signal.SIGTERM)
    code, _ = await run(req, spare)
    assert code in (3, 143)  # it ran the kernel, or was stopped first: never hangs
    assert spare.process.returncode is not None


def test_a_spare_handed_nothing_ends_with_0_and_a_bad_launch_with_2_and_a_sentence() -> None:
    command = [sys.executable, "-m", "kernel_queue.launcher", "--spare"]
    done = subprocess.run(command, input=b"", capture_output=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, b"")
    bad = json.dumps({"argv": "python", "env": {}, "log": "/tmp/x"}).encode()
    done = subprocess.run(command, input=bad, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.decode().strip() == (
        "[kernel-queue launcher] error: a spare launcher was handed no launch it can read "
        "('argv' is not a list of strings)"
    )
    done = subprocess.run(command, input=b"{", capture_output=True, timeout=60)
    assert done.returncode == 2 and b"no launch it can read" in done.stderr


async def test_the_keeper_prepares_one_spare_gives_it_once_and_ends_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare_launcher, "SPARE_DELAY", 0.0)
    (tmp_path / "logs").mkdir()
    keeper = spare_launcher.Keeper(logging.getLogger("test"))
    env = dict(os.environ)
    assert keeper.take(env) is None  # none prepared
    keeper.prepare(env, tmp_path / "logs")
    keeper.prepare(env, tmp_path / "logs")  # one on its way already: no second
    await until(lambda: keeper._spare is not None, "a spare")
    spare = keeper.take(env)
    assert spare is not None and keeper.take(env) is None  # given once
    keeper.prepare(env, tmp_path / "logs")
    await until(lambda: keeper._spare is not None, "the next spare")
    other = keeper._spare
    assert other is not None and other is not spare
    assert keeper.take({**env, "PYTHONPATH": str(tmp_path)}) is None  # does not fit: ended
    await until(lambda: other.process.returncode is not None, "the spare that did not fit ended")
    keeper.prepare(env, tmp_path / "logs")
    await keeper.aclose()  # one waiting to start: it never starts
    keeper.prepare(env, tmp_path / "logs")  # closed: nothing more
    await asyncio.sleep(0.2)
    assert keeper._spare is None
    await spare.close()
    assert spare.process.returncode == 0


async def test_a_spare_starting_while_the_keeper_closes_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare_launcher, "SPARE_DELAY", 0.0)
    (tmp_path / "logs").mkdir()
    started: list[spare_launcher.Spare] = []
    real_start = spare_launcher.start

    async def recorded(env: Any, folder: Path) -> spare_launcher.Spare:
        spare = await real_start(env, folder)
        started.append(spare)
        return spare

    monkeypatch.setattr(spare_launcher, "start", recorded)
    for pause in (0.0, 0.001, 0.005, 0.02, 0.05):
        keeper = spare_launcher.Keeper(logging.getLogger("test"))
        keeper.prepare(dict(os.environ), tmp_path / "logs")
        await asyncio.sleep(pause)
        await keeper.aclose()
    assert started  # some were under way when their keeper closed
    assert all(s.process.returncode is not None for s in started)


VISIBLE = "import os; (os.getcwd(), os.environ['KERNEL_ID'], os.environ['CUDA_VISIBLE_DEVICES'])"


async def test_the_next_kernel_runs_in_the_spare_started_after_the_first(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    first = await server.start(name)
    seen = {first: (await server.execute(first, VISIBLE))["data"]}
    await server.wait_for(lambda: bool(spare_launchers()), what="a spare launcher")
    (spare,) = spare_launchers()
    second = await server.start(name)
    seen[second] = (await server.execute(second, VISIBLE))["data"]
    assert launcher_pids((second,)) == {spare}
    # each kernel in the notebook folder, with its own id and GPU, as from a launcher of its own
    gpus = {ast.literal_eval(seen[k])[2] for k in (first, second)}
    assert gpus == {"0", "1"}
    for kernel in (first, second):  # started without a path: in the server's folder
        assert ast.literal_eval(seen[kernel])[:2] == (os.getcwd(), kernel)
    await server.shutdown_and_wait(first, second)
    assert launcher_pids() == set()


async def test_a_kernel_whose_python_starts_otherwise_gets_a_launcher_of_its_own(
    server: Server, kernelspec: KernelspecFactory, jp_kernel_dir: Path, tmp_path: Path
) -> None:
    first = await server.start(kernelspec(gpus=1))
    assert (await server.execute(first, "1+1"))["data"] == "2"
    await server.wait_for(lambda: bool(spare_launchers()), what="a spare launcher")
    (spare,) = spare_launchers()
    other = kernelspec("other", gpus=1)
    spec_file = jp_kernel_dir / other / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["env"] = {"PYTHONPATH": str(tmp_path)}
    spec_file.write_text(json.dumps(spec))
    second = await server.start(other)
    path = "import sys; sys.path[1]"  # after the notebook folder
    assert (await server.execute(second, path))["data"] == repr(str(tmp_path))
    assert spare not in launcher_pids((second,))
    await server.wait_for(lambda: is_gone(spare), what="the spare that did not fit ended")
    await server.shutdown_and_wait(first, second)


@pytest.mark.parametrize("local_backend_config", [{"gpus": ["0"], "spare_launcher": False}])
async def test_with_spare_launcher_off_no_launcher_waits_ahead(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    kernel = await server.start(kernelspec(gpus=1))
    assert (await server.execute(kernel, "1+1"))["data"] == "2"
    await asyncio.sleep(spare_launcher.SPARE_DELAY * 2)
    assert spare_launchers() == set()
    await server.shutdown_and_wait(kernel)
