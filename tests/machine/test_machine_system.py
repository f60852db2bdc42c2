"""The machine's system service with real processes: one service run from a config file (as
the test's user, root) on a socket in a temp directory, and client processes connecting as root
and as nobody (uid 65534), told apart by SO_PEERCRED alone.

A client process imports everything as root and only then becomes nobody (setgroups, setgid,
setuid) before it connects: the interpreter here lives under /root (0700), which nobody cannot
enter, so `subprocess`'s `user=65534` could not even start it. What the service sees is the
same: a peer whose credentials say uid 65534. No test touches /run/kernel-queue: the system
socket is a temp path (`--socket`, KERNEL_QUEUE_SYSTEM_SOCKET)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue.cli import status
from kernel_queue.machine import client, config, protocol, rules
from tests.machine.system import JUPYTER, NOBODY, REPO, SETTINGS, WITHIN, Machine


@pytest.fixture
def machine_root() -> Iterator[Path]:
    # /tmp, not pytest's tmp_path: nobody must reach the socket, and its path must stay short.
    root = Path(tempfile.mkdtemp(prefix="kq-sys-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def machine(machine_root: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    """The test's machine (`async with` it: its processes end with the block)."""
    monkeypatch.setenv(client.SYSTEM_SOCKET_ENV, str(machine_root / "run" / "queue.sock"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(machine_root / "runtime"))
    monkeypatch.delenv(client.SOCKET_ENV, raising=False)
    return Machine(machine_root)


def _by_user(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["user"]: entry for entry in listing["groups"]}


async def test_the_system_socket_is_open_to_every_user_and_its_quota_is_the_configs(
    machine: Machine,
) -> None:
    async with machine:
        service = await machine.start("--idle-exit", "0.1")
        assert stat.S_IMODE(machine.socket.parent.stat().st_mode) == 0o755
        assert stat.S_IMODE(machine.socket.stat().st_mode) == 0o666
        nobody = await machine.actor(NOBODY)
        welcome = nobody.seen[0]
        # The client's own quota (GPU "7") differs: a system service's is taken as it is.
        assert (welcome["system"], welcome["quota"]["gpus"], welcome["pid"]) == (
            True,
            ["0"],
            service.pid,
        )
        await nobody.say("submit", "kq-n", "-", "1")
        assert (await nobody.expect("admit"))["devices"] == ["0"]
        nobody.process.stdin.close()  # type: ignore[union-attr]
        await nobody.process.wait()
        # A user's service would be gone 0.1 s after its last client; the system one stays.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(service.wait()), 1.0)
        assert client._answers(machine.socket)


async def test_listings_name_each_users_kernels_by_peer_credentials_and_hide_their_ids(
    machine: Machine,
) -> None:
    async with machine:
        root, nobody, position = await machine.root_holds_nobody_waits()
        assert position == 1

        seen_by_root = _by_user(await root.listing())
        assert seen_by_root["root"] | {"devices": None} == {
            **seen_by_root["root"],
            "group": "kq-root",
            "kernel_id": "kq-root-kernel-id",
            "uid": 0,
            "pid": root.process.pid,
            "state": "admitted",
            "devices": None,
        }
        assert {k: seen_by_root["nobody"][k] for k in ("group", "kernel_id", "pid", "uid")} == {
            "group": "",
            "kernel_id": "",
            "pid": 0,
            "uid": NOBODY,
        }
        assert (seen_by_root["nobody"]["state"], seen_by_root["nobody"]["position"]) == (
            "queued",
            1,
        )

        seen_by_nobody = _by_user(await nobody.listing())
        assert seen_by_nobody["nobody"]["kernel_id"] == "kq-nobody-kernel-id"
        assert seen_by_nobody["nobody"]["pid"] == nobody.process.pid
        assert (seen_by_nobody["root"]["kernel_id"], seen_by_nobody["root"]["group"]) == ("", "")
        assert seen_by_nobody["root"]["devices"] == ["0"]


async def test_with_privacy_counts_other_users_kernels_are_only_counted(machine: Machine) -> None:
    async with machine:
        root, nobody, _ = await machine.root_holds_nobody_waits(privacy="counts")

        await root.say("list")
        line = json.dumps(await root.expect("listing"))
        seen = json.loads(line)
        assert [(e["group"], e["user"]) for e in seen["groups"]] == [("kq-root", "root")]
        assert (seen["hidden"], seen["gpus"], seen["gpus_in_use"]) == ({"queued": 1}, 1, 1)
        assert "kq-nobody" not in line
        seen = await nobody.listing()
        assert [e["kernel_id"] for e in seen["groups"]] == ["kq-nobody-kernel-id"]
        assert seen["hidden"] == {"admitted": 1}


async def test_max_gpus_keeps_a_users_next_kernel_waiting_while_a_gpu_is_free(
    machine: Machine,
) -> None:
    async with machine:
        await machine.start(gpus=["0", "1"], users={"nobody": {"max_gpus": 1}})
        nobody, root = await machine.actor(NOBODY), await machine.actor(0)
        await nobody.say("submit", "kq-first", "-", "1")
        assert (await nobody.expect("admit"))["group"] == "kq-first"
        await nobody.say("submit", "kq-second", "-", "1")
        place = await nobody.expect("position")
        assert (place["group"], place["position"], place["reason"]) == (
            "kq-second",
            1,
            "nobody already holds 1 of the 1 GPU allowed at once; it starts when one of "
            "nobody's kernels stops",
        )
        await nobody.say("submit", "kq-big", "-", "2")
        refused = await nobody.expect("refused")
        assert refused["message"] == (
            "nobody may hold at most 1 GPU at once on this machine (by "
            f"{machine.root}/machine.json) and this kernel needs 2 GPUs; ask for fewer, or ask "
            "the machine's administrator to raise max_gpus"
        )
        # Another user is under no such limit: the free GPU is theirs.
        await root.say("submit", "kq-root", "-", "1")
        assert (await root.expect("admit"))["devices"] == ["1"]
        await nobody.say("release", "kq-first")
        admit = await nobody.expect("admit")
        assert (admit["group"], admit["devices"]) == ("kq-second", ["0"])


async def test_a_priority_class_the_user_may_not_use_is_refused_and_the_default_applies(
    machine: Machine,
) -> None:
    async with machine:
        rules = {"priority_classes": ["low", "normal"], "default_priority_class": "low"}
        await machine.start(users={"nobody": rules})
        nobody = await machine.actor(NOBODY)
        await nobody.say("submit", "kq-high", "high", "1")
        refused = await nobody.expect("refused")
        assert refused == {
            "type": "refused",
            "group": "kq-high",
            "message": "nobody may not use priority class 'high' on this machine (allowed: low, "
            f"normal, by {machine.root}/machine.json); pick one of those, or ask the machine's "
            "administrator to allow it",
        }
        await nobody.say("submit", "kq-urgent", "urgent", "1")
        assert (await nobody.expect("refused"))["message"] == (
            "priority class 'urgent' does not exist on this machine (its classes: high, low, "
            f"normal, in {machine.root}/machine.json); name one of those in the kernelspec's "
            "priority_class"
        )
        await nobody.say("submit", "kq-plain", "-", "1")  # it said priority 99: not trusted
        await nobody.expect("admit")
        (entry,) = (await nobody.listing())["groups"]
        assert (entry["group"], entry["priority"]) == ("kq-plain", -100)


async def test_no_user_releases_or_requeues_another_users_kernel(machine: Machine) -> None:
    async with machine:
        await machine.start()
        root, nobody = await machine.actor(0), await machine.actor(NOBODY)
        await root.say("submit", "kq-root", "-", "1")
        await root.expect("admit")
        await nobody.say("follow", "kq-root")
        await nobody.say("requeue", "kq-root")
        assert (await nobody.expect("refused"))["message"] == (
            "group kq-root is another user's; only its own server can requeue it (on this machine "
            "another user's GPUs change hands only by preemption)"
        )
        await nobody.say("release", "kq-root")
        other_root = await machine.actor(0)
        await other_root.say("follow", "kq-root")
        await other_root.say("requeue", "kq-root")
        assert (await other_root.expect("refused"))["message"] == (
            f"group kq-root belongs to another connection of root (pid {root.process.pid}); only "
            "that server can requeue it"
        )
        (entry,) = (await root.listing())["groups"]
        assert (entry["group"], entry["state"], entry["devices"]) == ("kq-root", "admitted", ["0"])


@pytest.mark.parametrize(
    ("settings", "sentence"),
    [
        pytest.param(
            {"gpu": 1},
            "unknown key 'gpu'; the keys are gpus, pretend, cpu, memory, queues, "
            "priority_classes, strategy, preemption, privacy, users (remove it or fix its "
            "spelling)",
            id="unknown-key",
        ),
        pytest.param(
            {"users": {"no-such-user-kq": {"max_gpus": 1}}},
            "users['no-such-user-kq']: there is no user 'no-such-user-kq' on this machine "
            '(`getent passwd` lists them; a group is written "group:NAME"); fix the name or '
            "remove the entry",
            id="unknown-user",
        ),
    ],
)
async def test_a_bad_config_stops_the_service_with_the_sentence(
    machine: Machine, settings: dict[str, Any], sentence: str
) -> None:
    async with machine:
        done = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "kernel_queue.machine", "--system"],
            *["--config", str(machine.config(**settings)), "--socket", str(machine.socket)],
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(done.communicate(), WITHIN)
        assert (done.returncode, err.decode()) == (
            2,
            f"kernel-queue system service: {machine.root}/machine.json: {sentence}\n",
        )
        assert not machine.socket.exists()


WHERE = Path("/etc/kq.json")


@pytest.mark.parametrize(
    ("settings", "sentence"),
    [
        pytest.param(
            {"gpus": "two"},
            'gpus is \'two\'; it must be a list of GPU ids such as ["0", "1"], or a count, '
            "each id once",
            id="gpus-type",
        ),
        pytest.param(
            {"cpu": "lots"},
            'cpu is \'lots\'; it must be a CPU quantity such as "16" or "7500m"',
            id="cpu-quantity",
        ),
        pytest.param(
            {"privacy": "none"},
            'privacy is \'none\'; it must be "names" or "counts"',
            id="privacy",
        ),
        pytest.param(
            {"strategy": "FIFO"},
            'strategy is \'FIFO\'; it must be "BestEffortFIFO" or "StrictFIFO"',
            id="strategy",
        ),
        pytest.param(
            {"users": {"group:no-such-group-kq": {}}},
            "users['group:no-such-group-kq']: there is no group 'no-such-group-kq' on this "
            "machine (`getent group` lists them); fix the name or remove the entry",
            id="unknown-group",
        ),
        pytest.param(
            {"users": {"nobody": {"max_gpu": 1}}},
            "users['nobody']: unknown key 'max_gpu'; the keys are max_gpus, priority_classes, "
            "default_priority_class (remove it or fix its spelling)",
            id="rule-key",
        ),
        pytest.param(
            {"users": {"*": {"max_gpus": "1"}}},
            "users['*'].max_gpus is '1'; it must be an integer of 0 or more",
            id="max-gpus-type",
        ),
        pytest.param(
            {"users": {"nobody": {"priority_classes": ["top"]}}},
            "users['nobody'].priority_classes names priority class 'top', which "
            "priority_classes does not define (defined: high, low, normal); define it or fix "
            "the name",
            id="unknown-class",
        ),
        pytest.param(
            {"users": {"nobody": {"priority_classes": ["low"], "default_priority_class": "high"}}},
            "users['nobody'].default_priority_class 'high' is not in its priority_classes "
            "(low); add it there or pick one of those",
            id="default-not-allowed",
        ),
    ],
)
def test_each_config_mistake_is_a_sentence_naming_the_key_and_the_fix(
    settings: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(errors.ConfigError) as refused:
        config.parse({**SETTINGS, **settings}, WHERE)
    assert str(refused.value) == f"{WHERE}: {sentence}"


def test_a_config_that_is_missing_or_no_json_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError) as missing:
        config.load(tmp_path / "machine.json")
    assert str(missing.value) == (
        f"{tmp_path}/machine.json does not exist; write one (etc/kernel-queue/machine.json in "
        "kernel-queue's sources is an example) or pass --config"
    )
    (tmp_path / "machine.json").write_text("{'gpus': 1}")
    with pytest.raises(errors.ConfigError, match=r"machine.json is not JSON: .*; fix the file"):
        config.load(tmp_path / "machine.json")


def test_the_example_config_loads_and_uses_every_key() -> None:
    path = REPO / "etc" / "kernel-queue" / "machine.json"
    example = config.load(path)
    data = json.loads(path.read_text())
    # every key but cpu and memory, whose default (the whole machine) beats any figure copied
    assert sorted(data) == sorted(set(config._TOP) - {"cpu", "memory"})
    readme = (REPO / "README.md").read_text()
    for key in config._TOP:  # and the README's table says each key's default
        assert f"\n  | `{key}` | " in readme, key
    assert {key for rule in data["users"].values() for key in rule} == set(config._RULE)
    assert example.quota.gpus == ("0", "1")
    assert example.quota.priority_classes == {"low": -100, "normal": 0, "high": 100}
    anyone = config.Identity(12345, 12345, "someone", frozenset({"someone"}))
    admin = config.Identity(1000, 1000, "admin", frozenset({"admin", "sudo", "users"}))
    assert example.rule_for(anyone) == config.Rule(1, ("low",), "low")
    assert example.rule_for(admin) == config.Rule(2, ("low", "normal", "high"), "normal")


def test_the_unit_file_runs_the_system_service_on_the_runtime_directory() -> None:
    unit = (REPO / "etc" / "systemd" / "kernel-queue.service").read_text()
    assert "-m kernel_queue.machine --system" in unit
    for line in (
        "RuntimeDirectory=kernel-queue",
        "RuntimeDirectoryMode=0755",
        "NoNewPrivileges=yes",
    ):
        assert line in unit.splitlines()


async def jupyter(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        JUPYTER, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), WITHIN)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_status_machine_lists_every_users_kernels_and_the_capacity(
    machine: Machine,
) -> None:
    async with machine:
        root, _, _ = await machine.root_holds_nobody_waits()
        code, out, err = await jupyter(dict(os.environ), "kernel-queue", "status", "--machine")
        assert code == 0, err
        lines = [line.split() for line in out.splitlines()]
        assert lines == [
            ["KERNEL", "USER", "QUEUE", "STATE", "POSITION", "GPUS", "SERVER", "PID"],
            ["kq-root-", "root", "default", "admitted", "0", str(root.process.pid)],
            ["-", "nobody", "default", "queued", "1", "needs", "1", "-"],
            ["GPUs:", "1", "of", "1", "in", "use;", "1", "waiting"],
        ]
        args = ("kernel-queue", "status", "--machine", "--json")
        code, out, err = await jupyter(dict(os.environ), *args)
        assert code == 0, err
        listing = json.loads(out)
        assert [(e["user"], e["kernel_id"]) for e in listing["groups"]] == [
            ("root", "kq-root-kernel-id"),
            ("nobody", ""),
        ]


async def test_status_machine_reads_the_users_own_service_when_no_system_one_answers(
    machine: Machine,
) -> None:
    async with machine:
        quota = protocol.Quota(("0", "1"), 1000, 2**20, ("default",), {})
        mine = await client.MachineClient.connect(quota)  # starts this user's service
        try:
            assert not mine.service.system
            await mine.submit(
                protocol.Submit("kq-mine", "abcdef12-3456", "default", 0, {"gpu": 1}, 1)
            )
            assert isinstance(await anext(aiter(mine.messages("kq-mine"))), protocol.Admit)
            code, out, err = await jupyter(dict(os.environ), "kernel-queue", "status", "--machine")
        finally:
            await mine.aclose()
            os.kill(mine.service.pid, signal.SIGTERM)
        assert code == 0, err
        assert out.splitlines()[1].split() == [
            "abcdef12",
            "root",
            "default",
            "admitted",
            "0",
            str(os.getpid()),
        ]
        assert out.splitlines()[2] == "GPUs: 1 of 2 in use; 0 waiting"


async def test_status_machine_without_a_service_says_so_and_starts_none(machine: Machine) -> None:
    async with machine:
        code, out, err = await jupyter(dict(os.environ), "kernel-queue", "status", "--machine")
        assert (code, out, err) == (0, status.NO_SERVICE + "\n", "")
        assert status.NO_SERVICE == (
            "no kernel-queue service runs on this machine; it starts with the first queued kernel "
            "of the local backend"
        )
        assert not (machine.root / "runtime" / "kernel-queue" / "queue.sock").exists()
        assert not machine.socket.exists()


def test_the_socket_is_the_variables_then_an_answering_system_ones_then_the_users(
    monkeypatch: pytest.MonkeyPatch, machine_root: Path
) -> None:
    system = machine_root / "system.sock"
    monkeypatch.setenv(client.SYSTEM_SOCKET_ENV, str(system))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(machine_root / "runtime"))
    monkeypatch.delenv(client.SOCKET_ENV, raising=False)
    users = machine_root / "runtime" / "kernel-queue" / "queue.sock"
    assert client.socket_path() == users  # no system socket
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(system))
        assert client.socket_path() == users  # a socket file nothing listens on
        listener.listen(1)
        assert client.socket_path() == system
        monkeypatch.setenv(client.SOCKET_ENV, str(machine_root / "mine.sock"))
        assert client.socket_path() == machine_root / "mine.sock"


def _long_runtime(root: Path) -> Path:
    runtime = root / ("r" * 60) / ("u" * 60)
    assert len(str(runtime / "kernel-queue" / "queue.sock")) > client.MAX_SOCKET_PATH
    return runtime


def test_a_runtime_dir_too_long_for_a_socket_gets_a_short_private_stand_in(
    monkeypatch: pytest.MonkeyPatch, machine_root: Path
) -> None:
    monkeypatch.setattr(client, "FALLBACK_ROOT", machine_root)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(_long_runtime(machine_root)))
    path = client.user_socket_path()
    stand_in = machine_root / f"kernel-queue-{os.getuid()}"
    assert path.parent.parent == stand_in and path.name == "queue.sock"
    assert len(path.parent.name) == 16 and client.user_socket_path() == path
    assert stat.S_IMODE(stand_in.stat().st_mode) == 0o700
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(_long_runtime(machine_root / "other")))
    assert client.user_socket_path().parent not in (path.parent, stand_in)


@pytest.mark.parametrize("planted", ["link", "owned"])
def test_a_stand_in_directory_someone_else_planted_is_refused(
    monkeypatch: pytest.MonkeyPatch, machine_root: Path, planted: str
) -> None:
    monkeypatch.setattr(client, "FALLBACK_ROOT", machine_root)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(_long_runtime(machine_root)))
    stand_in = machine_root / f"kernel-queue-{os.getuid()}"
    elsewhere = machine_root / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if planted == "link":
        stand_in.symlink_to(elsewhere)
        what = "a link"
    else:
        stand_in.mkdir(mode=0o700)
        os.chown(stand_in, NOBODY, NOBODY)
        what = f"owned by uid {NOBODY}"
    with pytest.raises(errors.ConfigError) as refused:
        client.user_socket_path()
    assert str(refused.value).endswith(
        f"its stand-in directory {stand_in} is {what}, not a directory of uid {os.getuid()}: "
        f"remove {stand_in}, or set KERNEL_QUEUE_SOCKET (or JUPYTER_RUNTIME_DIR) to a shorter "
        "path"
    )


async def test_a_client_with_a_long_runtime_dir_starts_its_service_on_the_stand_in(
    monkeypatch: pytest.MonkeyPatch, machine: Machine
) -> None:
    async with machine:
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(_long_runtime(machine.root)))
        quota = protocol.Quota(("0",), 1000, 2**20, ("default",), {})
        path = client.user_socket_path()
        try:
            mine = await client.MachineClient.connect(quota)
            try:
                await mine.submit(protocol.Submit("kq-long", "long", "default", 0, {"gpu": 1}, 1))
                assert await anext(aiter(mine.messages("kq-long"))) == protocol.Admit(
                    "kq-long", ("0",)
                )
                assert path.is_socket() and stat.S_IMODE(path.stat().st_mode) == 0o600
            finally:
                await mine.aclose()
                os.kill(mine.service.pid, signal.SIGTERM)
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)


async def test_max_gpus_holds_when_two_of_a_users_kernels_arrive_in_one_pass(
    machine: Machine,
) -> None:
    async with machine:
        await machine.start(gpus=["0", "1"], users={"root": {"max_gpus": 1}})
        reader, writer = await asyncio.open_unix_connection(str(machine.socket))
        quota = protocol.Quota((), 0, 0, ("default",), {})
        lines = [
            protocol.Hello(protocol.PROTOCOL, "0.1.0", os.getpid(), quota),
            protocol.Submit("kq-a", "a", "default", 0, {"gpu": 1}, 1),
            protocol.Submit("kq-b", "b", "default", 0, {"gpu": 1}, 1),
        ]
        writer.write(b"".join(protocol.encode(m) for m in lines))  # read in one turn
        try:
            answers = [protocol.decode(await reader.readline()) for _ in range(3)]
        finally:
            writer.close()
            await writer.wait_closed()
        assert isinstance(answers[0], protocol.Welcome) and answers[0].system
        assert answers[1:] == [
            protocol.Admit("kq-a", ("0",)),
            protocol.Places(
                (
                    protocol.Position(
                        "kq-b",
                        "default",
                        1,
                        1,
                        "root already holds 1 of the 1 GPU allowed at once; it starts when "
                        "one of root's kernels stops",
                    ),
                )
            ),
        ]


def test_a_system_service_sets_priority_and_bounds_grace_whatever_the_client_says() -> None:
    system = config.parse({**SETTINGS, "users": {"nobody": {"default_priority_class": "low"}}})
    nobody = config.Identity(NOBODY, NOBODY, "nobody", frozenset({"nogroup"}))
    asked = protocol.Submit("kq-n", "n", "default", 10**6, {"gpu": 1}, 10.0**9)
    assert rules.check_submit(system, nobody, asked) == protocol.Submit(
        "kq-n", "n", "default", -100, {"gpu": 1}, rules.MAX_GRACE_SECONDS, "low"
    )
    anyone = config.Identity(4242, 4242, "4242")
    assert rules.check_submit(system, anyone, asked) == protocol.Submit(
        "kq-n", "n", "default", 0, {"gpu": 1}, rules.MAX_GRACE_SECONDS, None
    )
