"""Worker mode with a command (the kernelspec's ``worker_command``, after ``--``): the launcher
runs it as its child in the pod's environment, forwards SIGTERM and SIGINT to it, and always
exits 143; a command that ends on its own is logged with its status and the worker holds the
pod until SIGTERM (a pod that ended would end its group). Real launcher processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_queue import launcher
from tests.launcher.processes import WAIT, is_gone, launcher_env
from tests.launcher.test_launcher import can_unshare_pid_namespace, child_pids, read_line

GROUP = {
    "KERNEL_QUEUE_RANK": "1",
    "KERNEL_QUEUE_WORLD_SIZE": "2",
    "KERNEL_QUEUE_HEAD_ADDRESS": "head.kq-1a2b-group.team-a.svc",
}
PREFIX = "[kernel-queue launcher] "

# Writes its pid and its RANK, then waits for a signal and writes its name before exiting 0.
TRAP = """
import os, signal, sys, time
marks = sys.argv[1]
def stop(signum, frame):
    open(os.path.join(marks, "signal"), "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
open(os.path.join(marks, "started"), "w").write(f"{os.getpid()} {os.environ['RANK']}")
while True:
    time.sleep(60)
"""


def start(tmp_path: Path, command: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kernel_queue.launcher", "--worker", "--", *command],
        env=launcher_env(tmp_path / "tmp", RANK="1", **GROUP, **env),
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, timeout: float = WAIT) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.02)
    return path.read_text()


def stopped(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=WAIT)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_the_signal_reaches_the_worker_command_and_the_worker_exits_143(
    tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "tmp").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start(tmp_path, [sys.executable, "-c", TRAP, str(marks)])
    try:
        assert read_line(proc) == (
            f"{PREFIX}worker rank 1 of 2, head at head.kq-1a2b-group.team-a.svc; running "
            f"{[sys.executable, '-c', TRAP, str(marks)]} until SIGTERM\n"
        )
        pid, rank = wait_for(marks / "started").split()
        assert rank == "1"  # the pod's environment

        proc.send_signal(signum)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE  # never the child's 0
        assert wait_for(marks / "signal") == signum.name
        assert is_gone(int(pid))
        assert read_line(proc) == f"{PREFIX}{signum.name}: the worker stops\n"
        assert read_line(proc) == f"{PREFIX}the worker command exited with status 0\n"
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        stopped(proc)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        pytest.param("pass", 0, id="exit-0"),
        pytest.param("import sys; sys.exit(3)", 3, id="exit-3"),
        pytest.param("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, id="killed"),
    ],
)
def test_a_worker_command_that_ends_is_logged_and_the_worker_holds_until_sigterm(
    tmp_path: Path, code: str, status: int
) -> None:
    (tmp_path / "tmp").mkdir()
    proc = start(tmp_path, [sys.executable, "-c", code])
    try:
        assert "running" in read_line(proc)
        assert read_line(proc) == (
            f"{PREFIX}the worker command exited with status {status}; the pod stays up until "
            "SIGTERM, as a worker of its group (a pod that ended would end the group)\n"
        )
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # it holds: the group must not end

        proc.send_signal(signal.SIGTERM)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
        assert read_line(proc) == f"{PREFIX}SIGTERM: the worker stops\n"
    finally:
        stopped(proc)


def test_a_worker_command_that_cannot_start_is_logged_and_the_worker_holds(
    tmp_path: Path,
) -> None:
    (tmp_path / "tmp").mkdir()
    proc = start(tmp_path, [str(tmp_path / "no-such-program"), "--flag"])
    try:
        assert "running" in read_line(proc)
        line = read_line(proc)
        assert line.startswith(f"{PREFIX}cannot start the worker command ")
        assert "(status 127: " in line
        assert line.endswith("the pod stays up until SIGTERM, as a worker of its group\n")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)

        proc.send_signal(signal.SIGTERM)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
    finally:
        stopped(proc)


def test_a_worker_command_that_ignores_sigterm_is_killed_after_the_stop_timeout(
    tmp_path: Path,
) -> None:
    (tmp_path / "tmp").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    deaf = TRAP.replace(
        "signal.signal(signal.SIGTERM, stop)", "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    )
    proc = start(
        tmp_path, [sys.executable, "-c", deaf, str(marks)], KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT="0.5"
    )
    try:
        assert "running" in read_line(proc)
        pid, _ = wait_for(marks / "started").split()

        proc.send_signal(signal.SIGTERM)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
        assert is_gone(int(pid))
        assert not (marks / "signal").exists()
        assert read_line(proc) == f"{PREFIX}SIGTERM: the worker stops\n"
        assert read_line(proc) == (
            f"{PREFIX}the worker command did not exit 0.5 s after the signal; sending SIGKILL\n"
        )
        assert read_line(proc) == f"{PREFIX}the worker command exited with status 137\n"
    finally:
        stopped(proc)


ORPHAN = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"], start_new_session=True)
"""
"""A command that leaves an orphan of its own session, which ends 0.3 s later."""


def test_a_worker_as_pid_1_reaps_the_orphans_its_command_leaves(tmp_path: Path) -> None:
    if not can_unshare_pid_namespace():
        pytest.skip("needs unshare(1) and the right to create a PID namespace")
    (tmp_path / "tmp").mkdir()
    wrapper = ["unshare", "--pid", "--fork", "--mount-proc"]
    worker = [sys.executable, "-m", "kernel_queue.launcher", "--worker"]
    proc = subprocess.Popen(
        [*wrapper, *worker, "--", sys.executable, "-c", ORPHAN],
        env=launcher_env(tmp_path / "tmp", **GROUP),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "running" in read_line(proc)
        assert "the worker command exited with status 0" in read_line(proc)
        [worker_pid] = child_pids(proc.pid)  # PID 1 inside, as seen from here
        deadline = time.monotonic() + WAIT
        while child_pids(worker_pid):  # the orphan, running, then reaped (never a zombie)
            assert time.monotonic() < deadline, "the orphan was not reaped"
            time.sleep(0.05)

        os.kill(worker_pid, signal.SIGTERM)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
    finally:
        stopped(proc)
