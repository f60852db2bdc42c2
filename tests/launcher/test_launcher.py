"""The launcher as a real process: real ipykernel children, real signals, a jupyter_client client.

Every wait is bounded, and every process a test starts is killed in the fixture's teardown.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import launcher
from kernel_queue.launcher import contract
from tests.launcher.processes import (
    KEY,
    WAIT,
    LaunchFactory,
    evaluate,
    execute,
    free_ports,
    is_gone,
    launcher_env,
    reply_to,
    script,
    value_of,
    wait_until_gone,
)

pytestmark = pytest.mark.timeout(120)


def test_the_kernel_listens_on_the_given_ip_ports_and_key(launch: LaunchFactory) -> None:
    launched = launch(args=["--ip", "127.0.0.1"])
    kernel_pid = launched.started(0)
    client = launched.client()

    outputs: list[dict[str, Any]] = []
    reply = client.execute_interactive("1+1", timeout=WAIT, output_hook=outputs.append)

    assert reply["content"]["status"] == "ok"
    results = [msg["content"]["data"] for msg in outputs if msg["msg_type"] == "execute_result"]
    assert results == [{"text/plain": "2"}]
    assert value_of(client, "__import__('os').getpid()") == str(kernel_pid)
    # Its own session, so a message-mode interrupt (killpg of its group) spares the launcher.
    assert os.getsid(kernel_pid) == kernel_pid != os.getsid(launched.proc.pid)


@pytest.mark.parametrize("where", ["option", "variable"])
def test_the_key_comes_from_a_key_file_and_is_not_in_the_kernel_environment(
    launch: LaunchFactory, tmp_path: Path, where: str
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"  {KEY}\n")
    # A wrong key in KERNEL_QUEUE_LAUNCH_KEY loses to the file; with the option, a bad variable
    # for the file loses to the option.
    env = {contract.ENV_KEY: "wrong-key"}
    if where == "option":
        args = ["--key-file", str(key_file)]
        env[contract.ENV_KEY_FILE] = str(tmp_path / "missing")
    else:
        args = []
        env[contract.ENV_KEY_FILE] = str(key_file)
    launched = launch(key_in_env=False, args=args, env=env)
    launched.started(0)
    client = launched.client()  # signs with KEY: only works if the kernel uses the file's key

    environ = "sorted(k for k in __import__('os').environ if k.startswith('KERNEL_QUEUE_LAUNCH_K'))"
    assert value_of(client, environ) == "[]"


def test_a_restart_request_restarts_the_kernel_in_place(launch: LaunchFactory) -> None:
    launched = launch()
    first_pid = launched.started(0)
    client = launched.client()
    assert execute(client, "x = 42")["status"] == "ok"
    assert value_of(client, "x") == "42"

    client.shutdown(restart=True)

    exited = launched.status.next()
    assert exited == {"event": "exited", "generation": 0, "status": 75, "restart": True}
    second_pid = launched.started(1)
    assert second_pid != first_pid
    assert launched.proc.poll() is None
    wait_until_gone(first_pid, "the first kernel")
    # The same client object, still connected to the same ip and ports, talks to the new kernel.
    assert value_of(client, "__import__('os').getpid()") == str(second_pid)
    assert evaluate(client, "x")["ename"] == "NameError"


def test_a_shutdown_request_ends_the_launcher_with_0_and_removes_the_connection_file(
    launch: LaunchFactory,
) -> None:
    launched = launch()
    launched.started(0)
    client = launched.client()
    app = "__import__('ipykernel.kernelapp').kernelapp.IPKernelApp.instance()"
    connection_file = Path(ast.literal_eval(value_of(client, f"{app}.abs_connection_file")))
    assert connection_file.parent.parent == launched.tmpdir
    assert connection_file.stat().st_mode & 0o777 == 0o600
    assert connection_file.parent.stat().st_mode & 0o777 == 0o700

    client.shutdown(restart=False)

    assert launched.wait() == 0
    assert launched.status.next()["restart"] is False
    assert not connection_file.parent.exists()
    assert list(launched.tmpdir.iterdir()) == []


def test_sigterm_stops_the_kernel_and_exits_143(launch: LaunchFactory) -> None:
    launched = launch()
    kernel_pid = launched.started(0)
    launched.client()

    launched.proc.send_signal(signal.SIGTERM)

    assert launched.wait() == launcher.PREEMPTED_EXIT_CODE
    assert launched.status.next() == {"event": "stopping", "signal": signal.SIGTERM}
    assert launched.status.next()["event"] == "exited"
    assert is_gone(kernel_pid)
    assert list(launched.tmpdir.iterdir()) == []


@pytest.mark.parametrize(
    ("on_sigterm", "stop_timeout", "kernel_status"),
    [
        pytest.param("lambda *_: sys.exit(0)", "25", 0, id="kernel-exits-0"),
        pytest.param("signal.SIG_IGN", "0.5", 128 + signal.SIGKILL, id="kernel-ignores-it"),
    ],
)
def test_sigterm_exits_143_even_when_the_kernel_exits_0_or_must_be_killed(
    launch: LaunchFactory, tmp_path: Path, on_sigterm: str, stop_timeout: str, kernel_status: int
) -> None:
    kernel = script(
        tmp_path,
        "kernel.py",
        f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, {on_sigterm})
        print("ready", flush=True)
        time.sleep(60)
        """,
    )
    launched = launch(
        args=["--stop-timeout", stop_timeout],
        kernel_argv=[sys.executable, kernel],
        stdout=subprocess.PIPE,
    )
    kernel_pid = launched.started(0)
    assert launched.proc.stdout is not None
    assert select.select([launched.proc.stdout], [], [], WAIT)[0], "the kernel never got ready"
    assert launched.proc.stdout.readline() == "ready\n"

    launched.proc.send_signal(signal.SIGTERM)

    assert launched.wait() == launcher.PREEMPTED_EXIT_CODE
    assert launched.status.next()["event"] == "stopping"
    assert launched.status.next() == {
        "event": "exited",
        "generation": 0,
        "status": kernel_status,
        "restart": False,
    }
    assert is_gone(kernel_pid)


def test_sigint_to_the_launcher_interrupts_the_running_cell(launch: LaunchFactory) -> None:
    launched = launch()
    launched.started(0)
    client = launched.client()
    msg_id = client.execute("import time; print('sleeping', flush=True); time.sleep(60)")
    # Signal only once the cell's own code runs: a SIGINT that lands earlier, inside ipykernel's
    # execute_request plumbing, is swallowed there and the request never gets a reply.
    deadline = time.monotonic() + WAIT
    while True:
        msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["msg_type"] == "stream" and msg["parent_header"]["msg_id"] == msg_id:
            break

    launched.proc.send_signal(signal.SIGINT)

    reply = reply_to(client, msg_id)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # After an error ipykernel aborts requests that arrive before its "stop aborting" marker.
    for _ in range(20):
        content = execute(client, "", user_expressions={"value": "1+1"})
        if content["status"] != "aborted":
            break
    assert content["user_expressions"]["value"]["data"]["text/plain"] == "2"
    assert launched.proc.poll() is None


def test_a_kernel_that_dies_ends_the_launcher_with_its_status(launch: LaunchFactory) -> None:
    launched = launch()
    launched.started(0)
    client = launched.client()

    client.execute("import os; os._exit(3)")

    assert launched.wait() == 3
    assert launched.status.next() == {
        "event": "exited",
        "generation": 0,
        "status": 3,
        "restart": False,
    }


def test_sighup_restarts_the_kernel_in_place(launch: LaunchFactory) -> None:
    launched = launch()
    first_pid = launched.started(0)
    client = launched.client()
    assert execute(client, "x = 42")["status"] == "ok"

    launched.proc.send_signal(signal.SIGHUP)

    exited = launched.status.next()
    assert exited["event"] == "exited" and exited["restart"] is True
    second_pid = launched.started(1)
    assert second_pid != first_pid
    assert launched.proc.poll() is None
    assert value_of(client, "__import__('os').getpid()") == str(second_pid)
    assert evaluate(client, "x")["ename"] == "NameError"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param({contract.ENV_PORTS: "1,2,3,4,5"}, contract.ENV_KEY, id="no-key"),
        pytest.param(
            {contract.ENV_PORTS: "1,2", contract.ENV_KEY: KEY}, contract.ENV_PORTS, id="two-ports"
        ),
        pytest.param({contract.ENV_KEY: KEY}, contract.ENV_PORTS, id="no-ports"),
        pytest.param(
            {contract.ENV_PORTS: "1,2,3,4,5", contract.ENV_KEY_FILE: "/nonexistent"},
            contract.ENV_KEY_FILE,
            id="unreadable-key-file",
        ),
        pytest.param(
            {
                contract.ENV_PORTS: "1,2,3,4,5",
                contract.ENV_KEY: KEY,
                contract.ENV_CHECKPOINT_DIR: "/checkpoints",
                contract.ENV_CHECKPOINT_DEADLINE: "soon",
            },
            contract.ENV_CHECKPOINT_DEADLINE,
            id="bad-checkpoint-deadline",
        ),
        pytest.param(
            {
                contract.ENV_PORTS: "1,2,3,4,5",
                contract.ENV_KEY: KEY,
                contract.ENV_CHECKPOINT_DIR: "/checkpoints",
                contract.ENV_CHECKPOINT_KEEP: "maybe",
            },
            contract.ENV_CHECKPOINT_KEEP,
            id="bad-checkpoint-keep",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_variable_and_leaves_nothing_behind(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_queue.launcher"],
        env=launcher_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )

    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("[kernel-queue launcher] ")
    assert named in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_sigkill_of_the_launcher_takes_the_kernel_down(launch: LaunchFactory) -> None:
    launched = launch()
    kernel_pid = launched.started(0)
    launched.client()

    launched.proc.kill()

    assert launched.wait() == -signal.SIGKILL
    wait_until_gone(kernel_pid, "the kernel of the SIGKILLed launcher")


def can_unshare_pid_namespace() -> bool:
    try:
        probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
        return subprocess.run(probe, capture_output=True, timeout=WAIT, check=False).returncode == 0
    except OSError:
        return False


def child_pids(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def test_the_launcher_as_pid_1_stops_on_sigterm(launch: LaunchFactory, tmp_path: Path) -> None:
    if not can_unshare_pid_namespace():
        pytest.skip("needs unshare(1) and the right to create a PID namespace")
    kernel = script(tmp_path, "kernel.py", "import time\ntime.sleep(60)\n")
    launched = launch(
        wrapper=["unshare", "--pid", "--fork", "--mount-proc"],
        kernel_argv=[sys.executable, kernel],
    )
    assert launched.started(0) == 2  # the launcher is PID 1 of the new namespace
    [launcher_pid] = child_pids(launched.proc.pid)  # as seen from here

    os.kill(launcher_pid, signal.SIGTERM)  # a PID 1 without a SIGTERM handler would ignore this

    assert launched.wait() == launcher.PREEMPTED_EXIT_CODE
    assert launched.status.next()["event"] == "stopping"


def test_the_parent_death_signal_stops_the_launcher_when_its_parent_dies(
    launch: LaunchFactory, tmp_path: Path
) -> None:
    parent = script(
        tmp_path,
        "parent.py",
        """
        import subprocess, sys, time
        subprocess.Popen(sys.argv[1:], close_fds=False)
        time.sleep(60)
        """,
    )
    launched = launch(wrapper=[sys.executable, parent], env={contract.ENV_PARENT_DEATH: "1"})
    kernel_pid = launched.started(0)
    [launcher_pid] = child_pids(launched.proc.pid)
    launched.pids.append(launcher_pid)

    launched.proc.kill()

    wait_until_gone(launcher_pid, "the launcher")
    assert launched.status.next()["event"] == "stopping"
    wait_until_gone(kernel_pid, "the kernel")
    assert list(launched.tmpdir.iterdir()) == []


def test_the_launcher_imports_nothing_server_side(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        import kernel_queue.launcher
        import kernel_queue.launcher.__main__
        forbidden = ("jupyter_server", "jupyter_client", "kubernetes", "ipykernel", "zmq")
        print(sorted(
            name for name in sys.modules
            if name.split(".")[0] in forbidden or name.startswith("kernel_queue.backends")
        ))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=launcher_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )

    assert proc.stdout.strip() == "[]"


SLOW_TO_IMPORT = ("argparse", "dataclasses", "hashlib", "inspect", "pathlib")
"""Modules a backend's launch has no use for before its kernel runs: each costs the kernel's
start milliseconds (``dataclasses`` with ``inspect`` ~15)."""


def test_the_launcher_spawns_the_kernel_before_importing_what_it_need_not(tmp_path: Path) -> None:
    """What a backend's launch (no options, inputs in env) has imported when it calls Popen."""
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        from kernel_queue.launcher import __main__ as main

        def spawn(*args, **kwargs):
            print(sorted(name for name in {SLOW_TO_IMPORT!r} if name in sys.modules))
            raise OSError("not started")

        subprocess.Popen = spawn
        sys.exit(main.main(["--", "kernel"]))
        """
    )
    env = launcher_env(
        tmp_path,
        KERNEL_QUEUE_LAUNCH_PORTS=",".join(map(str, free_ports())),
        KERNEL_QUEUE_LAUNCH_KEY=KEY,
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=WAIT
    )

    assert proc.returncode == 127, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_kernel_started_without_the_launcher_refuses_to_skip_the_queue(tmp_path: Path) -> None:
    """What jupyter_client 6 (Enterprise Gateway 3) does with a provisioner kernelspec: run its
    argv directly. The kernel must not start unqueued on the GPUs."""
    connection = tmp_path / "kernel.json"
    names = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    ports = dict(zip(names, free_ports(), strict=True))
    connection.write_text(json.dumps({"ip": "127.0.0.1", "key": "k", **ports}))
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", str(connection)],
        env=launcher_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )

    assert proc.returncode == 2
    assert "It was started directly, which would skip the queue" in proc.stderr
    assert "jupyter kernel-queue install --gateway enterprise-gateway" in proc.stderr
    with socket.socket() as probe:  # nothing was bound
        probe.bind(("127.0.0.1", ports["shell_port"]))


def test_the_kernel_refuses_a_bad_checkpoint_input_rather_than_defaulting(tmp_path: Path) -> None:
    """The launcher checks these first; a kernel run by hand with a bad one must not guess."""
    connection = tmp_path / "kernel.json"
    names = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    ports = dict(zip(names, free_ports(), strict=True))
    connection.write_text(json.dumps({"ip": "127.0.0.1", "key": "k", **ports}))
    env = {
        contract.ENV_GENERATION: "0",
        contract.ENV_CHECKPOINT_DIR: str(tmp_path / "store"),
        contract.ENV_CHECKPOINT_DEADLINE: "-1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", str(connection)],
        env=launcher_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )

    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "kernel-queue: error: invalid checkpoint deadline '-1': set "
        "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE to a number of seconds > 0"
    )
    assert not (tmp_path / "store").exists()
    with socket.socket() as probe:  # nothing was bound
        probe.bind(("127.0.0.1", ports["shell_port"]))


def test_a_custom_kernel_command_gets_the_connection_file_and_nothing_else(
    launch: LaunchFactory, tmp_path: Path
) -> None:
    kernel = script(
        tmp_path,
        "print_keys.py",
        """
        import json, os, sys
        with open(sys.argv[1]) as file:
            print(sorted(json.load(file)))
        print(sorted(k for k in os.environ if k.startswith("KERNEL_QUEUE_LAUNCH_K")))
        inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
        print([fd for fd in inherited if os.path.exists(f"/proc/self/fd/{fd}")])
        """,
    )
    launched = launch(
        kernel_argv=[sys.executable, kernel, "{connection_file}"], stdout=subprocess.PIPE
    )

    stdout, _ = launched.proc.communicate(timeout=WAIT)

    assert launched.proc.returncode == 0
    keys = [
        "control_port",
        "hb_port",
        "iopub_port",
        "ip",
        "kernel_name",
        "key",
        "shell_port",
        "signature_scheme",
        "stdin_port",
        "transport",
    ]
    assert stdout.splitlines() == [str(keys), "[]", "[]"]
    assert launched.started(0) > 0
    assert launched.status.next()["status"] == 0


def test_a_kernel_with_a_non_daemon_thread_still_restarts(launch: LaunchFactory) -> None:
    launched = launch()
    launched.started(0)
    client = launched.client()
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()"
    assert execute(client, code)["status"] == "ok"

    client.shutdown(restart=True)

    assert launched.status.next(timeout=60)["status"] == launcher.RESTART_EXIT_CODE
    launched.started(1)
    assert value_of(client, "1+1") == "2"


def start_worker(tmp_path: Path, args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A launcher in worker mode with no ports and no key; its first stderr line is awaited."""
    return subprocess.Popen(
        [sys.executable, "-m", "kernel_queue.launcher", *args],
        env=launcher_env(tmp_path, **env),
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = WAIT) -> str:
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    assert ready, f"no line on stderr within {timeout} s"
    return proc.stderr.readline()


@pytest.mark.parametrize(
    ("args", "env", "signum"),
    [
        pytest.param(["--worker"], {}, signal.SIGTERM, id="flag-sigterm"),
        pytest.param([], {"KERNEL_QUEUE_LAUNCH_MODE": "worker"}, signal.SIGTERM, id="env-sigterm"),
        pytest.param(["--worker"], {}, signal.SIGINT, id="flag-sigint"),
    ],
)
def test_worker_mode_holds_until_sigterm_and_exits_143(
    tmp_path: Path, args: list[str], env: dict[str, str], signum: signal.Signals
) -> None:
    env = {
        **env,
        "KERNEL_QUEUE_RANK": "1",
        "KERNEL_QUEUE_WORLD_SIZE": "2",
        "KERNEL_QUEUE_HEAD_ADDRESS": "kq-1a2b3c4d.team-a.svc",
    }
    proc = start_worker(tmp_path, args, env)
    try:
        assert read_line(proc) == (
            "[kernel-queue launcher] worker rank 1 of 2, head at kq-1a2b3c4d.team-a.svc; "
            "waiting for SIGTERM\n"
        )
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # it holds: no kernel to wait for, no exit on its own

        proc.send_signal(signum)

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
        assert read_line(proc) == f"[kernel-queue launcher] {signum.name}: the worker stops\n"
        assert list(tmp_path.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT)


def test_worker_mode_needs_no_key_or_ports() -> None:
    from kernel_queue.launcher import settings

    for argv, environ in [(["--worker"], {}), ([], {"KERNEL_QUEUE_LAUNCH_MODE": "worker"})]:
        config = settings.parse_settings(argv, environ)
        assert config.worker
        assert (config.ports, config.key) == ((0, 0, 0, 0, 0), "")

    kernel = settings.parse_settings([], {contract.ENV_PORTS: "1,2,3,4,5", contract.ENV_KEY: KEY})
    assert not kernel.worker
    with pytest.raises(contract.SettingsError, match="KERNEL_QUEUE_LAUNCH_MODE"):
        settings.parse_settings([], {"KERNEL_QUEUE_LAUNCH_MODE": "chief"})
    with pytest.raises(contract.SettingsError, match=contract.ENV_KEY):
        settings.parse_settings(
            [], {"KERNEL_QUEUE_LAUNCH_MODE": "kernel", contract.ENV_PORTS: "1,2,3,4,5"}
        )


def test_no_options_read_as_the_parsers_defaults() -> None:
    """A launch without options (the backends') skips argparse for these same values."""
    from kernel_queue.launcher import settings

    assert vars(settings.NO_OPTIONS) == vars(settings._parser().parse_args([]))


@pytest.mark.parametrize("scheme", ["hmac-sha256", "hmac-sha512", "hmac-sha3_256"])
def test_any_hmac_of_an_available_hash_signs(scheme: str) -> None:
    from kernel_queue.launcher import settings

    environ = {contract.ENV_PORTS: "1,2,3,4,5", contract.ENV_KEY: KEY}
    config = settings.parse_settings([], {**environ, contract.ENV_SIGNATURE_SCHEME: scheme})
    assert config.signature_scheme == scheme


@pytest.mark.parametrize("scheme", ["sha256", "hmac-", "hmac-nosuchhash", "hmac-SHA256x"])
def test_a_signature_scheme_that_is_no_hmac_of_an_available_hash_is_refused(scheme: str) -> None:
    from kernel_queue.launcher import settings

    environ = {contract.ENV_PORTS: "1,2,3,4,5", contract.ENV_KEY: KEY}
    with pytest.raises(contract.SettingsError, match="invalid signature scheme"):
        settings.parse_settings([], {**environ, contract.ENV_SIGNATURE_SCHEME: scheme})


def test_a_worker_as_pid_1_stops_on_sigterm(tmp_path: Path) -> None:
    if not can_unshare_pid_namespace():
        pytest.skip("needs unshare(1) and the right to create a PID namespace")
    wrapper = ["unshare", "--pid", "--fork", "--mount-proc"]
    proc = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "kernel_queue.launcher", "--worker"],
        env=launcher_env(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "waiting for SIGTERM" in read_line(proc)
        [worker_pid] = child_pids(proc.pid)  # PID 1 inside, as seen from here

        os.kill(worker_pid, signal.SIGTERM)  # a PID 1 without a handler would ignore this

        assert proc.wait(timeout=WAIT) == launcher.PREEMPTED_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=WAIT)
