"""The node agent's static provisioner, over HTTP against an API server that serves
PersistentVolumes (the fake API server with the kind registered; the test plays
kube-controller-manager's binder where it matters): a volume pre-bound to each unbound claim it
serves, at the claim's folder, none for a claim of another class or one bound already; the
volume and its folder deleted once the claim is gone, the folder kept for a claim of that name
made again; and nothing at all where PersistentVolumes are not served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.node import volumes
from kernel_queue_fake_cluster.node.client import Client
from kernel_queue_fake_cluster.node.informer import Informer
from kernel_queue_fake_cluster.node.provisioner import PROVISIONED_BY, PROVISIONER, Provisioner
from test_node_api import NS, serving, until

VOLUMES = ResourceType("", "persistentvolumes", "PersistentVolume", namespaced=False)
CLASSES = ResourceType(
    "storage.k8s.io", "storageclasses", "StorageClass", namespaced=False, status_subresource=False
)


def claim(name: str, storage_class: str | None = None, **spec: object) -> Obj:
    body: Obj = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "10Gi"}},
        **spec,
    }
    if storage_class is not None:
        body["storageClassName"] = storage_class
    return {"metadata": {"name": name}, "spec": body, "status": {"phase": "Pending"}}


@contextlib.asynccontextmanager
async def provisioning(client: Client, root: Path) -> AsyncIterator[tuple[Provisioner, Informer]]:
    """A provisioner of node `node-1` with its two informers, running."""
    claims = Informer(client, "persistentvolumeclaims")
    made = Informer(client, "persistentvolumes")
    provisioner = Provisioner(client, claims, made, root, "node-1")
    claims.add_handler(provisioner.notify)
    made.add_handler(provisioner.notify)
    claims.start()
    made.start()
    task = asyncio.get_running_loop().create_task(provisioner.run())
    try:
        yield provisioner, made
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await claims.stop()
        await made.stop()


def volume(store: Store, name: str) -> Obj | None:
    return next(
        (
            pv
            for pv in store.list_objects("", "persistentvolumes", None)[0]
            if pv["metadata"]["name"] == name
        ),
        None,
    )


async def test_each_unbound_claim_it_serves_gets_a_volume_pre_bound_at_its_folder(
    tmp_path: Path,
) -> None:
    async with serving() as (store, _, client):
        store.register(VOLUMES)
        store.register(CLASSES)
        store.create(
            "storage.k8s.io",
            "storageclasses",
            None,
            {"metadata": {"name": "local"}, "provisioner": PROVISIONER},
        )
        plain = store.create("", "persistentvolumeclaims", NS, claim("plain"))
        local = store.create("", "persistentvolumeclaims", NS, claim("local", "local"))
        store.create("", "persistentvolumeclaims", NS, claim("nfs", "nfs-rwx"))  # no such class
        bound = claim("bound", volumeName="elsewhere")
        bound["status"] = {"phase": "Bound"}
        store.create("", "persistentvolumeclaims", NS, bound)
        async with provisioning(client, tmp_path) as (provisioner, _):
            uid = plain["metadata"]["uid"]
            await until(lambda: provisioner.made == 2)
            pv = volume(store, f"pvc-{uid}")
            assert pv is not None
            folder = volumes.claim_dir(tmp_path, NS, "plain")
            assert pv["metadata"]["annotations"][PROVISIONED_BY] == PROVISIONER
            assert pv["spec"] == {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "volumeMode": "Filesystem",
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": NS,
                    "name": "plain",
                    "uid": uid,
                },
                "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["node-1"],
                                    }
                                ]
                            }
                        ]
                    }
                },
            }
            assert folder.is_dir()
            of_local = volume(store, f"pvc-{local['metadata']['uid']}")
            assert of_local is not None and of_local["spec"]["storageClassName"] == "local"
            names = sorted(
                pv["metadata"]["name"]
                for pv in store.list_objects("", "persistentvolumes", None)[0]
            )
            assert names == sorted([f"pvc-{uid}", f"pvc-{local['metadata']['uid']}"])
            await provisioner.sync()  # again: nothing more
            assert provisioner.made == 2


async def test_a_volume_goes_with_its_claim_and_its_folder_unless_the_claim_is_made_again(
    tmp_path: Path,
) -> None:
    async with serving() as (store, _, client):
        store.register(VOLUMES)
        first = store.create("", "persistentvolumeclaims", NS, claim("gone"))
        again = store.create("", "persistentvolumeclaims", NS, claim("again"))
        async with provisioning(client, tmp_path) as (provisioner, made):
            await until(lambda: provisioner.made == 2)
            kept = volumes.claim_dir(tmp_path, NS, "gone") / "kernel" / "checkpoint"
            kept.parent.mkdir(parents=True)
            kept.write_text("x")
            store.delete("", "persistentvolumeclaims", NS, "gone")
            await until(lambda: volume(store, f"pvc-{first['metadata']['uid']}") is None)
            await until(lambda: not volumes.claim_dir(tmp_path, NS, "gone").exists())

            old = again["metadata"]["uid"]
            data = volumes.claim_dir(tmp_path, NS, "again") / "data"
            data.write_text("y")
            store.delete("", "persistentvolumeclaims", NS, "again")
            new = store.create("", "persistentvolumeclaims", NS, claim("again"))
            await until(lambda: volume(store, f"pvc-{old}") is None)
            await until(lambda: volume(store, f"pvc-{new['metadata']['uid']}") is not None)
            assert provisioner.deleted == 2
            assert data.read_text() == "y"  # the folder of the claim of that name now
            assert made.served


async def test_where_persistent_volumes_are_not_served_it_does_nothing(tmp_path: Path) -> None:
    async with serving() as (store, _, client):
        store.create("", "persistentvolumeclaims", NS, claim("plain"))
        async with provisioning(client, tmp_path) as (provisioner, made):
            await until(lambda: made.synced.is_set())
            await asyncio.sleep(0)
            assert not made.served
            assert provisioner.made == 0
            assert not (tmp_path / "pvc").exists()


async def test_it_stops_when_cancelled_as_a_change_wakes_it(tmp_path: Path) -> None:
    """Python 3.11's asyncio.wait_for lost a cancel that came in the same turn of the loop as
    the change it waited for, and the provisioner went on: a teardown awaiting it hung."""
    async with serving() as (store, _, client):
        store.register(VOLUMES)
        claims = Informer(client, "persistentvolumeclaims")
        made = Informer(client, "persistentvolumes")
        provisioner = Provisioner(client, claims, made, tmp_path, "node-1")
        claims.start()
        made.start()
        try:
            task = asyncio.get_running_loop().create_task(provisioner.run())
            await until(lambda: made.synced.is_set() and claims.synced.is_set())
            await asyncio.sleep(0.1)  # past its first pass, waiting for a change
            assert not task.done()
            provisioner.notify()
            task.cancel()
            await asyncio.wait({task}, timeout=5)
            assert task.cancelled(), "the provisioner went on after its cancel"
        finally:
            await claims.stop()
            await made.stop()
