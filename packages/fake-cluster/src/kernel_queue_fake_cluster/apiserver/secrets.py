"""The apiserver's own Secret rules: `type` defaults to `Opaque`, and `stringData` is folded into
base64 `data` on every create and update (a key in both takes stringData's value) and never
stored, as the real apiserver's Secret strategy does. Admission only; no HTTP, no store reads.
"""

from __future__ import annotations

import base64

from kernel_queue_fake_cluster.apiserver.errors import invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store

OPAQUE = "Opaque"


def install(store: Store) -> None:
    """Add the Secret rules to `store`'s admission of secrets."""

    def admit(operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if new is None:
            return None
        return folded(new, store)

    store.add_admission("", "secrets", admit)


def folded(secret: Obj, store: Store) -> Obj:
    """`secret` with its type defaulted and its stringData moved into data; 422 for a
    stringData that is not a map of strings."""
    secret = dict(secret)
    if not secret.get("type"):
        secret["type"] = OPAQUE
    extra = secret.pop("stringData", None)
    if not extra:
        return secret
    name = (secret.get("metadata") or {}).get("name", "")
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        cause = ("stringData", "Invalid value: must be a map of strings")
        raise invalid(store.type("", "secrets"), name, [cause])
    data = dict(secret.get("data") or {})
    data.update({key: base64.b64encode(value.encode()).decode() for key, value in extra.items()})
    secret["data"] = data
    return secret
