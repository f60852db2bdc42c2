"""The sentences for a kernel pod that could not start the launcher, from literal pod dicts."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.kube.queueing import launch_failures

RUNC = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    'runc create failed: unable to start container process: exec: "python": executable file '
    "not found in $PATH: unknown"
)


def pod(terminated: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "kq-1-head-0"},
        "spec": {"containers": [{"name": "kernel", "image": "busybox:1.36"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "kernel", "state": {"terminated": terminated}}],
        },
    }


@pytest.mark.parametrize(
    ("terminated", "expected"),
    [
        pytest.param(
            {"exitCode": 128, "reason": "StartError", "message": RUNC},
            'image busybox:1.36 cannot run the launcher: exec: "python": executable file not '
            f"found in $PATH; {launch_failures.NEEDS}",
            id="no-python",
        ),
        pytest.param(
            {"exitCode": 3, "reason": "Error", "message": "no module named ipykernel in /x/python"},
            "image busybox:1.36 has no ipykernel: no module named ipykernel in /x/python; add "
            "ipykernel to the image (pip install ipykernel) or use an image that has it, e.g. "
            "quay.io/jupyter/base-notebook or one built from etc/images/Dockerfile",
            id="no-ipykernel",
        ),
        pytest.param(
            {"exitCode": 3, "reason": "Error"},
            "the kernel's pod kq-1-head-0 ended with exit code 3 before it was ready",
            id="crashed",
        ),
    ],
)
def test_an_ended_pod_is_told_by_what_its_image_lacks(
    terminated: dict[str, Any], expected: str
) -> None:
    assert launch_failures.ended(pod(terminated)) == expected


def test_only_a_bound_pod_whose_containers_are_being_created_counts_as_creating() -> None:
    creating = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
    }
    assert launch_failures.creating(creating)
    pulling = {
        **creating,
        "status": {
            **creating["status"],
            "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}],
        },
    }
    assert not launch_failures.creating(pulling)
    gated = {**creating, "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    assert not launch_failures.creating(gated)
