"""Kueue installed on the real API server the way its release's manifests install it in a
cluster, with one difference: Kueue runs on this machine, not in a pod, so every webhook and the
visibility server are reached at 127.0.0.1 instead of through a Service.

- CRDs: the release's `config/components/crd/bases`, with the conversion webhook its
  `crd/kustomization.yaml` patches in (0.19: localqueues, clusterqueues, cohorts, workloads,
  multikueueclusters) pointing at `https://127.0.0.1:<webhook port>/convert`.
- Webhooks: `config/components/webhook/manifests.yaml` in URL mode (as envtest installs them),
  named `kueue-…` as the release build names them, with our CA as `caBundle`, and the release's
  namespaceSelector (not kube-system or kueue-system) on every webhook for a job kind.
- Kueue's own Configuration: leader election off, our certificates (internal certificate
  management off), the `pod` integration (off by default up to 0.15), health and webhook on
  loopback ports, metrics off.
- The visibility API: the release's APIServices, served by an ExternalName Service that names
  `localhost` (the aggregator proxies to it; an Endpoints object may not name a loopback
  address), at the visibility server's port.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from kernel_queue_fake_cluster.control_plane.client import AdminClient, Obj
from kernel_queue_fake_cluster.control_plane.releases import KueueRelease

NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
JOB_NAMESPACES = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", NAMESPACE],
        }
    ]
}
"""The release's namespaceSelector on the webhooks of job kinds (pods among them)."""
VISIBILITY_SERVICE = "kueue-visibility-server"


def _documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def crds(config: Path, webhook_url: str, ca: bytes) -> list[Obj]:
    """The release's CRDs, with the conversion webhooks its kustomization patches in."""
    components = config / "components" / "crd"
    converted: set[str] = set()
    kustomization = yaml.safe_load((components / "kustomization.yaml").read_text()) or {}
    for patch in kustomization.get("patches") or []:
        path = components / str(patch.get("path", ""))
        if path.name.startswith("webhook_in_") and path.exists():
            converted.update(doc["metadata"]["name"] for doc in _documents(path))
    found = []
    for path in sorted((components / "bases").glob("*.yaml")):
        for crd in _documents(path):
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {
                            "url": f"{webhook_url}/convert",
                            "caBundle": base64.b64encode(ca).decode(),
                        },
                        "conversionReviewVersions": ["v1"],
                    },
                }
            found.append(crd)
    return found


def webhooks(config: Path, webhook_url: str, ca: bytes) -> list[Obj]:
    """The release's webhook configurations in URL mode."""
    found = []
    bundle = base64.b64encode(ca).decode()
    for doc in _documents(config / "components" / "webhook" / "manifests.yaml"):
        if not doc["kind"].endswith("WebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"] = {"url": f"{webhook_url}{service['path']}", "caBundle": bundle}
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if groups and GROUP not in groups:  # a job kind's webhook (pods are group "")
                hook["namespaceSelector"] = copy.deepcopy(JOB_NAMESPACES)
        found.append(doc)
    return found


def visibility(config: Path, port: int) -> list[Obj]:
    """The ExternalName Service and the release's APIServices for the visibility server."""
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": port}]},
    }
    found = [service]
    for path in sorted((config / "components" / "visibility").glob("apiservice_*.yaml")):
        for doc in _documents(path):
            doc["spec"]["service"] = {
                "name": VISIBILITY_SERVICE,
                "namespace": NAMESPACE,
                "port": port,
            }
            found.append(doc)
    return found


def configuration(
    release: KueueRelease,
    *,
    webhook_port: int,
    cert_dir: Path,
    health_port: int,
    visibility_port: int,
    label_keys_to_copy: Sequence[str] = (),
) -> Obj:
    """Kueue's Configuration for a manager run on this machine; `label_keys_to_copy`: the pod
    labels its Workloads get (`integrations.labelKeysToCopy`)."""
    config: Obj = {
        "apiVersion": release.config_api,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod"]},
    }
    if label_keys_to_copy:
        config["integrations"]["labelKeysToCopy"] = list(label_keys_to_copy)
    if release.visibility_port is None:
        config["visibilityServer"] = {"bindAddress": "127.0.0.1", "bindPort": visibility_port}
    return config


def established(client: AdminClient, names: Iterable[str]) -> bool:
    """Every CRD of `names` is Established."""
    for name in names:
        crd: Any = client.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, name)
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
    return True


def available(client: AdminClient, names: Iterable[str]) -> bool:
    """Every APIService of `names` is Available."""
    for name in names:
        found: Any = client.get("apiregistration.k8s.io/v1", "APIService", None, name)
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
            return False
    return True
