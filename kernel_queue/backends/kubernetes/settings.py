"""The kubernetes backend's settings (`c.KubernetesBackend.<trait>`), and where it runs.

`BackendSettings` holds the traits; `KubernetesBackend` derives from it, so each is configured
under the backend's own name. `own_namespace` reads the pod's service-account namespace file
(call it off the event loop).
"""

from __future__ import annotations

import os

from traitlets import Float, Unicode, default
from traitlets.config import LoggingConfigurable

from kernel_queue.kube.client import retries
from kernel_queue.kube.objects import ownership

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class BackendSettings(LoggingConfigurable):
    """The traits of `KubernetesBackend`."""

    kubeconfig = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""Kubeconfig file to use; default: in-cluster credentials, else $KUBECONFIG or
        ~/.kube/config.""",
    )
    context = Unicode(None, allow_none=True, config=True, help="Kubeconfig context to use.")
    namespace = Unicode(
        config=True,
        help="""Namespace of kernels whose kernelspec names none.
        Env: KERNEL_QUEUE_NAMESPACE; default: the server's own namespace, else 'default'.""",
    )
    position_interval = Float(
        2.0,
        config=True,
        help="""Seconds between reads of Kueue's visibility API for a LocalQueue, while kernels
        wait in it (one read serves every kernel of that queue); a read of several pages (1000
        Workloads each) waits this long per page, so a queue costs at most one request per
        interval.""",
    )
    kueue_timeout = Float(
        30.0,
        config=True,
        help="""Seconds Kueue may take to answer for a kernel's pods (make their Workload, then
        give it a condition or a queue position) before the kernel's reason says Kueue does not
        answer and asks whether Kueue's controller runs. The kernel keeps waiting
        (`admission_timeout` bounds that); 0 never says so.""",
    )
    owner_id = Unicode(
        config=True,
        help="""This server's id, in the label kernel-queue.dev/owner of every object it
        creates: a 409 is ours only with our kernel id and owner, and the reaper deletes only
        this owner's objects. Default: the host's name and the Jupyter server's port (stable
        when the same server restarts). Give each server sharing a namespace its own.""",
    )
    reap_interval = Float(
        60.0,
        config=True,
        help="""Seconds between the reaper's sweeps (the first at start): objects of this
        owner whose kernel this server does not know at two sweeps in a row are deleted, and
        releases that failed are retried. 0 turns the reaper off.""",
    )
    api_retry_seconds = Float(
        30.0,
        config=True,
        help="""Seconds of pauses a Kubernetes API call may spend retrying 429s, 5xx answers
        and lost connections before it fails (reads, deletes, and creates checked by owner).""",
    )

    @default("namespace")
    def _namespace_default(self) -> str:
        return own_namespace()  # `_client` reads it first, off the event loop

    @default("owner_id")
    def _owner_id_default(self) -> str:
        return ownership.default_owner()

    @property
    def retry(self) -> retries.Backoff:
        """How API calls retry: within `api_retry_seconds` of pauses."""
        return retries.Backoff(budget=self.api_retry_seconds)


def own_namespace() -> str:
    """$KERNEL_QUEUE_NAMESPACE, else the namespace of the pod the server runs in, else default."""
    if os.environ.get("KERNEL_QUEUE_NAMESPACE"):
        return os.environ["KERNEL_QUEUE_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip() or "default"
    except OSError:
        return "default"
