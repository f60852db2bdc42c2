"""The launch contract: the time budget from a grace period, rendering, one error policy, and
what a local launcher is given."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from kernel_queue.backends.local import launcher_process
from kernel_queue.launcher import contract
from tests.launcher.processes import launcher_env

CONTRACT_NAMES = [
    contract.ENV_IP,
    contract.ENV_PORTS,
    contract.ENV_KEY,
    contract.ENV_KEY_FILE,
    contract.ENV_TRANSPORT,
    contract.ENV_SIGNATURE_SCHEME,
    contract.ENV_STATUS_FD,
    contract.ENV_PARENT_DEATH,
    contract.ENV_STOP_TIMEOUT,
    contract.ENV_MODE,
    contract.ENV_TERMINATION_LOG,
    contract.ENV_GENERATION,
    contract.ENV_CHECKPOINT_DIR,
    contract.ENV_CHECKPOINT_DEADLINE,
    contract.ENV_CHECKPOINT_KEEP,
    contract.ENV_CHECKPOINT_CONTINUOUS,
    contract.ENV_CHECKPOINT_REPORT,
    contract.ENV_STOP_NOTE,
]


def test_every_launcher_variable_is_one_of_the_launch_family() -> None:
    assert all(name.startswith("KERNEL_QUEUE_LAUNCH_") for name in CONTRACT_NAMES)
    assert len(set(CONTRACT_NAMES)) == len(CONTRACT_NAMES)
    assert contract.ENV_CHECKPOINT_DIR == "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR"


@pytest.mark.parametrize(
    ("grace", "pod", "expected"),
    [
        pytest.param(30.0, True, (30, 25, 22), id="pod-default"),
        pytest.param(120.0, True, (120, 115, 112), id="pod-long"),
        pytest.param(30.9, True, (30, 25, 22), id="pod-fraction-dropped"),
        pytest.param(9.0, True, (9, 4, 1), id="pod-least-that-leaves-a-save"),
        pytest.param(6.0, True, (6, 1, 1), id="pod-just-above-the-margin"),
        pytest.param(3.0, True, (3, 1, 1), id="pod-below-the-margin"),
        pytest.param(0.5, True, (1, 1, 1), id="pod-under-a-second"),
        pytest.param(30.0, False, (30, 30, 27), id="local-default"),
        pytest.param(4.5, False, (4.5, 4.5, 1.5), id="local-fraction-kept"),
        pytest.param(2.0, False, (2, 2, 1), id="local-below-the-margin"),
    ],
)
def test_the_budget_follows_from_the_grace_period(
    grace: float, pod: bool, expected: tuple[float, float, float]
) -> None:
    assert contract.budget(grace, pod=pod) == contract.Budget(*expected)


def test_the_default_budget_is_a_default_pods() -> None:
    default = contract.DEFAULT_BUDGET
    assert (default.grace, default.stop_timeout, default.save_deadline) == (30, 25, 22)


@pytest.mark.parametrize(("pod", "least"), [(False, 4), (True, 9)])
def test_the_least_grace_leaves_the_least_save(pod: bool, least: int) -> None:
    assert contract.min_grace_seconds(pod=pod) == least
    assert contract.budget(least, pod=pod).save_deadline == contract.MIN_SAVE_SECONDS
    below = contract.budget(least - 0.5, pod=pod)
    assert below.stop_timeout - contract.COMMIT_MARGIN_SECONDS < contract.MIN_SAVE_SECONDS


def test_a_late_save_is_abandoned_and_the_kernel_gone_within_the_commit_margin() -> None:
    after_deadline = contract.SAVE_SLACK_SECONDS + contract.PREEMPTED_EXIT_SECONDS
    assert after_deadline <= contract.COMMIT_MARGIN_SECONDS


@pytest.mark.parametrize(
    ("deadline", "wait"),
    [
        pytest.param(22.0, 2.0, id="default"),
        pytest.param(4.0, 1.0, id="a-quarter"),
        pytest.param(0.02, 0.25, id="at-least"),
    ],
)
def test_the_cell_wait_before_a_concurrent_save(deadline: float, wait: float) -> None:
    assert contract.cell_wait(deadline) == wait


@pytest.mark.parametrize(
    ("launch", "rendered"),
    [
        pytest.param(
            contract.Launch(
                grace_seconds=30.0,
                pod=True,
                ports=(50100, 50101, 50102, 50103, 50104),
                checkpoint_dir="/checkpoints",
                keep_checkpoints=True,
                termination_log="/dev/termination-log",
            ),
            {
                "KERNEL_QUEUE_LAUNCH_PORTS": "50100,50101,50102,50103,50104",
                "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT": "25",
                "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": "/checkpoints",
                "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE": "22",
                "KERNEL_QUEUE_LAUNCH_CHECKPOINT_KEEP": "1",
                "KERNEL_QUEUE_LAUNCH_TERMINATION_LOG": "/dev/termination-log",
            },
            id="a-pod-gets-what-the-pod-cannot-reference",
        ),
        pytest.param(
            contract.Launch(
                grace_seconds=12.5,
                pod=False,
                ports=(1, 2, 3, 4, 5),
                ip="127.0.0.7",
                key="k",
                transport="tcp",
                signature_scheme="hmac-sha256",
                status_fd=9,
                parent_death=True,
                checkpoint_dir="/srv/ckpt/kid",
            ),
            {
                "KERNEL_QUEUE_LAUNCH_IP": "127.0.0.7",
                "KERNEL_QUEUE_LAUNCH_PORTS": "1,2,3,4,5",
                "KERNEL_QUEUE_LAUNCH_KEY": "k",
                "KERNEL_QUEUE_LAUNCH_TRANSPORT": "tcp",
                "KERNEL_QUEUE_LAUNCH_SIGNATURE_SCHEME": "hmac-sha256",
                "KERNEL_QUEUE_LAUNCH_STATUS_FD": "9",
                "KERNEL_QUEUE_LAUNCH_PARENT_DEATH": "1",
                "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT": "12.5",
                "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": "/srv/ckpt/kid",
                "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE": "9.5",
            },
            id="a-local-launch-gets-everything-its-stop-timeout-the-grace",
        ),
        pytest.param(
            contract.Launch(
                grace_seconds=30.0, pod=False, ports=(1, 2, 3, 4, 5), keep_checkpoints=True
            ),
            {
                "KERNEL_QUEUE_LAUNCH_PORTS": "1,2,3,4,5",
                "KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT": "30",
            },
            id="without-checkpoints-no-checkpoint-variable",
        ),
    ],
)
def test_a_launch_renders_exactly_these_variables(
    launch: contract.Launch, rendered: dict[str, str]
) -> None:
    assert contract.render(launch) == rendered


def test_a_kernels_own_env_loses_every_launch_variable() -> None:
    env = {
        "PATH": "/bin",
        "KERNEL_QUEUE_LAUNCH_MODE": "worker",
        "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": "/elsewhere",
        "KERNEL_QUEUE_RANK": "1",
    }

    assert contract.kernel_env(env) == {"PATH": "/bin", "KERNEL_QUEUE_RANK": "1"}


def test_what_is_rendered_parses_back() -> None:
    launch = contract.Launch(
        grace_seconds=60.0,
        pod=True,
        ports=(1, 2, 3, 4, 5),
        checkpoint_dir="/c",
        keep_checkpoints=True,
    )
    environ = {**contract.render(launch), contract.ENV_CHECKPOINT_REPORT: "/tmp/report.json"}

    assert contract.parse_checkpointing(environ) == contract.Checkpointing(
        directory="/c", deadline=52.0, keep=True, report="/tmp/report.json"
    )


def test_continuous_checkpoints_are_on_unless_the_launch_turns_them_off() -> None:
    base = {"grace_seconds": 30.0, "pod": False, "ports": (1, 2, 3, 4, 5)}
    on = contract.render(contract.Launch(**base, checkpoint_dir="/c"))  # type: ignore[arg-type]
    off = contract.render(
        contract.Launch(**base, checkpoint_dir="/c", continuous_checkpoints=False)  # type: ignore[arg-type]
    )
    assert contract.ENV_CHECKPOINT_CONTINUOUS not in on
    assert off[contract.ENV_CHECKPOINT_CONTINUOUS] == "0"
    assert contract.parse_checkpointing(on).continuous is True  # type: ignore[union-attr]
    assert contract.parse_checkpointing(off).continuous is False  # type: ignore[union-attr]
    no_checkpoints = contract.Launch(**base, continuous_checkpoints=False)  # type: ignore[arg-type]
    assert contract.ENV_CHECKPOINT_CONTINUOUS not in contract.render(no_checkpoints)


def test_checkpoint_inputs_default_and_are_off_without_a_directory() -> None:
    assert contract.parse_checkpointing({}) is None
    assert contract.parse_checkpointing({contract.ENV_CHECKPOINT_DEADLINE: "bad"}) is None
    assert contract.parse_checkpointing({contract.ENV_CHECKPOINT_DIR: "/c"}) == (
        contract.Checkpointing(directory="/c", deadline=22.0, keep=False, report=None)
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param(
            {contract.ENV_CHECKPOINT_DEADLINE: "soon"},
            "invalid checkpoint deadline 'soon': set KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE to "
            "a number of seconds > 0",
            id="deadline-not-a-number",
        ),
        pytest.param(
            {contract.ENV_CHECKPOINT_DEADLINE: "0"},
            "invalid checkpoint deadline '0': set KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE to "
            "a number of seconds > 0",
            id="deadline-zero",
        ),
        pytest.param(
            {contract.ENV_CHECKPOINT_DEADLINE: "inf"},
            "invalid checkpoint deadline 'inf': set KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE to "
            "a number of seconds > 0",
            id="deadline-infinite",
        ),
        pytest.param(
            {contract.ENV_CHECKPOINT_KEEP: "maybe"},
            "invalid KERNEL_QUEUE_LAUNCH_CHECKPOINT_KEEP='maybe': set it to 1 or 0",
            id="keep-not-a-flag",
        ),
        pytest.param(
            {contract.ENV_CHECKPOINT_CONTINUOUS: "often"},
            "invalid KERNEL_QUEUE_LAUNCH_CHECKPOINT_CONTINUOUS='often': set it to 1 or 0",
            id="continuous-not-a-flag",
        ),
    ],
)
def test_a_bad_checkpoint_input_is_an_error_naming_the_variable(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(contract.SettingsError) as caught:
        contract.parse_checkpointing({contract.ENV_CHECKPOINT_DIR: "/c", **environ})
    assert str(caught.value) == message


def test_the_generation_is_a_number_and_absent_outside_a_launcher() -> None:
    assert contract.parse_generation({}) is None
    assert contract.parse_generation({contract.ENV_GENERATION: "3"}) == 3
    with pytest.raises(contract.SettingsError, match="KERNEL_QUEUE_LAUNCH_GENERATION"):
        contract.parse_generation({contract.ENV_GENERATION: "-1"})


async def test_a_local_launcher_gets_the_rendered_contract_and_no_stray_launch_variable(
    tmp_path: Path,
) -> None:
    """The server's environment may hold launch variables (a server run inside a queued kernel,
    or set by hand); only what the backend rendered reaches the launcher and its kernel."""
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    stray = {
        contract.ENV_MODE: "worker",
        contract.ENV_KEY_FILE: "/nonexistent",
        contract.ENV_CHECKPOINT_DIR: "/elsewhere",
        contract.ENV_CHECKPOINT_KEEP: "1",
    }
    store = tmp_path / "store"
    request = launcher_process.LaunchRequest(
        kernel_id="k1",
        argv=(sys.executable, "-c", show),
        env=launcher_env(tmp_path, **stray),
        cwd=None,
        launch=contract.Launch(
            grace_seconds=12.0,
            pod=False,
            ports=tuple(launcher_process.free_ports("127.0.0.1", 5)),
            ip="127.0.0.1",
            key="k" * 32,
            transport="tcp",
            signature_scheme="hmac-sha256",
            checkpoint_dir=str(store),
        ),
        devices=(),
        log_path=tmp_path / "logs" / "k1.log",
    )

    code = await asyncio.wait_for(
        launcher_process.LauncherProcess(lambda event: None).run(request), 60
    )

    assert code == 0
    [line] = [x for x in request.log_path.read_text().splitlines() if x.startswith("{")]
    seen = {k: v for k, v in json.loads(line).items() if k.startswith(contract.PREFIX)}
    assert seen.pop(contract.ENV_STATUS_FD).isdigit()
    assert seen.pop(contract.ENV_CHECKPOINT_REPORT).endswith("checkpoint-report.json")
    assert seen == {  # the key stays with the launcher
        contract.ENV_IP: "127.0.0.1",
        contract.ENV_PORTS: ",".join(map(str, request.launch.ports)),
        contract.ENV_TRANSPORT: "tcp",
        contract.ENV_SIGNATURE_SCHEME: "hmac-sha256",
        contract.ENV_STOP_TIMEOUT: "12",
        contract.ENV_CHECKPOINT_DIR: str(store),
        contract.ENV_CHECKPOINT_DEADLINE: "9",
        contract.ENV_GENERATION: "0",
    }


def test_a_stop_note_is_read_once_private_and_one_line(tmp_path: Path) -> None:
    note = tmp_path / "group.log.stop"
    environ = {contract.ENV_STOP_NOTE: str(note)}
    assert contract.read_stop_note(environ) == ""  # nothing said: the notice cannot tell
    contract.write_stop_note(str(note), "preempted by higher-priority\nkernel 1a2b3c4d" + "x" * 900)
    assert oct(note.stat().st_mode & 0o777) == "0o600"
    said = contract.read_stop_note(environ)
    assert said.startswith("preempted by higher-priority kernel 1a2b3c4dxxx")
    assert len(said) <= contract.STOP_NOTE_LIMIT
    assert not note.exists()  # taken: a later SIGTERM is not told the same
    assert contract.read_stop_note({}) == ""
