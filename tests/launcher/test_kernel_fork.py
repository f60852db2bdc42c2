"""The launcher forks kernel-queue's kernel where it runs on the launcher's own interpreter
(`supervisor.fork_arguments`), and the kernel it forks starts as one it executed would: the
same signal dispositions, arguments and environment, none of the launcher's files.

`KERNEL_QUEUE_LAUNCH_FORK=0` executes it as a new program; each real-process test runs both
and compares what the kernel sees.
"""

from __future__ import annotations

import ast
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import launcher
from kernel_queue.launcher import contract, origin, settings, supervisor
from tests.launcher.processes import KEY, LaunchFactory, value_of

pytestmark = pytest.mark.timeout(120)

KERNEL = [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"]


def test_only_our_kernel_on_this_very_interpreter_is_forked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    here = os.path.dirname(sys.executable)
    name = os.path.basename(sys.executable)
    launched = [sys.executable, "-m", "kernel_queue.launcher"]

    def fork(argv: list[str], path: str | None, launcher: list[str] = launched) -> Any:
        # the launcher's own start given: this test process was not started as a launcher
        return supervisor.fork_arguments(argv, path, launcher)

    assert fork(KERNEL, None) == ["-f", "{connection_file}"]
    # A bare name is looked for on the kernel's PATH, as an exec would.
    assert fork([name, *KERNEL[1:]], here) == ["-f", "{connection_file}"]
    assert fork([name, *KERNEL[1:]], str(tmp_path)) is None  # not on that PATH
    # Another interpreter (even one linked to the same binary: its prefix may differ).
    assert fork([str(bin_dir / "python"), *KERNEL[1:]], None) is None
    assert fork(["python" + "9", *KERNEL[1:]], here) is None
    # Options of the interpreter's own, another module, another program, too few words.
    assert fork([sys.executable, "-X", "dev", *KERNEL[1:]], None) is None
    assert fork([sys.executable, "-m", "ipykernel_launcher", "-f", "x"], None) is None
    assert fork(["/bin/sh", "-c", "true"], None) is None
    assert fork([sys.executable, "-m"], None) is None
    # A launcher started with options of the interpreter's own would hand them on.
    assert fork(KERNEL, None, [sys.executable, "/a/launcher.pyz", "--"]) is not None
    assert fork(KERNEL, None, [sys.executable, "-X", "dev", *launched[1:]]) is None
    assert fork(KERNEL, None, [sys.executable, "-I", *launched[1:]]) is None
    # From an archive: only the archive this launcher runs from, with `kernel`.
    monkeypatch.setattr(origin, "path", lambda: "/a/launcher.pyz")
    assert fork([sys.executable, "/a/launcher.pyz", "kernel", "-f", "x"], None) == ["-f", "x"]
    assert fork([sys.executable, "/b/launcher.pyz", "kernel", "-f", "x"], None) is None
    assert fork([sys.executable, "/a/launcher.pyz", "--", "x"], None) is None


def test_fork_is_on_unless_the_variable_says_0() -> None:
    base = {contract.ENV_PORTS: "1,2,3,4,5", contract.ENV_KEY: KEY}
    assert settings.parse_settings([], base).fork is True
    assert settings.parse_settings([], {**base, contract.ENV_FORK: ""}).fork is True
    assert settings.parse_settings([], {**base, contract.ENV_FORK: "0"}).fork is False
    with pytest.raises(contract.SettingsError, match=f"invalid {contract.ENV_FORK}='maybe'"):
        settings.parse_settings([], {**base, contract.ENV_FORK: "maybe"})


def _links(pid: int) -> set[str]:
    """What the process's open files are (pipes and sockets by inode)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


def _signals(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if line.startswith(("SigIgn", "SigCgt")))


# The launcher as a shell's background job would start it (SIGQUIT ignored), holding a file it
# inherited: an exec gives the kernel neither (a caught signal is reset, `close_fds`).
WRAPPER = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGQUIT, signal.SIG_IGN);"
    " os.set_inheritable(os.open('/dev/zero', os.O_RDONLY), True);"
    " os.execv(sys.argv[1], sys.argv[1:])",
]


def test_a_forked_kernel_starts_as_an_executed_one_would(launch: LaunchFactory) -> None:
    seen = {}
    for fork in ("1", "0"):
        launched = launch(env={contract.ENV_FORK: fork}, wrapper=WRAPPER)
        pid = launched.started(0)
        client = launched.client()
        # Before any cell: ipykernel catches SIGINT while a cell runs, and puts SIG_IGN back
        # after its reply.
        signals = _signals(pid)
        launcher_pid = launched.proc.pid
        status_pipe = os.readlink(f"/proc/{launcher_pid}/fd/{_status_fd(launcher_pid)}")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        argv = ast.literal_eval(value_of(client, "__import__('sys').argv"))
        seen[fork] = {
            "forked": b"kernel_queue.launcher.kernel" not in cmdline,
            "argv": [Path(argv[0]).name, argv[1]],
            "signals": signals,
            "key": value_of(client, f"__import__('os').environ.get({contract.ENV_KEY!r})"),
            "generation": value_of(
                client, f"__import__('os').environ[{contract.ENV_GENERATION!r}]"
            ),
            "the launcher's status pipe": status_pipe in _links(pid),
            "the launcher's inherited file": "/dev/zero" in _links(pid),
            "session": os.getsid(pid) == pid,
        }
        client.shutdown(restart=False)
        assert launched.wait() == 0

    assert seen["1"].pop("forked") and not seen["0"].pop("forked")
    assert seen["1"] == seen["0"]
    assert seen["1"]["argv"] == ["kernel.py", "-f"]
    assert seen["1"]["key"] == "None"
    assert seen["1"]["the launcher's status pipe"] is False
    assert seen["1"]["the launcher's inherited file"] is False


def _status_fd(launcher_pid: int) -> int:
    environ = Path(f"/proc/{launcher_pid}/environ").read_bytes().split(b"\0")
    prefix = f"{contract.ENV_STATUS_FD}=".encode()
    return int(next(v for v in environ if v.startswith(prefix))[len(prefix) :])


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_sigterm_as_the_kernel_is_forked_stops_it(launch: LaunchFactory, fork: str) -> None:
    """The launcher passes a SIGTERM on as soon as it has the kernel's pid. A forked kernel
    kept the launcher's handler until it put the default back, so a SIGTERM in between only
    woke the launcher's pipe; the kernel ran on and was killed after the stop timeout (a local
    kernel cancelled as it was admitted took 30 s to go, and its DELETE did not answer; seen
    failing first: 17 of 20 here). An executed kernel's pid is known only after the exec."""
    statuses = []
    for _ in range(20):
        launched = launch(env={contract.ENV_FORK: fork, contract.ENV_STOP_TIMEOUT: "5"})
        launched.started(0)
        launched.proc.send_signal(signal.SIGTERM)
        stopping, exited = launched.status.next(), launched.status.next()
        assert stopping["event"] == "stopping", launched.status.events
        assert exited["event"] == "exited", launched.status.events
        statuses.append(exited["status"])
        assert launched.wait() == launcher.PREEMPTED_EXIT_CODE
    killed = statuses.count(128 + signal.SIGKILL)
    assert killed == 0, f"{killed} of 20 kernels were killed after the stop timeout: {statuses}"
