"""Preemption end to end: a real launcher and kernel get SIGTERM, save, and a new launcher restores.

Each test drives ``python -m kernel_queue.launcher`` with ``KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR``
set, talks to the kernel with a jupyter_client BlockingKernelClient and reads the launcher's status
fd. Every wait is bounded, and the fixture kills every launcher, kernel and client it started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import types
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernel_queue import checkpoint, launcher
from kernel_queue.checkpoint.stores import RESTORED
from kernel_queue.launcher import contract
from tests.launcher.kernels import (
    Kernel,
    StartKernel,
    idle,
    iopub_until,
    run,
    shell_reply,
    streams,
)
from tests.launcher.processes import (
    KEY,
    WAIT,
    execute,
    launcher_env,
    value_of,
)
from tests.polling import until_sync

pytestmark = pytest.mark.timeout(180)

NUMBERS = 50 * 2**20 // 8
"""Elements of the 50 MB float64 array the tests save."""
STATE = f"""
import json, socket, sys
import numpy as np
x = 42
config = {{"lr": 0.1, "layers": [64, 64]}}
big = np.arange({NUMBERS}, dtype=np.float64)
square = lambda v: v * v
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
p = Point(3, 4)
sock = socket.socket()
class PortProbe:
    '''On restore: could the kernel's shell port still be bound by someone else?'''
    def __init__(self):
        self.made = True
    def __setstate__(self, state):
        import json as j, socket as s, sys as y
        self.__dict__.update(state)
        info = j.load(open(y.argv[y.argv.index("-f") + 1]))
        probe = s.socket()
        probe.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1)
        try:
            probe.bind((info["ip"], info["shell_port"]))
            self.shell_port_was_free = True
        except OSError:
            self.shell_port_was_free = False
        finally:
            probe.close()
probe = PortProbe()
"""
BLOCK_IN_C = """
import ctypes, threading, time
def block_in_c(seconds):
    '''Wait in C with the GIL released, deaf to signals (as a BLAS or CUDA call would).'''
    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # all zeros: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    until = Timespec(int(time.time()) + seconds, 0)
    # The last Python line before C; a signal waits once this thread sleeps in the futex.
    print('blocking in thread', threading.get_native_id(), flush=True)
    return libc.pthread_mutex_timedlock(mutex, ctypes.byref(until))
"""
SIGTERM_ONLY = {contract.ENV_CHECKPOINT_CONTINUOUS: "0"}
"""For the tests that count checkpoints: no checkpoint after each cell, only on SIGTERM."""
FUTEX_SYSCALLS = {"202", "98"}  # futex on x86_64 and on aarch64 (/proc/<tid>/syscall)


def wait_for_stream(client: BlockingKernelClient, msg_id: str, text: str) -> None:
    """Block until the running cell ``msg_id`` printed ``text`` (its own code is running)."""
    iopub_until(
        client, msg_id, lambda m: m["msg_type"] == "stream" and text in m["content"]["text"]
    )


def wait_in_c(client: BlockingKernelClient, msg_id: str) -> None:
    """Block until the running `block_in_c` cell's thread sleeps in its futex: a signal sent
    before (between its print and the call) would still reach Python and interrupt the cell."""
    [said] = streams(
        iopub_until(client, msg_id, lambda m: "blocking in thread" in "".join(streams([m])))
    )[-1:]
    task = Path("/proc") / said.split()[-1]

    def in_futex() -> bool:
        wchan = (task / "wchan").read_text()
        return "futex" in wchan or (task / "syscall").read_text().split()[0] in FUTEX_SYSCALLS

    until_sync(in_futex, "the cell's thread asleep in the C call")


def unparented_streams(client: BlockingKernelClient, count: int) -> list[str]:
    """The next ``count`` stream texts parented to no request (what an idle kernel says)."""
    seen: list[str] = []

    def enough(message: dict[str, Any]) -> bool:
        seen.extend(streams([message]))
        return len(seen) == count

    iopub_until(client, None, enough)
    return seen


def is_notice(text: str) -> bool:
    return "preempted" in text.lower() and "saving state" in text


def private(store: Path) -> list[str]:
    """Paths under ``store`` (itself included) that others could read: dirs not 0700, files not
    0600."""
    bad = [] if store.stat().st_mode & 0o777 == 0o700 else [str(store)]
    for path in store.rglob("*"):
        want = 0o700 if path.is_dir() else 0o600
        if path.stat().st_mode & 0o777 != want:
            bad.append(f"{path} {oct(path.stat().st_mode & 0o777)}")
    return bad


def with_client(
    start_kernel: StartKernel, store: Path, code: str = "", **env: str
) -> tuple[Kernel, BlockingKernelClient]:
    """A kernel and a client of it, once ``code`` (if any) ran without an error."""
    kernel = start_kernel(store, **env)
    client = kernel.client()
    if code:
        assert run(client, code).reply["status"] == "ok"
    return kernel, client


def preempt_idle(
    start_kernel: StartKernel, store: Path, code: str, **env: str
) -> tuple[Kernel, BlockingKernelClient]:
    """A kernel that runs ``code``, then is preempted while idle; it (after its exit) and its
    client."""
    kernel, client = with_client(start_kernel, store, code, **env)
    assert kernel.sigterm()[0] == launcher.PREEMPTED_EXIT_CODE
    return kernel, client


def test_an_idle_kernel_saves_on_sigterm_and_a_new_launcher_restores_before_any_request(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first, client = preempt_idle(start_kernel, store, STATE)

    notice, result = unparented_streams(client, 2)
    assert is_notice(notice)
    assert "; not saved: sock (socket: cannot pickle 'socket' object)" in result
    assert [e["event"] for e in first.events()] == ["started", "stopping", "exited", "checkpoint"]
    assert first.status.events[2]["status"] == launcher.PREEMPTED_EXIT_CODE  # the kernel's own
    event = first.checkpoint_event()
    assert event["consistency"] == "consistent" and event["trigger"] == "idle"
    assert event["bytes"] > NUMBERS * 8 and event["seconds"] > 0
    assert [(s["name"], s["type"]) for s in event["skipped"]] == [("sock", "socket")]
    assert {s["name"] for s in event["saved"]} == {"x", "config", "big", "square", "p", "probe"} | {
        "Point",
        "PortProbe",
    }
    assert event["summary"] == result.strip() == first.termination_log.read_text()
    assert private(store) == []

    _, client = with_client(start_kernel, store)
    cell = run(
        client,
        "print(x, config['layers'], big.shape, big.sum(), square(7), p.norm2(), "
        "type(p).__name__, probe.shell_port_was_free)",
    )

    assert cell.reply["status"] == "ok", cell.reply
    names = [m["content"]["name"] for m in cell.outputs if m["msg_type"] == "stream"]
    assert names == ["stderr", "stdout"]  # the summary comes before the cell's own output
    summary, printed = cell.streams()
    first_line, restored, not_restored = summary.splitlines()
    assert first_line.startswith("restored 8 variables (52.4 MB) from a checkpoint ")
    assert first_line.endswith(" s old; not restored: sock (socket)")
    assert restored == "Restored: Point, PortProbe, big, config, p, probe, square, x."
    assert not_restored == "sock was not saved: cannot pickle 'socket' object"
    total = float(NUMBERS * (NUMBERS - 1) // 2)
    # probe.shell_port_was_free: restored before the kernel bound its shell port.
    assert printed == f"42 [64, 64] ({NUMBERS},) {total} 49 25 Point True\n"
    assert run(client, "print('again')").streams() == ["again\n"]
    assert error_name(client, "sock") == "NameError"


RESTORE_FIRST = """
import json, sys
from kernel_queue.launcher import kernel
hooks = kernel._restore_first(kernel.os.environ, ["-f", sys.argv[1]])
names = sorted(name for name in vars(hooks.module) if not name.startswith("__"))
print(json.dumps([names, "dill" in sys.modules]))
"""


def test_a_kernel_imports_the_serializer_at_start_only_when_it_has_a_checkpoint_to_restore(
    tmp_path: Path,
) -> None:
    """dill and the payload writers cost every kernel with checkpoints about 20 ms before it
    binds its ports, which a first start, with nothing to restore, does not need."""
    connection = tmp_path / "kernel.json"
    connection.write_text(json.dumps({"key": KEY}))

    def restore_first(store: Path) -> list[Any]:
        env = launcher_env(tmp_path, **{contract.ENV_CHECKPOINT_DIR: str(store)})
        env[contract.ENV_GENERATION] = "0"
        argv = [sys.executable, "-c", RESTORE_FIRST, str(connection)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT)
        assert done.returncode == 0, done.stderr
        result: list[Any] = json.loads(done.stdout)
        return result

    assert restore_first(tmp_path / "empty") == [[], False]
    store = checkpoint.DirectoryStore(
        tmp_path / "saved", secret=checkpoint.derive_secret(KEY.encode())
    )
    saved = types.ModuleType("__main__")
    saved.x = 42
    assert checkpoint.save(saved, store).checkpoint is not None
    assert restore_first(tmp_path / "saved") == [["x"], True]


def test_a_kernel_that_restored_nothing_loads_the_serializer_once_running(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    """So that a SIGTERM's save does not spend its grace importing it."""
    _, client = with_client(start_kernel, tmp_path / "store")
    loaded = "'kernel_queue.checkpoint.snapshot' in __import__('sys').modules"
    until_sync(lambda: value_of(client, loaded) == "True", "the serializer loaded", within=WAIT)


def error_name(client: BlockingKernelClient, expression: str) -> str:
    """The exception name of evaluating ``expression`` in the kernel ("" if none)."""
    content = execute(client, "", user_expressions={"value": expression})
    return str(content["user_expressions"]["value"].get("ename", ""))


def test_a_running_python_loop_is_interrupted_and_saved_at_the_cell_boundary(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    kernel, client = with_client(start_kernel, store)
    code = (
        "total = 0\n"
        "for i in range(10**12):\n"
        "    total += i\n"
        "    if i == 1000:\n"
        "        print('looping', flush=True)\n"
    )
    msg_id = client.execute(code)
    wait_for_stream(client, msg_id, "looping")

    status, _ = kernel.sigterm()

    assert status == launcher.PREEMPTED_EXIT_CODE
    outputs = iopub_until(client, msg_id, lambda m: m["msg_type"] == "status" and idle(m))
    reply = shell_reply(client, msg_id)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "Preempted"
    assert [m["msg_type"] for m in outputs] == ["stream", "error", "stream", "status"]
    notice, result = streams(outputs)
    assert is_notice(notice)
    assert outputs[1]["content"]["ename"] == "Preempted"
    event = kernel.checkpoint_event()
    assert (event["consistency"], event["trigger"]) == ("consistent", "cell")
    assert event["summary"] == result.strip()

    client = start_kernel(store).client()
    assert value_of(client, "total > 0 and total == i * (i + 1) // 2") == "True"


def test_a_cell_in_time_sleep_is_interrupted_at_once(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    kernel, client = with_client(start_kernel, tmp_path / "store")
    msg_id = client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")
    wait_for_stream(client, msg_id, "sleeping")

    status, _ = kernel.sigterm()

    # Interrupted in the cell ("cell"), not saved beside it after the fallback delay.
    assert status == launcher.PREEMPTED_EXIT_CODE
    reply = shell_reply(client, msg_id)
    assert reply["content"]["ename"] == "Preempted"
    assert kernel.checkpoint_event()["trigger"] == "cell"


def test_a_cell_stuck_in_c_is_saved_concurrently_after_the_fallback_delay(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    code = BLOCK_IN_C + "\nrows = [list(range(10))] * 3"
    kernel, client = with_client(
        start_kernel, store, code, **{contract.ENV_CHECKPOINT_DEADLINE: "20"}
    )
    msg_id = client.execute("block_in_c(60)")
    wait_in_c(client, msg_id)

    status, seconds = kernel.sigterm()

    assert status == launcher.PREEMPTED_EXIT_CODE
    assert seconds >= 2.0  # the fallback delay is min(2 s, deadline / 4)
    notice, result = streams(
        iopub_until(
            client, msg_id, lambda m: len(streams([m])) == 1 and not is_notice(streams([m])[0])
        )
    )[-2:]
    assert is_notice(notice)
    event = kernel.checkpoint_event()
    assert (event["consistency"], event["trigger"]) == ("concurrent", "concurrent")
    assert event["summary"] == result.strip()
    saved = checkpoint.DirectoryStore(store).committed()[-1]  # after the cells' own
    assert saved.manifest["consistency"] == "concurrent"

    client = start_kernel(store).client()
    assert value_of(client, "rows[2][9]") == "9"


def test_a_kernel_killed_before_it_reports_leaves_a_checkpoint_event_saying_so(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    # A 20 s save deadline puts the concurrent save 2 s after SIGTERM, long after the SIGKILL at
    # 0.5 s (with the deadline derived from 0.5 s it started at once and, on a quiet machine,
    # finished first). No save after each cell: on a loaded machine the one after the cell that
    # defines block_in_c ended after the SIGTERM, and the kernel rightly reported it (CI).
    kernel, client = with_client(
        start_kernel,
        tmp_path / "store",
        BLOCK_IN_C,
        **{contract.ENV_STOP_TIMEOUT: "0.5", contract.ENV_CHECKPOINT_DEADLINE: "20"},
        **SIGTERM_ONLY,
    )
    msg_id = client.execute("block_in_c(60)")
    wait_in_c(client, msg_id)

    status, _ = kernel.sigterm()  # SIGKILL at 0.5 s, before the 2 s fallback save

    assert status == launcher.PREEMPTED_EXIT_CODE
    event = kernel.checkpoint_event()
    assert event["checkpoint"] is None
    assert event["error"] == "the kernel was killed without reporting a checkpoint"
    assert kernel.termination_log.read_text() == event["summary"]
    assert event["summary"] == (
        "checkpoint not saved: the kernel was killed before it finished saving; "
        "any earlier one is kept"
    )


def one_checkpoint(start_kernel: StartKernel, store: Path, code: str) -> checkpoint.Checkpoint:
    """The one checkpoint a kernel (SIGTERM only) that ran ``code`` saved, preempted idle."""
    preempt_idle(start_kernel, store, code, **SIGTERM_ONLY)
    [saved] = checkpoint.DirectoryStore(store).committed()
    return saved


def test_a_save_past_its_deadline_is_aborted_and_the_previous_checkpoint_stays(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    previous = one_checkpoint(start_kernel, store, "small = 7")
    deadline = {contract.ENV_CHECKPOINT_DEADLINE: "0.02"}
    kernel, client = with_client(start_kernel, store, **deadline, **SIGTERM_ONLY)
    assert value_of(client, "small") == "7"
    assert run(client, "import numpy as np\nhuge = np.ones(2**25)").reply["status"] == "ok"

    status, _ = kernel.sigterm()

    assert status == launcher.PREEMPTED_EXIT_CODE
    event = kernel.checkpoint_event()
    assert event["checkpoint"] is None and event["error"] == "deadline"
    assert [c.id for c in checkpoint.DirectoryStore(store).committed()] == [previous.id]
    assert sorted(p.name for p in store.iterdir()) == [previous.id]  # nothing half-written
    module = types.ModuleType("__main__")
    checkpoint.restore(module, previous)
    assert module.small == 7


def test_a_restart_neither_saves_nor_restores_and_a_final_shutdown_deletes_the_store(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    saved = one_checkpoint(start_kernel, store, "x = 1")
    kernel, client = with_client(start_kernel, store, **SIGTERM_ONLY)
    assert value_of(client, "x") == "1"  # generation 0 restores
    # Unmark it, so that only the generation guard keeps the restarts below from restoring it.
    (saved.path / RESTORED).unlink()

    client.shutdown(restart=True)
    assert kernel.status.next()["event"] == "started"
    assert kernel.status.next() == {
        "event": "exited",
        "generation": 0,
        "status": 75,
        "restart": True,
    }
    assert kernel.status.next()["generation"] == 1
    client.wait_for_ready(timeout=WAIT)  # polls IOPub, which resubscribes, as a server's loop does
    assert error_name(client, "x") == "NameError"  # generation 1 starts fresh
    assert run(client, "y = 2").reply["status"] == "ok"
    kernel.proc.send_signal(signal.SIGHUP)  # the launcher's own in-place restart
    assert kernel.status.next()["restart"] is True
    assert kernel.status.next()["generation"] == 2
    client.wait_for_ready(timeout=WAIT)
    assert error_name(client, "y") == "NameError"
    assert [c.id for c in checkpoint.DirectoryStore(store).committed()] == [saved.id]

    client.shutdown(restart=False)

    assert kernel.proc.wait(timeout=WAIT) == 0
    assert not store.exists()
    assert "checkpoint" not in [e["event"] for e in kernel.events()]


def test_a_final_shutdown_keeps_the_store_with_keep_1(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    preempt_idle(start_kernel, store, "x = 1", **SIGTERM_ONLY)
    keep = {contract.ENV_CHECKPOINT_KEEP: "1"}
    kernel, client = with_client(start_kernel, store, **keep, **SIGTERM_ONLY)

    client.shutdown(restart=False)

    assert kernel.proc.wait(timeout=WAIT) == 0
    assert len(checkpoint.DirectoryStore(store).committed()) == 1


def test_the_first_execute_waits_for_an_iopub_subscriber_before_the_summary(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    preempt_idle(start_kernel, store, "x = 1")
    kernel = start_kernel(store)
    client = kernel.client(iopub=False)  # like a server whose SUB socket has not reconnected
    client.control_channel.send(client.session.msg("kernel_info_request"))
    client.control_channel.get_msg(timeout=60)  # the kernel is up and serving
    msg_id = client.execute("print(x)")
    with pytest.raises(Empty):
        client.get_shell_msg(timeout=0.5)  # held: nobody would see the summary

    client.iopub_channel.start()

    reply = client.get_shell_msg(timeout=WAIT)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    summary, printed = streams(iopub_until(client, msg_id, lambda m: idle(m)))
    assert summary.splitlines()[1] == "Restored: x." and printed == "1\n"


def test_restored_names_are_the_users_names_and_a_second_preemption_saves_them_all(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    preempt_idle(start_kernel, store, "x = 1\nkept = [1, 2]\ngone = 'bye'")

    second, client = with_client(start_kernel, store, "y = 2\ndel gone")
    who = run(client, "%who")
    assert who.streams()[-1].split() == ["kept", "x", "y"]  # not "Interactive namespace is empty"
    assert second.sigterm()[0] == launcher.PREEMPTED_EXIT_CODE
    assert {s["name"] for s in second.checkpoint_event()["saved"]} == {"x", "kept", "y"}

    _, client = with_client(start_kernel, store)
    cell = run(client, "print(x, kept, y)")
    summary, printed = cell.streams()
    assert summary.startswith("restored 3 variables"), summary
    assert printed == "1 [1, 2] 2\n"
    assert error_name(client, "gone") == "NameError"  # a deleted name stays deleted


def drain(client: BlockingKernelClient) -> list[dict[str, Any]]:
    """Every IOPub message the client still holds or receives within a second."""
    seen: list[dict[str, Any]] = []
    while True:
        try:
            seen.append(client.get_iopub_msg(timeout=1))
        except Empty:
            return seen


def test_no_diagnostics_reach_the_notebook_during_a_save_and_a_restore(
    start_kernel: StartKernel, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    _, client = preempt_idle(start_kernel, store, "x = 1\nprint('cell output')")
    texts = streams(drain(client))
    assert len(texts) == 2, texts  # the notice and the result: nothing else, each one line
    assert is_notice(texts[0]) and texts[1].startswith("saved 1 variable (")
    assert all(text.endswith("\n") and text.count("\n") == 1 for text in texts), texts

    _, client = with_client(start_kernel, store)
    cell = run(client, "print(x)")
    assert cell.streams()[0].startswith("restored 1 variable")
    assert cell.streams()[1:] == ["1\n"]
    assert not [t for t in streams(drain(client)) if "kernel-queue" in t]
