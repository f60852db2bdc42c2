"""A node-local static provisioner: a PersistentVolume for each claim no volume is bound to.

On a plane with a real scheduler, a pod whose claim is unbound is never scheduled, and nothing
else gives claims volumes. For each Pending claim without `spec.volumeName` that it serves (no
storage class, or a StorageClass whose `provisioner` is `PROVISIONER`), the `Provisioner` makes
a PersistentVolume: hostPath = the node's folder of that claim (`volumes.claim_dir`, where the
agent mounts it anyway), capacity = the claim's request, its access modes, volume mode and
storage class, node affinity to this node, reclaim policy Delete, and `claimRef` pre-bound to
the claim's namespace, name and uid; kube-controller-manager's persistentvolume-binder binds the
two. Once the claim is gone, the volume is deleted and, unless a claim of that name exists again,
its folder too (what Delete means). A claim naming another class is left to that class's
provisioner (none here: it stays Pending, as on a cluster whose storage cannot give it).

Where the API serves no PersistentVolumes (the fake API server: it treats claims as bound), it
does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path

import aiohttp

from kernel_queue_fake_cluster.common.objects import Obj
from kernel_queue_fake_cluster.node import volumes
from kernel_queue_fake_cluster.node.client import ApiError, Client, path
from kernel_queue_fake_cluster.node.informer import Informer

log = logging.getLogger(__name__)

PROVISIONER = "kernel-queue.dev/node-agent"
"""This provisioner's name: in its volumes' `pv.kubernetes.io/provisioned-by` (so the
persistentvolume controller leaves their deletion to it) and in a StorageClass it serves."""
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
HOSTNAME_LABEL = "kubernetes.io/hostname"
RESYNC_SECONDS = 5.0
"""How often it looks again without a change (a create or delete that failed is retried)."""


def volume_name(claim: Obj) -> str:
    """The volume made for `claim`: `pvc-<claim uid>`, as dynamic provisioners name theirs."""
    return f"pvc-{claim['metadata']['uid']}"


def wants_volume(claim: Obj) -> bool:
    """Whether `claim` waits for a volume: Pending (or no phase yet), none named, not being
    deleted, a filesystem claim."""
    spec, meta = claim.get("spec") or {}, claim["metadata"]
    phase = (claim.get("status") or {}).get("phase") or "Pending"
    return (
        phase == "Pending"
        and not spec.get("volumeName")
        and not meta.get("deletionTimestamp")
        and spec.get("volumeMode", "Filesystem") == "Filesystem"
    )


def volume_for(claim: Obj, root: Path, node_name: str) -> Obj:
    """The PersistentVolume pre-bound to `claim`, its folder under the agent's `root`."""
    meta, spec = claim["metadata"], claim.get("spec") or {}
    request = ((spec.get("resources") or {}).get("requests") or {}).get("storage") or "1Gi"
    folder = volumes.claim_dir(root, meta["namespace"], meta["name"])
    affinity = {"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(claim), "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": str(request)},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "storageClassName": spec.get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [affinity]}]}},
        },
    }


class Provisioner:
    """Volumes for the claims `claims` holds, kept in step by `run()` (a task of the agent's
    loop); `notify` (an informer handler) says something changed."""

    def __init__(
        self, client: Client, claims: Informer, volumes: Informer, root: Path, node_name: str
    ) -> None:
        self.client, self.claims, self.volumes = client, claims, volumes
        self.root, self.node_name = root, node_name
        self.made = 0
        self.deleted = 0
        self._changed = asyncio.Event()
        self._refused: set[str] = set()  # claims whose volume the API refused (said once)

    def notify(self, kind: str = "", obj: Obj | None = None) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Until cancelled; returns at once where PersistentVolumes are not served."""
        await self.claims.synced.wait()
        await self.volumes.synced.wait()
        if not self.volumes.served or not self.claims.served:
            return
        while True:
            self._changed.clear()
            try:
                await self.sync()
            except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.debug("provisioner: %s", exc)
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's lost a cancel
                async with asyncio.timeout(RESYNC_SECONDS):
                    await self._changed.wait()

    async def sync(self) -> None:
        """One pass: a volume for each claim that waits for one, and none left of a claim
        that is gone."""
        made = {pv["metadata"]["name"] for pv in self.volumes.objects()}
        for claim in self.claims.objects():
            wanted = wants_volume(claim) and volume_name(claim) not in made
            if wanted and await self._serves(claim):
                await self._provision(claim)
        for pv in self.volumes.objects():
            annotations = pv["metadata"].get("annotations") or {}
            if annotations.get(PROVISIONED_BY) == PROVISIONER and await self._orphaned(pv):
                await self._delete(pv)

    async def _serves(self, claim: Obj) -> bool:
        """No storage class (static binding), or a StorageClass this provisioner backs."""
        name = (claim.get("spec") or {}).get("storageClassName") or ""
        if not name:
            return True
        try:
            found = await self.client.get(
                path("storageclasses", None, name, group="storage.k8s.io")
            )
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return bool(found.get("provisioner") == PROVISIONER)

    async def _provision(self, claim: Obj) -> None:
        meta = claim["metadata"]
        body = volume_for(claim, self.root, self.node_name)
        _make(Path(body["spec"]["hostPath"]["path"]))
        try:
            await self.client.create(path("persistentvolumes"), body)
        except ApiError as exc:
            if exc.code == 409:
                return  # made already (the watch had not brought it yet)
            if meta["uid"] not in self._refused:
                self._refused.add(meta["uid"])
                log.warning(
                    "provisioner: no volume for claim %s/%s: %s",
                    meta["namespace"],
                    meta["name"],
                    exc,
                )
            return
        self.made += 1
        log.info(
            "provisioner: volume %s for claim %s/%s",
            body["metadata"]["name"],
            meta["namespace"],
            meta["name"],
        )

    async def _orphaned(self, pv: Obj) -> bool:
        """Whether the claim `pv` was made for is gone (asked again where the cache says so:
        it may lag)."""
        if pv["metadata"].get("deletionTimestamp"):
            return False
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        cached = self.claims.get(ref.get("namespace"), ref.get("name", ""))
        if cached is not None and cached["metadata"]["uid"] == ref.get("uid"):
            return False
        live = await self._claim(ref.get("namespace", ""), ref.get("name", ""))
        return live is None or live["metadata"]["uid"] != ref.get("uid")

    async def _claim(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self.client.get(path("persistentvolumeclaims", namespace, name))
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    async def _delete(self, pv: Obj) -> None:
        """Delete the volume, then its folder unless a claim of that name is there again."""
        meta, ref = pv["metadata"], pv["spec"]["claimRef"]
        try:
            await self.client.delete(path("persistentvolumes", None, meta["name"]), uid=meta["uid"])
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
            return
        self.deleted += 1
        self._refused.discard(ref.get("uid", ""))
        if await self._claim(ref["namespace"], ref["name"]) is None:
            folder = Path(pv["spec"].get("hostPath", {}).get("path", ""))
            if folder == volumes.claim_dir(self.root, ref["namespace"], ref["name"]):
                shutil.rmtree(folder, ignore_errors=True)
        log.info("provisioner: volume %s deleted (its claim is gone)", meta["name"])


def _make(folder: Path) -> None:
    """The volume's folder, made before the volume is (hostPath DirectoryOrCreate)."""
    folder.mkdir(parents=True, exist_ok=True)
