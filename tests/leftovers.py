"""The suite leaves no process behind: a pytest plugin (named in tests/conftest.py).

Every process this session starts carries `SESSION_ENV` in its environment (it is set in the
pytest process before the first test, and children inherit it: servers' launchers and kernels,
machine queue services, node agents, control planes, hubs). When the session ends, those still
alive a few seconds later (a queue service outlives its last client by 3 s) fail the run, each
named with its pid and command line, and are killed so the next run starts clean.

Under pytest-xdist the controller holds the session's mark; each worker adds its own name to it
(`<mark>-gw1`), so what a worker's tests left is named with the worker, and the controller, which
outlives every worker, looks for all of them at its end.

Files: a test without pytest-jupyter's private Jupyter dirs (a backend driven without a server)
finds JUPYTER_RUNTIME_DIR set to its worker's folder under the session's temporary folder
(`files_root`), which the controller removes at the end, never the user's own runtime dir."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

SESSION_ENV = "KERNEL_QUEUE_TEST_SESSION"
RUNTIME_DIR_ENV = "JUPYTER_RUNTIME_DIR"
GRACE_SECONDS = 8.0
"""How long the session's processes get to end after its last test."""


def files_root() -> Path:
    """The session's temporary folder: each worker's Jupyter runtime dir is in it, removed with
    it at the end."""
    session = os.environ[SESSION_ENV].split("-gw")[0]
    return Path(tempfile.gettempdir()) / f"kernel-queue-tests-{session}"


def _marked(marker: bytes) -> dict[int, str]:
    """pid -> command line of each live process (not this one) whose environment has `marker`,
    or `marker` and a worker's name."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            mark = next((v for v in environ if v == marker or v.startswith(marker + b"-gw")), None)
            if mark is None:
                continue
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if state != "Z" and line.strip():
            worker = mark[len(marker) + 1 :].decode()
            found[int(entry.name)] = f"(worker {worker}) {line.strip()}" if worker else line.strip()
    return found


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        os.environ[SESSION_ENV] = uuid.uuid4().hex
    else:  # an xdist worker: the controller's mark (inherited), with this worker's name
        os.environ[SESSION_ENV] = f"{os.environ[SESSION_ENV].split('-gw')[0]}-{worker}"
    # Tests on pytest-jupyter's fixtures get private Jupyter dirs; the rest (a backend driven
    # without a server) would share the user's runtime dir, and its queue service, with every
    # other worker and with the user's own kernels.
    os.environ[RUNTIME_DIR_ENV] = str(files_root() / (worker or "main") / "runtime")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # the controller looks, once every worker has ended
    try:
        left = _outliving()
        if left:
            _report(session, left)
    finally:
        shutil.rmtree(files_root(), ignore_errors=True)


def _outliving() -> dict[int, str]:
    """The session's processes still alive `GRACE_SECONDS` after its end (none without /proc)."""
    marker = f"{SESSION_ENV}={os.environ.get(SESSION_ENV, '')}".encode()
    if not Path("/proc/self/environ").exists():
        return {}  # no /proc: nothing to look at
    deadline = time.monotonic() + GRACE_SECONDS
    left = _marked(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _marked(marker)
    return left


def _report(session: pytest.Session, left: dict[int, str]) -> None:
    """Kill what `left` names and fail the session, naming each."""
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"  pid {pid}: {line[:300]}" for pid, line in sorted(left.items())]
    text = (
        f"{len(left)} process(es) this test session started outlived it by {GRACE_SECONDS:g} s "
        "(killed now):\n" + "\n".join(lines)
    )
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(text)
    else:
        print(text)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
