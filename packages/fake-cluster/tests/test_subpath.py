"""The fake kubelet mounts a volume's `subPath` as a real kubelet does: only that directory of
the volume (made if missing), never a path with `..`, an absolute one, or one leaving the
volume through a symlink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from test_kubelet import NS, cluster, find, phase, python_pod, until

LIST_AND_PLANT = """
    import json, os
    mine = os.environ["KUBE_FAKE_MOUNT_CHECKPOINTS"]
    with open(os.path.join(mine, "state"), "w") as f:
        f.write(os.environ["POD_NAME"])
    print(json.dumps(sorted(os.listdir(mine))))
"""


def claim_pod(name: str, subpath: str) -> Obj:
    mount = {"name": "data", "mountPath": "/checkpoints", "subPath": subpath}
    return python_pod(
        name,
        LIST_AND_PLANT,
        container={"volumeMounts": [mount]},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "ckpt"}}],
    )


def waiting(store: Store, name: str) -> tuple[str, str] | None:
    pod = find(store, name) or {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (status.get("state") or {}).get("waiting")
        if state and state.get("reason") != "ContainerCreating":
            return state["reason"], state.get("message", "")
    return None


async def test_each_pod_sees_only_its_own_directory_of_a_shared_claim(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        store.create("", "persistentvolumeclaims", NS, {"metadata": {"name": "ckpt"}, "spec": {}})
        claim = kubelet.claim_dir(NS, "ckpt")
        claim.mkdir(parents=True)
        (claim / "other-kernel").mkdir()
        (claim / "other-kernel" / "secret").write_text("not yours")
        for name in ("alpha", "beta"):
            store.create("", "pods", NS, claim_pod(name, f"kernel-{name}"))
        for name in ("alpha", "beta"):
            await until(lambda n=name: phase(store, n) == "Succeeded", what=f"{name} Succeeded")
            assert json.loads(kubelet.logs(NS, name)) == ["state"]
            assert (claim / f"kernel-{name}" / "state").read_text() == name
    assert sorted(p.name for p in claim.iterdir()) == [
        "kernel-alpha",
        "kernel-beta",
        "other-kernel",
    ]
    assert (claim / "other-kernel" / "secret").read_text() == "not yours"


@pytest.mark.parametrize(
    ("subpath", "message"),
    [
        pytest.param("../escape", "must not contain '..'", id="backstep"),
        pytest.param("a/../../escape", "must not contain '..'", id="inner-backstep"),
        pytest.param("/etc", "must not be an absolute path", id="absolute"),
        pytest.param("link", "is outside the volume", id="symlink-out"),
    ],
)
async def test_a_sub_path_leaving_the_volume_is_refused(
    tmp_path: Path, subpath: str, message: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with cluster(tmp_path) as (store, kubelet):
        store.create("", "persistentvolumeclaims", NS, {"metadata": {"name": "ckpt"}, "spec": {}})
        claim = kubelet.claim_dir(NS, "ckpt")
        claim.mkdir(parents=True)
        (claim / "link").symlink_to(outside)
        store.create("", "pods", NS, claim_pod("escaper", subpath))
        reason, text = await until(lambda: waiting(store, "escaper"), what="a waiting reason")
        assert reason == "CreateContainerConfigError"
        assert message in text and subpath in text
        assert phase(store, "escaper") == "Pending"
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "cluster" / "pvc" / "escape").exists()
