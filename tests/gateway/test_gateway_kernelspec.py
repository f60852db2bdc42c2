"""One kernel.json for every gateway: `jupyter kernel-queue install --gateway enterprise-gateway`
writes both stanzas; the EG process proxy reads the provisioner's config and its own overrides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_queue import errors
from kernel_queue.gateway import CLASS_NAME, launch

JUPYTER = str(Path(sys.executable).parent / "jupyter")


def install(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(HOME=str(tmp_path), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    return subprocess.run(
        [JUPYTER, "kernel-queue", "install", "--user", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_install_for_enterprise_gateway_writes_both_stanzas(tmp_path: Path) -> None:
    done = install(
        tmp_path,
        "--name=gpu-eg",
        "--gateway=enterprise-gateway",
        "--backend=kubernetes",
        "--image=registry.example/kernel:1",
        "--queue=user-queue",
        "--gpus=1",
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "data" / "kernels" / "gpu-eg" / "kernel.json").read_text())
    assert spec["metadata"]["process_proxy"] == {"class_name": CLASS_NAME}
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "kernel-queue",
        "config": {
            "backend": "kubernetes",
            "queue": "user-queue",
            "gpus": 1,
            "image": "registry.example/kernel:1",
        },
    }
    assert spec["interrupt_mode"] == "message"


def test_install_rejects_an_unknown_gateway_and_writes_nothing(tmp_path: Path) -> None:
    done = install(tmp_path, "--gateway=jupyterhub")
    assert done.returncode == 2
    assert "--gateway must be one of enterprise-gateway" in done.stderr
    assert not (tmp_path / "data" / "kernels").exists()


def kernelspec(shared: dict[str, object]) -> SimpleNamespace:
    return SimpleNamespace(
        display_name="GPU",
        metadata={"kernel_provisioner": {"provisioner_name": "kernel-queue", "config": shared}},
    )


def test_the_proxy_reads_the_provisioner_config_and_its_own_overrides() -> None:
    options = launch.kernel_options(
        kernelspec({"backend": "kubernetes", "queue": "user-queue", "gpus": 1}),
        {"gpus": 2, "authorized_users": "alice"},  # EG's own key is EG's business
        parent=None,
        kernel_id="k1",
    )
    assert (options.backend, options.queue, options.gpus) == ("kubernetes", "user-queue", 2)
    assert options.kernel_id == "k1"


@pytest.mark.parametrize(
    ("shared", "message"),
    [
        pytest.param(
            {"gpu": 1},
            "kernelspec 'GPU': unknown config key `gpu` (did you mean `gpus`?); the keys are "
            "admission_timeout, backend, checkpoint,",
            id="unknown-key",
        ),
        pytest.param({"gpus": "1"}, "must be a whole number such as 1", id="wrong-type"),
        pytest.param({"gpus": True}, "not true (a boolean)", id="boolean"),
        pytest.param(
            {"kernel_spec": "x"}, "unknown config key `kernel_spec`", id="not-an-option-trait"
        ),
    ],
)
def test_bad_kernelspec_config_is_a_config_error_naming_the_key(
    shared: dict[str, object], message: str
) -> None:
    with pytest.raises(errors.ConfigError, match="kernelspec 'GPU'") as caught:
        launch.kernel_options(kernelspec(shared), None, parent=None, kernel_id="k1")
    assert message in str(caught.value)


def test_an_unknown_key_of_the_proxy_stanza_is_refused_like_the_provisioners() -> None:
    with pytest.raises(errors.ConfigError) as caught:
        launch.kernel_options(kernelspec({}), {"queu": "gpu"}, parent=None, kernel_id="k1")
    assert str(caught.value).startswith(
        "kernelspec 'GPU': unknown config key `queu` (did you mean `queue`?); the keys are "
    )
    assert str(caught.value).endswith(
        "(in metadata.kernel_provisioner.config or metadata.process_proxy.config)"
    )


def test_a_kernelspec_cannot_grant_itself_pod_policy_exceptions() -> None:
    shared = {"allowed_pod_template_exceptions": ["privileged"]}
    with pytest.raises(errors.ConfigError) as caught:
        launch.kernel_options(kernelspec(shared), None, parent=None, kernel_id="k1")
    assert str(caught.value).endswith(
        "Pod policy exceptions are a server setting, c.PodTemplatePolicy.allowed_exceptions in "
        "the server's config: a kernelspec cannot grant them to itself"
    )


@pytest.mark.parametrize(
    ("admission_timeout", "env", "expected"),
    [
        pytest.param(0, {}, launch.QueueDeadline(0, False), id="forever"),
        pytest.param(
            0, {"KERNEL_LAUNCH_TIMEOUT": "118"}, launch.QueueDeadline(118, True), id="client"
        ),
        pytest.param(
            60, {"KERNEL_LAUNCH_TIMEOUT": "118"}, launch.QueueDeadline(60, False), id="spec"
        ),
        pytest.param(
            0, {"KERNEL_LAUNCH_TIMEOUT": "soon"}, launch.QueueDeadline(0, False), id="bad"
        ),
    ],
)
def test_the_queue_wait_is_bounded_by_admission_timeout_else_the_clients_patience(
    admission_timeout: float, env: dict[str, str], expected: launch.QueueDeadline
) -> None:
    assert launch.queue_deadline(admission_timeout, env) == expected


def test_failed_launches_become_http_replies_with_the_whole_message() -> None:
    status, reason, message = launch.reply(errors.LaunchFailed("pod failed; its log:\nboom"))
    assert (status, reason, message) == (500, "pod failed; its log:", "pod failed; its log:\nboom")
    assert launch.reply(errors.AdmissionTimeout("waited"))[0] == 503
