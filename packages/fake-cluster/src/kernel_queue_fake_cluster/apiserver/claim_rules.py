"""PersistentVolumeClaims on the fake cluster, which serves no PersistentVolumes nor
StorageClasses: the real apiserver starts every claim Pending, and on the real plane a claim of
no storage class is then bound to the volume the node agent's provisioner makes for it, while
one naming a class no provisioner serves stays Pending. The fake does both at create: a claim of
no class is Bound at once (a volume name, its access modes and requested capacity in its
status), one naming a class stays Pending. Admission only; no HTTP, no store reads.
"""

from __future__ import annotations

import uuid

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store


def install(store: Store) -> None:
    """Add the claim rules to `store`'s admission of persistentvolumeclaims."""

    def admit(operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if new is None:
            return None
        return created(new) if old is None else kept(new, old)

    store.add_admission("", "persistentvolumeclaims", admit)


def created(claim: Obj) -> Obj:
    """A new claim: Bound to a volume of the fake's when it names no storage class, else
    Pending (whatever status the request carried, as the real apiserver ignores it)."""
    claim = dict(claim)
    spec = dict(claim.get("spec") or {})
    if spec.get("storageClassName") or spec.get("volumeName"):
        claim["status"] = {"phase": "Pending"}
        return claim
    spec["volumeName"] = f"pvc-{uuid.uuid4()}"
    request = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    status: Obj = {"phase": "Bound", "accessModes": list(spec.get("accessModes") or [])}
    if request:
        status["capacity"] = {"storage": request}
    claim["spec"], claim["status"] = spec, status
    return claim


def kept(claim: Obj, old: Obj) -> Obj | None:
    """An update keeps the volume the claim is bound to (a replace that leaves it out)."""
    volume = (old.get("spec") or {}).get("volumeName")
    if not volume or (claim.get("spec") or {}).get("volumeName"):
        return None
    claim = dict(claim)
    claim["spec"] = {**(claim.get("spec") or {}), "volumeName": volume}
    return claim
