"""The fake API server's PATCH content types: JSON patch, merge patch, strategic merge patch."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import patches
from kernel_queue_fake_cluster.apiserver.errors import ApiError

JSON = "application/json-patch+json"
MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"
GATE = "kueue.x-k8s.io/admission"
ABSENT = "<absent>"

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "kernel-0",
        "namespace": "team-a",
        "labels": {"app": "kernel", "tier": "gpu"},
        "annotations": {"note": "1"},
        "finalizers": ["kueue.x-k8s.io/managed"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u1"}],
    },
    "spec": {
        "schedulingGates": [{"name": GATE}],
        "containers": [
            {
                "name": "kernel",
                "image": "kernel:1",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                "ports": [{"containerPort": 8888, "name": "http"}],
            }
        ],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    },
    "status": {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
    },
}


def _get(obj: Any, *path: str | int) -> Any:
    """The value at `path`, or ABSENT."""
    for key in path:
        try:
            obj = obj[key]
        except (KeyError, IndexError):
            return ABSENT
    return obj


@pytest.mark.parametrize(
    ("content_type", "body", "path", "expected"),
    [
        pytest.param(
            SMP,
            {"spec": {"schedulingGates": []}},
            ("spec", "schedulingGates"),
            [{"name": GATE}],
            id="smp-empty-gate-list-leaves-the-gate",
        ),
        pytest.param(
            SMP,
            {"spec": {"schedulingGates": [{"$patch": "delete", "name": GATE}]}},
            ("spec", "schedulingGates"),
            [],
            id="smp-patch-delete-removes-the-gate",
        ),
        pytest.param(
            SMP,
            {"spec": {"schedulingGates": None}},
            ("spec", "schedulingGates"),
            ABSENT,
            id="smp-null-deletes-a-key",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"name": "kernel", "env": [{"name": "B", "value": "20"}]}]}},
            ("spec", "containers"),
            [
                {
                    "name": "kernel",
                    "image": "kernel:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "20"}],
                    "ports": [{"containerPort": 8888, "name": "http"}],
                }
            ],
            id="smp-env-merges-by-name",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"name": "kernel", "ports": [{"containerPort": 9000}]}]}},
            ("spec", "containers", 0, "ports"),
            [{"containerPort": 8888, "name": "http"}, {"containerPort": 9000}],
            id="smp-container-ports-merge-by-container-port",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}},
            ("spec", "containers", 1),
            {"name": "sidecar", "image": "s:1"},
            id="smp-new-element-appended",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"$patch": "delete", "name": "kernel"}]}},
            ("spec", "containers"),
            [],
            id="smp-patch-delete-list-element",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"$patch": "replace", "name": "kernel", "image": "k:2"}]}},
            ("spec", "containers"),
            [{"name": "kernel", "image": "k:2"}],
            id="smp-patch-replace-list-element",
        ),
        pytest.param(
            SMP,
            {"spec": {"containers": [{"$patch": "replace"}, {"name": "other", "image": "o:1"}]}},
            ("spec", "containers"),
            [{"name": "other", "image": "o:1"}],
            id="smp-patch-replace-whole-list",
        ),
        pytest.param(
            SMP,
            {"metadata": {"labels": {"$patch": "replace", "new": "1"}}},
            ("metadata", "labels"),
            {"new": "1"},
            id="smp-patch-replace-map",
        ),
        pytest.param(
            SMP,
            {"metadata": {"annotations": {"$patch": "delete"}}},
            ("metadata", "annotations"),
            ABSENT,
            id="smp-patch-delete-map",
        ),
        pytest.param(
            SMP,
            {"metadata": {"labels": {"tier": None, "queue": "q"}}},
            ("metadata", "labels"),
            {"app": "kernel", "queue": "q"},
            id="smp-labels-merge-and-null-deletes",
        ),
        pytest.param(
            SMP,
            {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}},
            ("status", "conditions"),
            [{"type": "PodScheduled", "status": "True", "reason": "SchedulingGated"}],
            id="smp-conditions-merge-by-type",
        ),
        pytest.param(
            SMP,
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            ("status", "conditions"),
            [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"},
                {"type": "Ready", "status": "False"},
            ],
            id="smp-conditions-new-type-appended",
        ),
        pytest.param(
            SMP,
            {"metadata": {"finalizers": ["b", "kueue.x-k8s.io/managed"]}},
            ("metadata", "finalizers"),
            ["kueue.x-k8s.io/managed", "b"],
            id="smp-finalizers-union",
        ),
        pytest.param(
            SMP,
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["kueue.x-k8s.io/managed"]}},
            ("metadata", "finalizers"),
            [],
            id="smp-delete-from-primitive-list",
        ),
        pytest.param(
            SMP,
            {"metadata": {"ownerReferences": [{"kind": "Pod", "name": "p", "uid": "u2"}]}},
            ("metadata", "ownerReferences"),
            [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u1"},
                {"kind": "Pod", "name": "p", "uid": "u2"},
            ],
            id="smp-owner-references-merge-by-uid",
        ),
        pytest.param(
            SMP,
            {"spec": {"tolerations": [{"key": "cpu", "operator": "Exists"}]}},
            ("spec", "tolerations"),
            [{"key": "cpu", "operator": "Exists"}],
            id="smp-tolerations-replace",
        ),
        pytest.param(
            SMP,
            {
                "spec": {
                    "$setElementOrder/schedulingGates": [],
                    "schedulingGates": [{"$patch": "delete", "name": GATE}],
                }
            },
            ("spec",),
            {
                "schedulingGates": [],
                "containers": POD["spec"]["containers"],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
            },
            id="smp-set-element-order-ignored",
        ),
        pytest.param(
            SMP,
            {"spec": {"$retainKeys": ["containers"], "restartPolicy": "Never"}},
            ("spec", "restartPolicy"),
            "Never",
            id="smp-retain-keys-ignored",
        ),
        pytest.param(
            MERGE,
            {"spec": {"schedulingGates": []}},
            ("spec", "schedulingGates"),
            [],
            id="merge-lists-replace-whole",
        ),
        pytest.param(
            MERGE,
            {"metadata": {"labels": {"app": None, "queue": "q"}}},
            ("metadata", "labels"),
            {"tier": "gpu", "queue": "q"},
            id="merge-objects-merge-and-null-deletes",
        ),
        pytest.param(
            MERGE,
            {"spec": {"containers": [{"name": "kernel", "image": "k:2"}]}},
            ("spec", "containers"),
            [{"name": "kernel", "image": "k:2"}],
            id="merge-list-of-objects-replaced",
        ),
        pytest.param(
            "Application/Merge-Patch+JSON; charset=utf-8",
            {"status": {"phase": "Running"}},
            ("status", "phase"),
            "Running",
            id="content-type-parameters-and-case-ignored",
        ),
        pytest.param(
            JSON,
            [{"op": "remove", "path": "/spec/schedulingGates/0"}],
            ("spec", "schedulingGates"),
            [],
            id="json-patch-removes-the-gate",
        ),
        pytest.param(
            JSON,
            [
                {"op": "test", "path": "/status/phase", "value": "Pending"},
                {"op": "replace", "path": "/status/phase", "value": "Running"},
            ],
            ("status", "phase"),
            "Running",
            id="json-patch-test-then-replace",
        ),
    ],
)
def test_patch(content_type: str, body: Any, path: tuple[str | int, ...], expected: Any) -> None:
    before = copy.deepcopy(POD)
    result = patches.apply(POD, body, content_type, strategic=True)
    assert _get(result, *path) == expected
    assert "$" not in repr(result)  # no directive leaks into the stored object
    assert before == POD


def test_result_shares_nothing_with_the_original() -> None:
    before = copy.deepcopy(POD)
    for content_type, body in [(SMP, {"spec": {}}), (MERGE, {}), (JSON, [])]:
        result = patches.apply(POD, body, content_type, strategic=True)
        assert result == POD
        result["metadata"]["labels"]["changed"] = "yes"
        result["spec"]["containers"][0]["env"].clear()
        assert before == POD


UNKNOWN_FORMAT = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json-patch+json, application/merge-patch+json, "
)


@pytest.mark.parametrize(
    ("content_type", "body", "strategic", "code", "reason", "message"),
    [
        pytest.param(
            SMP,
            {"spec": {}},
            False,
            415,
            "UnsupportedMediaType",
            UNKNOWN_FORMAT + "application/apply-patch+yaml",
            id="smp-on-custom-resource-415",
        ),
        pytest.param(
            "application/json",
            {"spec": {}},
            True,
            415,
            "UnsupportedMediaType",
            UNKNOWN_FORMAT + "application/strategic-merge-patch+json, application/apply-patch+yaml",
            id="unknown-media-type-415",
        ),
        pytest.param(
            "application/apply-patch+yaml",
            {"spec": {}},
            True,
            415,
            "UnsupportedMediaType",
            "server-side apply (application/apply-patch+yaml) is not supported by the fake API "
            "server",
            id="server-side-apply-415",
        ),
        pytest.param(
            JSON,
            {"op": "remove", "path": "/spec"},
            True,
            400,
            "BadRequest",
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
            id="json-patch-not-a-list-400",
        ),
        pytest.param(
            JSON,
            ["remove"],
            True,
            400,
            "BadRequest",
            "json: cannot unmarshal string into Go value of type jsonpatch.Operation",
            id="json-patch-op-not-an-object-400",
        ),
        pytest.param(
            JSON,
            [{"op": "test", "path": "/status/phase", "value": "Running"}],
            True,
            422,
            "Invalid",
            "Pending (<class 'str'>) is not equal to tested value Running (<class 'str'>)",
            id="json-patch-test-failed-422",
        ),
        pytest.param(
            JSON,
            [{"op": "remove", "path": "/spec/nodeName"}],
            True,
            422,
            "Invalid",
            "can't remove a non-existent object 'nodeName'",
            id="json-patch-missing-path-422",
        ),
        pytest.param(
            MERGE,
            [{"op": "remove", "path": "/spec"}],
            False,
            400,
            "BadRequest",
            "json: cannot unmarshal array into Go value of type map[string]interface {}",
            id="merge-patch-not-an-object-400",
        ),
        pytest.param(
            SMP,
            "spec",
            True,
            400,
            "BadRequest",
            "json: cannot unmarshal string into Go value of type map[string]interface {}",
            id="smp-not-an-object-400",
        ),
    ],
)
def test_patch_errors(
    content_type: str, body: Any, strategic: bool, code: int, reason: str, message: str
) -> None:
    before = copy.deepcopy(POD)
    with pytest.raises(ApiError) as caught:
        patches.apply(POD, body, content_type, strategic=strategic)
    assert (caught.value.code, caught.value.reason, caught.value.message) == (
        code,
        reason,
        message,
    )
    assert before == POD
