"""The recipes under etc/kubernetes/ as an admin gets them: rendered by `kubectl kustomize`, and
checked against Kubernetes' own schemas (kubernetes-validate, at one pinned minor) and, for
Kueue's kinds, against Kueue's CRDs read at test time from the checkout's ../shared."""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import KUEUE_CRDS, REPO, skip_unless_ci

RECIPES = REPO / "etc" / "kubernetes"
KUBERNETES = "1.32"
"""The Kubernetes minor every rendered core object is validated against."""
KUEUE_GROUP = "kueue.x-k8s.io"
Obj = dict[str, Any]


def kubectl() -> str:
    """kubectl's path; the test fails saying so when it is not installed."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not installed: the recipe tests render and apply with it")
    return found


@functools.cache
def rendered(recipe: str) -> tuple[Obj, ...]:
    """`kubectl kustomize etc/kubernetes/<recipe>`, as objects."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(RECIPES / recipe)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(objects: tuple[Obj, ...], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and name in (None, o["metadata"].get("name"))]


def validate_core(obj: Obj) -> None:
    """Kubernetes' own schema for the object's kind at `KUBERNETES`, unknown fields refused."""
    kubernetes_validate.validate(obj, KUBERNETES, strict=True)


@functools.cache
def _kueue_schemas() -> dict[tuple[str, str], Obj]:
    if not KUEUE_CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS} (../shared is absent)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found = {}
    for path in sorted(KUEUE_CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=loader)
        for version in crd["spec"]["versions"]:
            key = (crd["spec"]["names"]["kind"], version["name"])
            found[key] = version["schema"]["openAPIV3Schema"]
    return found


def validate_kueue(obj: Obj) -> None:
    """The schema of the object's kind and version in Kueue's CRD; fields the CRD does not
    declare are refused too (kubectl apply asks the server for strict field validation)."""
    version = obj["apiVersion"].removeprefix(f"{KUEUE_GROUP}/")
    schema = _kueue_schemas().get((obj["kind"], version))
    assert schema is not None, f"Kueue's CRDs serve no {obj['kind']} at {obj['apiVersion']}"
    body = {k: v for k, v in obj.items() if k != "metadata"}
    jsonschema.Draft7Validator(schema).validate(body)
    assert unknown_fields(body, schema) == [], obj["metadata"]["name"]


def unknown_fields(value: Any, schema: Obj, path: str = "") -> list[str]:
    """Paths of fields `schema` (structural OpenAPI) does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, item in value.items():
            if properties is not None and key in properties:
                found += unknown_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, f"{path}.{key}")
            elif properties is not None and key not in ("apiVersion", "kind"):
                found.append(f"{path}.{key}")
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        return [p for i, v in enumerate(value) for p in unknown_fields(v, items, f"{path}[{i}]")]
    return []


def validate(obj: Obj) -> None:
    """Each rendered object by its own schema: Kueue's CRD or Kubernetes' (a Notebook, whose CRD
    the recipe does not own, by its pod template, which Kubeflow runs as a Pod's spec)."""
    if obj["apiVersion"].startswith(f"{KUEUE_GROUP}/"):
        validate_kueue(obj)
    elif obj["apiVersion"] == "kubeflow.org/v1":
        meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}
        validate_core(
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, **obj["spec"]["template"]}
        )
    else:
        validate_core(obj)


def as_yaml(objects: tuple[Obj, ...] | list[Obj]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


def kinds_and_names(objects: tuple[Obj, ...]) -> list[tuple[str, str]]:
    """The objects' (kind, name), sorted."""
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)


def with_base(
    namespace: str | None, *more: tuple[str, str], account: bool = True
) -> list[tuple[str, str]]:
    """The base's objects as `kinds_and_names` lists them, with an overlay's `more`: its
    ClusterRoleBinding named for `namespace` where the overlay sets one, its ServiceAccount
    unless the overlay drops it (`account`)."""
    binding = "kernel-queue-priority-classes" + (f"-{namespace}" if namespace else "")
    base = [
        ("ClusterRole", "kernel-queue-priority-classes"),
        ("ClusterRoleBinding", binding),
        ("LocalQueue", "user-queue"),
        ("NetworkPolicy", "kernel-queue-kernels"),
        ("PersistentVolumeClaim", "kernel-checkpoints"),
        ("Role", "kernel-queue"),
        ("RoleBinding", "kernel-queue"),
    ]
    return sorted([*base, *more, *([("ServiceAccount", "kernel-queue")] if account else [])])
