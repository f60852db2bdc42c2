"""The sentence a user reads when an API call for their kernel failed for good.

`failure(exc, who=..., doing=...)` turns a `ClusterApiError` (after its retries) into an error of
the same class whose message names the kernel, what failed and what to do: an RBAC refusal
names the identity, the verb, the resource and the namespace (an admission refusal keeps the
server's sentence); a server that kept failing is named by its status, never by its raw text
(which the admin's log keeps). Pure.
"""

from __future__ import annotations

import re

from kernel_queue import errors

RBAC_FILE = "etc/kubernetes/rbac.yaml"
SERVICE_ACCOUNT = "system:serviceaccount:"
_RBAC = re.compile(r'User "[^"]*" cannot\b')
_NO_ACCOUNT = re.compile(r"error looking up service account ([^/\s]+)/([^:\s]+): serviceaccount")
"""The ServiceAccount admission plugin's refusal of a pod whose service account is missing."""


def identity(user: str) -> str:
    """ "service account 'default/kernel-queue'", "user 'alice'", or "credentials"."""
    if user.startswith(SERVICE_ACCOUNT):
        return f"service account {user[len(SERVICE_ACCOUNT) :].replace(':', '/', 1)!r}"
    return f"user {user!r}" if user else "credentials"


def is_rbac(exc: errors.ClusterForbidden) -> bool:
    """A 401, or a 403 from authorization ("User … cannot create resource …"); a 403 from
    admission (Pod Security, a ServiceAccount lookup, a webhook) is the server's own sentence."""
    return exc.status == 401 or _RBAC.search(exc.message) is not None


def forbidden(exc: errors.ClusterForbidden, who: str) -> str:
    """`who`: the server's identity may not VERB RESOURCE in namespace NS; grant it …"""
    verb = getattr(exc, "verb", "") or "use"
    resource = getattr(exc, "resource", "") or "that resource"
    namespace = getattr(exc, "namespace", None)
    user = identity(getattr(exc, "user", ""))
    if exc.status == 401:
        return (
            f"{who}: the Kubernetes API server does not accept the server's credentials "
            f"({exc.message}); fix the kubeconfig or the service account token"
        )
    if namespace:
        where, grant = f" in namespace {namespace!r}", f"a Role in {namespace!r}"
    else:
        where, grant = " (cluster-wide)", "a ClusterRole"
    return (
        f"{who}: the server's {user} may not {verb} {resource}{where}; grant it {grant} with "
        f"verb {verb!r} on {resource!r} bound to it (see {RBAC_FILE}), or use a namespace "
        "where it may"
    )


def unavailable(exc: errors.ClusterUnavailable, who: str, doing: str) -> str:
    """`who`: DOING failed: the API server kept answering 500 …; try again …"""
    if exc.status:
        answer = f"kept answering {exc.status} {exc.reason}".rstrip()
    else:
        answer = "could not be reached" if exc.reason != "Timeout" else "did not answer in time"
    return (
        f"{who}: could not {doing}: the Kubernetes API server {answer}, also on retries; try "
        "again in a minute, and if it keeps failing ask the cluster's admin to check the API "
        "server"
    )


def failure(
    exc: errors.ClusterApiError, *, who: str, doing: str, after: str = ""
) -> errors.ClusterApiError:
    """An error of `exc`'s class (status and reason kept) with the user's sentence; `after`
    (e.g. "; nothing was left behind") ends it. Chain it: `raise failure(...) from exc`."""
    if isinstance(exc, errors.ClusterForbidden) and is_rbac(exc):
        text = forbidden(exc, who)
    elif isinstance(exc, errors.ClusterUnavailable):
        text = unavailable(exc, who, doing)
    elif exc.message.startswith(who):
        text = exc.message  # already ours (a foreign object, say)
    else:
        text = f"{who}: could not {doing}: {exc.message}"
        account = _NO_ACCOUNT.search(exc.message)
        if account is not None:
            namespace, name = account.group(1), account.group(2)
            text += (
                f"; the kernelspec's `service_account` {name!r} does not exist in namespace "
                f"{namespace!r}: create it (`kubectl create serviceaccount {name} -n "
                f"{namespace}`) or fix `service_account` in the kernelspec"
            )
    if after:
        text = text.rstrip(".")
    made = type(exc).__new__(type(exc))
    errors.ClusterApiError.__init__(made, exc.status, exc.reason, text + after)
    made.__dict__.update({k: v for k, v in exc.__dict__.items() if k != "message"})
    made.message = text + after
    return made
