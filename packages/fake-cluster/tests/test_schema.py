"""Pruning, defaulting and validation of custom resources against their structural schemas:
the real Kueue CRDs (from ../shared, next to the repository) and small handmade schemas."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
import yaml

from kernel_queue_fake_cluster.apiserver.schema import prune_default_validate
from prerequisites import KUEUE_DATA, skip_unless_ci

QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Q0 = "spec.resourceGroups[0].flavors[0].resources[0]"


@pytest.fixture(scope="module")
def kueue_schemas() -> dict[str, dict[str, Any]]:
    """Kind -> the v1beta2 openAPIV3Schema of each Kueue CRD."""
    crds = KUEUE_DATA / "crds"
    if not crds.is_dir():
        message = f"the Kueue CRDs are not at {crds} (a checkout of the shared data)"
        skip_unless_ci(message)
    schemas = {}
    for path in sorted(crds.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return schemas


CLUSTER_QUEUE: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ClusterQueue",
    "metadata": {"name": "cluster-queue"},
    "spec": {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [
                    {
                        "name": "default-flavor",
                        "resources": [
                            {"name": "cpu", "nominalQuota": 9},
                            {"name": "memory", "nominalQuota": "36Gi"},
                        ],
                    }
                ],
            }
        ],
    },
}

T = "2026-08-22T10:00:00Z"
# An admitted one-pod GPU kernel group, as Kueue writes it (conditions carry the
# lastTransitionTime Kueue always sets; the owner's uid filled in).
WORKLOAD: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {
        "name": "kernel-7f3c2a",
        "namespace": "team-a",
        "annotations": {"kueue.x-k8s.io/is-group-workload": "true"},
        "finalizers": ["kueue.x-k8s.io/resource-in-use"],
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "kernel-7f3c2a-0", "uid": "0e2c-41"}
        ],
    },
    "spec": {
        "active": True,
        "queueName": "user-queue",
        "priority": 1000,
        "priorityClassRef": {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": "interactive",
        },
        "podSets": [
            {
                "name": "3c9d1f0a",
                "count": 1,
                "topologyRequest": {"podIndexLabel": "kueue.x-k8s.io/pod-group-pod-index"},
                "template": {
                    "spec": {
                        "schedulingGates": [
                            {"name": "kueue.x-k8s.io/admission"},
                            {"name": "kueue.x-k8s.io/topology"},
                        ],
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 120,
                        "containers": [
                            {
                                "name": "kernel",
                                "image": "registry.example/kernel:1.0",
                                "resources": {
                                    "requests": {
                                        "cpu": "4",
                                        "memory": "16Gi",
                                        "nvidia.com/gpu": "1",
                                    },
                                    "limits": {"nvidia.com/gpu": "1"},
                                },
                            }
                        ],
                    }
                },
            }
        ],
    },
    "status": {
        "admission": {
            "clusterQueue": "gpu-cq",
            "podSetAssignments": [
                {
                    "name": "3c9d1f0a",
                    "count": 1,
                    "flavors": {
                        "cpu": "a100-nodes",
                        "memory": "a100-nodes",
                        "nvidia.com/gpu": "a100-nodes",
                    },
                    "resourceUsage": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                }
            ],
        },
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": "Quota reserved in ClusterQueue gpu-cq",
                "lastTransitionTime": T,
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "The workload is admitted",
                "lastTransitionTime": T,
            },
            {
                "type": "PodsReady",
                "status": "True",
                "reason": "Started",
                "message": "All pods reached readiness and the workload is running",
                "lastTransitionTime": T,
            },
        ],
    },
}
# The same Workload after preemption: no admission, eviction statistics.
PREEMPTED_STATUS: dict[str, Any] = {
    "admission": None,
    "accumulatedPastExecutionTimeSeconds": 5400,
    "schedulingStats": {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]},
    "conditions": [
        {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "Preempted to accommodate a workload",
            "lastTransitionTime": T,
        },
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Pending",
            "message": "Preempted to accommodate a workload",
            "lastTransitionTime": T,
        },
    ],
}


def test_cluster_queue_is_valid_and_defaulted(kueue_schemas: dict[str, Any]) -> None:
    result, errors = prune_default_validate(CLUSTER_QUEUE, kueue_schemas["ClusterQueue"])
    assert errors == []
    assert result["spec"] == {
        **CLUSTER_QUEUE["spec"],
        "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
        "preemption": {
            "borrowWithinCohort": {"policy": "Never"},
            "reclaimWithinCohort": "Never",
            "withinClusterQueue": "Never",
        },
        "queueingStrategy": "BestEffortFIFO",
        "stopPolicy": "None",
    }
    assert result["metadata"] == {"name": "cluster-queue"}
    assert (result["apiVersion"], result["kind"]) == ("kueue.x-k8s.io/v1beta2", "ClusterQueue")


def test_unknown_fields_are_pruned(kueue_schemas: dict[str, Any]) -> None:
    queue = copy.deepcopy(CLUSTER_QUEUE)
    queue["spec"]["bogus"] = 1
    queue["spec"]["resourceGroups"][0]["flavors"][0]["color"] = "blue"
    queue["metadata"].update(notMeta=True, labels={"team": "a"})
    queue["extra"] = {"x": 1}
    before = copy.deepcopy(queue)
    result, errors = prune_default_validate(queue, kueue_schemas["ClusterQueue"])
    assert errors == []
    assert "bogus" not in result["spec"]
    assert result["spec"]["resourceGroups"][0]["flavors"][0] == {
        "name": "default-flavor",
        "resources": [
            {"name": "cpu", "nominalQuota": 9},
            {"name": "memory", "nominalQuota": "36Gi"},
        ],
    }
    assert result["metadata"] == {"name": "cluster-queue", "labels": {"team": "a"}}
    assert "extra" not in result
    assert queue == before  # the input is left alone


def _set(path: str, value: Any) -> list[dict[str, Any]]:
    """A JSON patch setting one object field (`add` replaces an existing key)."""
    return [{"op": "add", "path": path, "value": value}]


def _remove(path: str) -> list[dict[str, Any]]:
    return [{"op": "remove", "path": path}]


@pytest.mark.parametrize(
    ("kind", "patch", "expected"),
    [
        pytest.param(
            "ClusterQueue",
            _set("/spec/preemption", {"borrowWithinCohort": {"maxPriorityThreshold": "7"}}),
            [
                (
                    "spec.preemption.borrowWithinCohort.maxPriorityThreshold",
                    'Invalid value: "string": spec.preemption.borrowWithinCohort.'
                    'maxPriorityThreshold in body must be of type integer: "string"',
                )
            ],
            id="wrong-type",
        ),
        pytest.param(
            "ClusterQueue",
            _remove("/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"),
            [(f"{Q0}.nominalQuota", "Required value")],
            id="missing-required-field",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/queueingStrategy", "FIFO"),
            [
                (
                    "spec.queueingStrategy",
                    'Unsupported value: "FIFO": supported values: "StrictFIFO", "BestEffortFIFO"',
                )
            ],
            id="enum-violation",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/cohortName", "a" * 254),
            [("spec.cohortName", "Too long: may not be more than 253 bytes")],
            id="too-long",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups/0/flavors/0/name", "Default_Flavor"),
            [
                (
                    "spec.resourceGroups[0].flavors[0].name",
                    'Invalid value: "Default_Flavor": spec.resourceGroups[0].flavors[0].name in '
                    f"body should match '{DNS_SUBDOMAIN}'",
                )
            ],
            id="name-pattern",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "9 cores"),
            [
                (
                    f"{Q0}.nominalQuota",
                    f'Invalid value: "9 cores": {Q0}.nominalQuota in body '
                    f"should match '{QUANTITY}'",
                )
            ],
            id="quantity-pattern",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", True),
            [
                (
                    f"{Q0}.nominalQuota",
                    f'Invalid value: "boolean": {Q0}.nominalQuota in body must be of type '
                    'integer,string: "boolean"',
                )
            ],
            id="quantity-wrong-type",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups/0/flavors/0/resources/1/name", "cpu"),
            [
                (
                    "spec.resourceGroups[0].flavors[0].resources[1]",
                    'Duplicate value: map[string]interface {}{"name":"cpu"}',
                )
            ],
            id="list-map-duplicate-key",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups/0/flavors/0/resources", []),
            [
                (
                    "spec.resourceGroups[0].flavors[0].resources",
                    "Invalid value: 0: spec.resourceGroups[0].flavors[0].resources in body should "
                    "have at least 1 items",
                )
            ],
            id="min-items",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/spec/resourceGroups", [CLUSTER_QUEUE["spec"]["resourceGroups"][0]] * 17),
            [("spec.resourceGroups", "Too many: 17: must have at most 16 items")],
            id="max-items",
        ),
        pytest.param(
            "ClusterQueue",
            _set("/metadata/name", "Cluster_Queue"),
            [
                (
                    "metadata.name",
                    'Invalid value: "Cluster_Queue": a lowercase RFC 1123 subdomain must '
                    "consist of lower case alphanumeric characters, '-' or '.', and must start and "
                    "end with an alphanumeric character (e.g. 'example.com', regex used for "
                    "validation is "
                    f"'{DNS_SUBDOMAIN[1:-1]}')",
                )
            ],
            id="metadata-name-not-a-dns-subdomain",
        ),
        pytest.param(
            "Workload",
            _set("/spec/podSets/0/name", "p" * 64),
            [("spec.podSets[0].name", "Too long: may not be more than 63 bytes")],
            id="pod-set-name-too-long",
        ),
        pytest.param(
            "Workload",
            _set("/spec/podSets/0/count", -1),
            [
                (
                    "spec.podSets[0].count",
                    "Invalid value: -1: spec.podSets[0].count in body should be greater than or "
                    "equal to 0",
                )
            ],
            id="minimum",
        ),
        pytest.param(
            "Workload",
            _remove("/status/conditions/1/lastTransitionTime"),
            [("status.conditions[1].lastTransitionTime", "Required value")],
            id="condition-without-transition-time",
        ),
        pytest.param(
            "Workload",
            _set("/status/admission/podSetAssignments/0/resourceUsage/cpu", "four"),
            [
                (
                    "status.admission.podSetAssignments[0].resourceUsage[cpu]",
                    'Invalid value: "four": status.admission.podSetAssignments[0].'
                    f"resourceUsage[cpu] in body should match '{QUANTITY}'",
                )
            ],
            id="additional-properties-quantity",
        ),
    ],
)
def test_kueue_violations(
    kueue_schemas: dict[str, Any], kind: str, patch: list[Any], expected: list[tuple[str, str]]
) -> None:
    base = CLUSTER_QUEUE if kind == "ClusterQueue" else WORKLOAD
    _, errors = prune_default_validate(jsonpatch.apply_patch(base, patch), kueue_schemas[kind])
    assert errors == expected


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(WORKLOAD["status"], id="admitted"),
        pytest.param(PREEMPTED_STATUS, id="preempted"),
    ],
)
def test_kueue_md_workload_validates(kueue_schemas: dict[str, Any], status: dict[str, Any]) -> None:
    workload = {**WORKLOAD, "status": status}
    result, errors = prune_default_validate(workload, kueue_schemas["Workload"])
    assert errors == []
    assert result["spec"] == WORKLOAD["spec"]  # nothing pruned, nothing defaulted
    assert result["status"] == {k: v for k, v in status.items() if v is not None}


def test_every_kueue_example_validates(kueue_schemas: dict[str, Any]) -> None:
    results = {}
    for path in sorted((KUEUE_DATA / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("apiVersion", "").startswith("kueue.x-k8s.io/"):
                _, errors = prune_default_validate(doc, kueue_schemas[doc["kind"]])
                results[f"{path.name}: {doc['kind']}/{doc['metadata']['name']}"] = errors
    assert len(results) >= 8
    assert {name: errors for name, errors in results.items() if errors} == {}


QUANTITY_SCHEMA = {
    "type": "object",
    "properties": {
        "q": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": "^[0-9]+m?$",
        },
        "n": {"type": "integer", "anyOf": [{"minimum": 10}, {"maximum": 1}]},
        "o": {"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
    },
}
LIST_SCHEMA = {
    "type": "object",
    "properties": {
        "ports": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["port", "protocol"],
            "items": {
                "type": "object",
                "required": ["port"],
                "properties": {
                    "port": {"type": "integer"},
                    "protocol": {"type": "string", "default": "TCP"},
                },
            },
        },
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "unique": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
    },
}
MAP_SCHEMA = {
    "type": "object",
    "properties": {
        "limits": {
            "type": "object",
            "maxProperties": 2,
            "additionalProperties": {"type": "integer", "maximum": 8, "exclusiveMaximum": True},
        },
        "free": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"a": {"type": "integer"}},
        },
        "strict": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "maybe": {"type": "string", "nullable": True},
        "mode": {"type": "string", "default": "auto", "minLength": 2},
        "ratio": {"type": "number", "minimum": 0.5},
        "box": {
            "type": "object",
            "default": {},
            "properties": {"size": {"type": "integer", "default": 3}},
        },
    },
}


@pytest.mark.parametrize(
    ("schema", "obj", "expected_obj", "expected_errors"),
    [
        pytest.param(QUANTITY_SCHEMA, {"q": 5}, {"q": 5}, [], id="int-or-string-int"),
        pytest.param(QUANTITY_SCHEMA, {"q": "500m"}, {"q": "500m"}, [], id="int-or-string-string"),
        pytest.param(
            QUANTITY_SCHEMA,
            {"q": "half"},
            {"q": "half"},
            [("q", "Invalid value: \"half\": q in body should match '^[0-9]+m?$'")],
            id="int-or-string-pattern-on-strings-only",
        ),
        pytest.param(
            QUANTITY_SCHEMA,
            {"q": [1]},
            {"q": [1]},
            [("q", 'Invalid value: "array": q in body must be of type integer,string: "array"')],
            id="int-or-string-wrong-type",
        ),
        pytest.param(QUANTITY_SCHEMA, {"n": 12}, {"n": 12}, [], id="any-of-one-branch-holds"),
        pytest.param(
            QUANTITY_SCHEMA,
            {"n": 5},
            {"n": 5},
            [
                ("n", "Invalid value: 5: n in body should be greater than or equal to 10"),
                ("n", "Invalid value: 5: n in body should be less than or equal to 1"),
                ("n", "Invalid value: 5: n in body must validate at least one schema (anyOf)"),
            ],
            id="any-of-no-branch-holds",
        ),
        pytest.param(QUANTITY_SCHEMA, {"o": "ax"}, {"o": "ax"}, [], id="one-of-exactly-one"),
        pytest.param(
            QUANTITY_SCHEMA,
            {"o": "ab"},
            {"o": "ab"},
            [("o", 'Invalid value: "ab": o in body must validate one and only one schema (oneOf)')],
            id="one-of-two-hold",
        ),
        pytest.param(
            LIST_SCHEMA,
            {
                "ports": [
                    {"port": 80},
                    {"port": 80, "protocol": "UDP"},
                    {"port": 80, "protocol": "TCP"},
                ]
            },
            {
                "ports": [
                    {"port": 80, "protocol": "TCP"},
                    {"port": 80, "protocol": "UDP"},
                    {"port": 80, "protocol": "TCP"},
                ]
            },
            [("ports[2]", 'Duplicate value: map[string]interface {}{"port":80, "protocol":"TCP"}')],
            id="list-map-duplicate-after-defaulting",
        ),
        pytest.param(
            LIST_SCHEMA,
            {"ports": [{"protocol": "UDP"}]},
            {"ports": [{"protocol": "UDP"}]},
            [("ports[0].port", "Required value")],
            id="list-item-required",
        ),
        pytest.param(
            LIST_SCHEMA,
            {"tags": ["a", "b", "a"]},
            {"tags": ["a", "b", "a"]},
            [("tags[2]", 'Duplicate value: "a"')],
            id="list-set-duplicate",
        ),
        pytest.param(
            LIST_SCHEMA,
            {"unique": [1, 2, 1]},
            {"unique": [1, 2, 1]},
            [("unique", 'Invalid value: "": unique in body shouldn\'t contain duplicates')],
            id="unique-items",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"limits": {"gpu": 2, "nvidia.com/gpu": 8}},
            {"limits": {"gpu": 2, "nvidia.com/gpu": 8}, "mode": "auto", "box": {"size": 3}},
            [
                (
                    "limits[nvidia.com/gpu]",
                    "Invalid value: 8: limits[nvidia.com/gpu] in body should be less than 8",
                )
            ],
            id="additional-properties-keys-kept-values-checked",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"limits": {"a": 1, "b": 1, "c": 1}},
            {"limits": {"a": 1, "b": 1, "c": 1}, "mode": "auto", "box": {"size": 3}},
            [("limits", "Too many: 3: must have at most 2 items")],
            id="max-properties",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"free": {"a": 1, "x": {"y": 2}}, "strict": {"a": 1, "x": 2}},
            {
                "free": {"a": 1, "x": {"y": 2}},
                "strict": {"a": 1},
                "mode": "auto",
                "box": {"size": 3},
            },
            [],
            id="preserve-unknown-fields-keeps-unknown",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"free": {"a": "one"}},
            {"free": {"a": "one"}, "mode": "auto", "box": {"size": 3}},
            [
                (
                    "free.a",
                    'Invalid value: "string": free.a in body must be of type integer: "string"',
                )
            ],
            id="preserve-unknown-fields-still-validates-known",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"maybe": None, "mode": None, "box": {}},
            {"maybe": None, "mode": "auto", "box": {"size": 3}},
            [],
            id="null-kept-if-nullable-else-pruned-and-defaulted",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"mode": "x", "ratio": 1},
            {"mode": "x", "ratio": 1, "box": {"size": 3}},
            [("mode", 'Invalid value: "x": mode in body should be at least 2 chars long')],
            id="min-length-and-number-accepts-int",
        ),
        pytest.param(
            MAP_SCHEMA,
            {"ratio": 0.25, "strict": {"a": 1.5}},
            {"ratio": 0.25, "strict": {"a": 1.5}, "mode": "auto", "box": {"size": 3}},
            [
                (
                    "ratio",
                    "Invalid value: 0.25: ratio in body should be greater than or equal to 0.5",
                ),
                (
                    "strict.a",
                    'Invalid value: "number": strict.a in body must be of type integer: "number"',
                ),
            ],
            id="minimum-float-and-integer-rejects-float",
        ),
    ],
)
def test_handmade_schemas(
    schema: dict[str, Any],
    obj: dict[str, Any],
    expected_obj: dict[str, Any],
    expected_errors: list[tuple[str, str]],
) -> None:
    result, errors = prune_default_validate(obj, schema)
    assert (result, errors) == (expected_obj, expected_errors)
