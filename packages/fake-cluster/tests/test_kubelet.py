"""The node agent against the fake API server over HTTP (the agent binding pods itself, as on the
fake plane): real processes, real sockets, bounded waits. Tests write and read objects in the
server's store directly, as a client would over the API."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import stat
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kernel_queue_fake_cluster.apiserver import (
    addresses,
    claim_rules,
    endpoints,
    pod_rules,
    resources,
)
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import Server
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.node import client as node_client
from kernel_queue_fake_cluster.node.agent import NodeAgent

NS = "default"
GATE = "kueue.x-k8s.io/admission"
FINALIZER = "kueue.x-k8s.io/managed"

SERVE = textwrap.dedent(
    """
    import os, socket, sys, time
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((os.environ["POD_IP"], 8765))
    server.listen()
    print("listening", flush=True)
    held = []
    while True:
        client, _ = server.accept()
        client.sendall(os.environ["POD_NAME"].encode() + b"\\n")
        held.append(client)  # open until this process ends
    """
)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Store, Server]]:
    """A store with the core kinds and the API server's own controllers (pod rules, ClusterIPs,
    Endpoints), served over HTTP."""
    store = Store()
    resources.install(store, crds=(), namespaces=(NS,))
    pod_rules.install(store)
    endpoints.install(store)
    addresses.ClusterIPs(store, "127.20.0.0/16").install()
    server = Server(store, bookmark_interval=0.2)
    await server.start()
    try:
        yield store, server
    finally:
        await server.stop()
        store.close_watches()


@contextlib.asynccontextmanager
async def cluster(root: Path, **options: Any) -> AsyncIterator[tuple[Store, NodeAgent]]:
    """`serving()` and a node agent on it that binds pods itself; closed on exit."""
    async with serving() as (store, server):
        options.setdefault("restart_backoff", 0.02)
        options.setdefault("pull_backoff", 0.2)
        options.setdefault("bind", True)
        kubelet = NodeAgent(server.url, root / "cluster", **options)
        try:
            await kubelet.start()
            yield store, kubelet
        finally:
            await kubelet.aclose()


def python_pod(name: str, code: str, *args: str, **spec: Any) -> Obj:
    """A one-container pod running `python -c code args` (restartPolicy Never)."""
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", textwrap.dedent(code)],
        "args": list(args),
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    }
    container.update(spec.pop("container", {}))
    labels = spec.pop("labels", {"app": name})
    meta: Obj = {"name": name, "labels": labels, **spec.pop("metadata", {})}
    return {"metadata": meta, "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def find(store: Store, name: str, plural: str = "pods") -> Obj | None:
    try:
        return store.get("", plural, NS, name)
    except ApiError:
        return None


async def until(check: Callable[[], Any], seconds: float = 15.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


def phase(store: Store, name: str) -> str | None:
    pod = find(store, name)
    return (pod.get("status") or {}).get("phase") if pod else None


def condition(pod: Obj | None, kind: str) -> Obj:
    """The pod's condition of type `kind`, or {}."""
    found = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == kind), {})


def terminated(pod: Obj) -> Obj:
    state: Obj = pod["status"]["containerStatuses"][0]["state"]
    return state["terminated"]  # type: ignore[no-any-return]


def events(store: Store, name: str) -> list[tuple[str, str]]:
    items, _ = store.list_objects("", "events", NS)
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e["message"]) for e in items if e["involvedObject"]["name"] == name]


async def seen(
    store: Store, name: str, check: Callable[[list[tuple[str, str]]], bool]
) -> list[tuple[str, str]]:
    """The pod's events once `check` holds of them (the agent posts Events in order, a moment
    after the status that tells the same)."""
    found: list[tuple[str, str]] = await until(
        lambda: (now := events(store, name)) and check(now) and now, what=f"events of {name}"
    )
    return found


async def logged(kubelet: NodeAgent, name: str, text: str) -> str:
    def check() -> str:
        with contextlib.suppress(node_client.ApiError):
            found = kubelet.logs(NS, name)
            return found if text in found else ""
        return ""

    return str(await until(check, what=f"{text!r} in the log of {name}"))


async def started(store: Store, kubelet: NodeAgent, name: str, text: str) -> Obj:
    """The pod once `text` is in its log and its status says so: Running, its process's
    containerID (the agent's status writes may come a moment after the process prints)."""
    await logged(kubelet, name, text)

    def reported() -> Obj | None:
        pod = find(store, name)
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        running = (pod or {}).get("status", {}).get("phase") == "Running"
        return pod if running and "containerID" in statuses[0] else None

    found: Obj = await until(reported, what=f"{name} Running")
    return found


def remove_gate(store: Store, name: str) -> None:
    pod = store.get("", "pods", NS, name)
    pod["spec"]["schedulingGates"] = []
    store.replace("", "pods", NS, name, pod)


async def test_an_ungated_pod_runs_its_command_with_spec_env_only_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KQ_TEST_PROCESS_ONLY", "leak")
    async with cluster(tmp_path) as (store, kubelet):
        phases: list[str] = []
        store.add_listener("", "pods", lambda kind, o: phases.append(o["status"]["phase"]))
        store.create(
            "",
            "secrets",
            NS,
            {
                "metadata": {"name": "key"},
                "data": {"key": base64.b64encode(b"s3cret").decode()},
                "stringData": {"plain": "text"},
            },
        )
        store.create("", "configmaps", NS, {"metadata": {"name": "cfg"}, "data": {"mode": "fast"}})
        code = """
            import json, os, shutil, sys, time
            time.sleep(0.3)
            print(json.dumps({"env": dict(os.environ), "python": shutil.which("python"),
                              "cwd": os.getcwd(), "argv": sys.argv[1:]}))
        """
        pod = python_pod("env", code, "$(LITERAL)-x", labels={"app": "env", "tier": "gpu"})
        pod["spec"]["containers"][0]["env"] += [
            {"name": "LITERAL", "value": "hello"},
            {"name": "EXPANDED", "value": "$(LITERAL) world $$(LITERAL)"},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "key", "key": "key"}}},
            {"name": "PLAIN", "valueFrom": {"secretKeyRef": {"name": "key", "key": "plain"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "TIER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
        ]
        created = store.create("", "pods", NS, pod)
        assert created["status"]["phase"] == "Pending"

        await until(lambda: phase(store, "env") == "Succeeded", what="Succeeded")
        done = store.get("", "pods", NS, "env")
        report = json.loads(kubelet.logs(NS, "env"))
        env = report["env"]
        await seen(
            store, "env", lambda found: [r for r, _ in found][:2] == ["Scheduled", "Started"]
        )

    assert "Running" in phases
    assert terminated(done)["exitCode"] == 0
    assert terminated(done)["reason"] == "Completed"
    assert done["spec"]["nodeName"] == "fake-node"
    status = done["status"]
    assert status["podIP"].startswith("127.10.")
    assert status["podIPs"] == [{"ip": status["podIP"]}]
    assert status["hostIP"] == "127.0.0.1"
    assert status["startTime"]
    assert condition(done, "PodScheduled")["status"] == "True"
    assert condition(done, "Ready")["reason"] == "PodCompleted"
    assert env["LITERAL"] == "hello"
    assert env["EXPANDED"] == "hello world $(LITERAL)"
    assert (env["SECRET"], env["PLAIN"], env["MODE"]) == ("s3cret", "text", "fast")
    assert (env["POD_NAME"], env["NS"], env["TIER"]) == ("env", NS, "gpu")
    assert (env["POD_IP"], env["UID"]) == (status["podIP"], done["metadata"]["uid"])
    assert env["NODE"] == "fake-node"
    assert "KQ_TEST_PROCESS_ONLY" not in env
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert report["python"] == os.path.join(os.path.dirname(sys.executable), "python")
    assert report["argv"] == ["hello-x"]
    assert Path(report["cwd"]).is_relative_to(tmp_path / "cluster" / "pods")


async def test_a_gated_pod_shows_scheduling_gated_and_starts_once_its_gate_is_removed(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        pod = python_pod("gated", "print('ran')", schedulingGates=[{"name": GATE}])
        created = store.create("", "pods", NS, pod)
        assert created["status"]["phase"] == "Pending"
        assert condition(created, "PodScheduled")["reason"] == "SchedulingGated"
        await asyncio.sleep(0.3)
        waiting = store.get("", "pods", NS, "gated")
        assert waiting["status"]["phase"] == "Pending"
        assert "nodeName" not in waiting["spec"]
        assert "containerStatuses" not in waiting["status"]
        with pytest.raises(node_client.ApiError, match="waiting to start: ContainerCreating"):
            kubelet.logs(NS, "gated")

        remove_gate(store, "gated")
        await until(lambda: phase(store, "gated") == "Succeeded", what="Succeeded")
        done = store.get("", "pods", NS, "gated")
        assert condition(done, "PodScheduled")["status"] == "True"
        assert kubelet.logs(NS, "gated") == "ran\n"


async def test_adding_a_gate_or_changing_the_command_is_rejected_but_a_new_image_is_not(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, _):
        pod = python_pod("fixed", "import time; time.sleep(30)", schedulingGates=[{"name": GATE}])
        store.create("", "pods", NS, pod)
        pod = store.get("", "pods", NS, "fixed")
        pod["spec"]["schedulingGates"].append({"name": "example.com/other"})
        with pytest.raises(ApiError) as added:
            store.replace("", "pods", NS, "fixed", pod)
        assert added.value.code == 422
        assert "only deletion is allowed, but found new scheduling gate" in added.value.message

        pod = store.get("", "pods", NS, "fixed")
        pod["spec"]["containers"][0]["command"] = ["sleep", "1"]
        with pytest.raises(ApiError, match="pod updates may not change fields") as changed:
            store.replace("", "pods", NS, "fixed", pod)
        assert changed.value.code == 422

        pod = store.get("", "pods", NS, "fixed")
        pod["spec"]["containers"][0]["image"] = "python:3.12"
        pod["spec"]["nodeSelector"] = {"gpu": "a100"}  # allowed while gated
        assert store.replace("", "pods", NS, "fixed", pod)["spec"]["nodeSelector"]


async def test_readiness_follows_a_tcp_probe_on_the_pod_ip_by_named_port(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, _):
        pod = kernel_pod("probed", "0.5")
        store.create("", "pods", NS, pod)
        await until(lambda: phase(store, "probed") == "Running", what="Running")
        early = store.get("", "pods", NS, "probed")
        assert condition(early, "Ready")["status"] == "False"
        assert condition(early, "ContainersReady")["reason"] == "ContainersNotReady"

        def ready() -> bool:
            pod = store.get("", "pods", NS, "probed")
            return bool(condition(pod, "Ready")["status"] == "True")

        await until(ready, what="Ready")
        status = store.get("", "pods", NS, "probed")["status"]
        assert status["containerStatuses"][0]["ready"] is True
        reader, writer = await asyncio.open_connection(status["podIP"], 8765)
        assert await reader.readline() == b"probed\n"
        writer.close()
        await writer.wait_closed()


async def test_two_pods_bind_the_same_port_on_their_own_pod_ips(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        for name in ("one", "two"):
            store.create("", "pods", NS, python_pod(name, SERVE))
        for name in ("one", "two"):
            await started(store, kubelet, name, "listening")
        ips = {name: store.get("", "pods", NS, name)["status"]["podIP"] for name in ("one", "two")}
        assert ips["one"] != ips["two"]
        for name, ip in ips.items():
            reader, writer = await asyncio.open_connection(ip, 8765)
            assert await reader.readline() == f"{name}\n".encode()
            writer.close()
            await writer.wait_closed()


TRAP = """
    import signal, sys, time
    code = sys.argv[1]
    if code == "ignore":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    elif code != "default":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(code)))
    print("trapped", flush=True)
    time.sleep(60)
"""


# A container that exits on SIGTERM ends its pod at once: its grace period (600 s) is far longer
# than `until` waits. One that survives SIGTERM is SIGKILLed when its grace period (1 s) is over.
@pytest.mark.parametrize(
    ("on_sigterm", "exit_code", "final_phase", "grace"),
    [
        pytest.param("0", 0, "Succeeded", 600, id="exits-0-succeeded"),
        pytest.param("143", 143, "Failed", 600, id="exits-143-failed"),
        pytest.param("default", 143, "Failed", 600, id="killed-by-sigterm-failed"),
        pytest.param("ignore", 137, "Failed", 1, id="ignores-sigterm-sigkilled-after-grace"),
    ],
)
async def test_graceful_delete_sends_sigterm_and_the_exit_code_sets_the_phase(
    tmp_path: Path, on_sigterm: str, exit_code: int, final_phase: str, grace: int
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        pod = python_pod("victim", TRAP, on_sigterm, terminationGracePeriodSeconds=grace)
        pod["metadata"]["finalizers"] = [FINALIZER]
        store.create("", "pods", NS, pod)
        await started(store, kubelet, "victim", "trapped")
        marked = store.delete("", "pods", NS, "victim")
        assert marked["metadata"]["deletionTimestamp"]
        assert marked["metadata"]["deletionGracePeriodSeconds"] == grace
        assert marked["status"]["phase"] == "Running"

        def final() -> bool:
            found = find(store, "victim")
            grace = (found or {}).get("metadata", {}).get("deletionGracePeriodSeconds")
            return bool(found) and grace == 0

        await until(final, what="the final delete")
        held = store.get("", "pods", NS, "victim")
        assert held["status"]["phase"] == final_phase
        assert terminated(held)["exitCode"] == exit_code
        # SIGTERM came first; the container that ignored it ran on until the SIGKILL (137)
        survived = "ignoring SIGTERM\n" if on_sigterm == "ignore" else ""
        assert kubelet.logs(NS, "victim") == "trapped\n" + survived
        await seen(store, "victim", lambda found: ("Killing", "Stopping container main") in found)

        held["metadata"]["finalizers"] = []
        store.replace("", "pods", NS, "victim", held)
        assert find(store, "victim") is None


async def test_a_pod_deleted_before_it_started_is_removed_at_once(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, _):
        pod = python_pod("never", "print(1)", schedulingGates=[{"name": GATE}])
        store.create("", "pods", NS, pod)
        store.delete("", "pods", NS, "never")
        assert find(store, "never") is None


async def test_logs_serve_a_container_output_with_tail_lines_and_api_errors(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        pod = python_pod("talker", "for i in range(5): print(f'line {i}')")
        pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "side"})
        store.create("", "pods", NS, pod)
        await until(lambda: phase(store, "talker") == "Succeeded", what="Succeeded")
        assert kubelet.logs(NS, "talker", "main", tail_lines=2) == "line 3\nline 4\n"
        assert kubelet.logs(NS, "talker", "side").count("\n") == 5
        assert kubelet.logs(NS, "talker", "main", tail_lines=0) == ""
        with pytest.raises(node_client.ApiError, match="a container name must be") as unnamed:
            kubelet.logs(NS, "talker")
        assert unnamed.value.code == 400
        with pytest.raises(node_client.ApiError, match="container nope is not valid") as unknown:
            kubelet.logs(NS, "talker", "nope")
        assert unknown.value.code == 400
        with pytest.raises(node_client.ApiError) as missing:
            kubelet.logs(NS, "ghost")
        assert missing.value.code == 404


async def test_a_pvc_outlives_its_pod_and_mount_paths_are_rewritten_to_its_directory(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        store.create("", "persistentvolumeclaims", NS, {"metadata": {"name": "ckpt"}, "spec": {}})
        code = """
            import json, os, sys
            target = os.environ["CHECKPOINT_DIR"]
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "state"), "w") as f:
                f.write("saved")
            print(json.dumps({"dir": target, "arg": sys.argv[1],
                              "mount": os.environ["KUBE_FAKE_MOUNT_CHECKPOINTS"]}))
        """
        pod = python_pod(
            "saver",
            code,
            "--out=/checkpoints/y",
            container={
                "volumeMounts": [{"name": "data", "mountPath": "/checkpoints"}],
            },
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "ckpt"}}],
        )
        pod["spec"]["containers"][0]["env"].append(
            {"name": "CHECKPOINT_DIR", "value": "/checkpoints/x"}
        )
        store.create("", "pods", NS, pod)
        await until(lambda: phase(store, "saver") == "Succeeded", what="Succeeded")
        report = json.loads(kubelet.logs(NS, "saver"))
        store.delete("", "pods", NS, "saver")
        await asyncio.sleep(0.1)

    local = tmp_path / "cluster" / "pvc" / NS / "ckpt"
    assert report == {"dir": f"{local}/x", "arg": f"--out={local}/y", "mount": str(local)}
    assert (local / "x" / "state").read_text() == "saved"


async def test_a_pod_whose_claim_is_missing_stays_unschedulable_until_the_claim_exists(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, _):
        volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}]
        store.create("", "pods", NS, python_pod("waits", "print(1)", volumes=volumes))

        def reported() -> bool:
            pod = find(store, "waits")
            return "later" in condition(pod, "PodScheduled").get("message", "")

        await until(reported, what="the missing claim in PodScheduled")
        pod = store.get("", "pods", NS, "waits")
        assert condition(pod, "PodScheduled")["reason"] == "Unschedulable"
        why = ("FailedScheduling", condition(pod, "PodScheduled")["message"])
        await seen(store, "waits", lambda found: why in found)
        store.create("", "persistentvolumeclaims", NS, {"metadata": {"name": "later"}, "spec": {}})
        await until(lambda: phase(store, "waits") == "Succeeded", what="Succeeded")


async def test_a_pod_whose_claim_is_not_bound_stays_unschedulable_until_it_is(
    tmp_path: Path,
) -> None:
    """A claim whose status says Pending (no volume bound: e.g. its StorageClass cannot give
    ReadWriteMany) keeps its pods unscheduled with the scheduler's own words."""
    async with cluster(tmp_path) as (store, _):
        claim = {"metadata": {"name": "shared"}, "spec": {"accessModes": ["ReadWriteMany"]}}
        store.create("", "persistentvolumeclaims", NS, claim)
        pending = {**store.get("", "persistentvolumeclaims", NS, "shared"), "status": {}}
        pending["status"] = {"phase": "Pending"}
        store.replace("", "persistentvolumeclaims", NS, "shared", pending, subresource="status")
        volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]
        store.create("", "pods", NS, python_pod("waits", "print(1)", volumes=volumes))

        def reported() -> str:
            return str(condition(find(store, "waits"), "PodScheduled").get("message", ""))

        message = await until(reported, what="the unbound claim in PodScheduled")
        assert message == (
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
            "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        )
        bound = store.get("", "persistentvolumeclaims", NS, "shared")
        bound["status"] = {"phase": "Bound", "accessModes": ["ReadWriteMany"]}
        store.replace("", "persistentvolumeclaims", NS, "shared", bound, subresource="status")
        await until(lambda: phase(store, "waits") == "Succeeded", what="Succeeded")


async def test_the_fake_binds_a_claim_of_no_class_and_one_naming_a_class_stays_pending(
    tmp_path: Path,
) -> None:
    """As on the real plane (the node agent's provisioner, then the binder): a claim of no
    storage class is bound, one naming a class nobody provides stays Pending and its pod
    unscheduled; whatever status the request carried."""
    async with cluster(tmp_path) as (store, _):
        claim_rules.install(store)
        spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
        plain = {"metadata": {"name": "plain"}, "spec": spec, "status": {"phase": "Lost"}}
        store.create("", "persistentvolumeclaims", NS, plain)
        nfs = {"metadata": {"name": "nfs"}, "spec": {**spec, "storageClassName": "nfs-rwx"}}
        store.create("", "persistentvolumeclaims", NS, nfs)
        bound = store.get("", "persistentvolumeclaims", NS, "plain")
        assert bound["spec"]["volumeName"].startswith("pvc-")
        assert bound["status"] == {
            "phase": "Bound",
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": "1Gi"},
        }
        assert store.get("", "persistentvolumeclaims", NS, "nfs")["status"] == {"phase": "Pending"}
        for name in ("plain", "nfs"):
            volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]
            store.create("", "pods", NS, python_pod(name, "print(1)", volumes=volumes))
        await until(lambda: phase(store, "plain") == "Succeeded", what="Succeeded")
        message = await until(
            lambda: condition(find(store, "nfs"), "PodScheduled").get("message"),
            what="the unbound claim in PodScheduled",
        )
        assert "pod has unbound immediate PersistentVolumeClaims" in message


async def test_empty_dir_and_secret_volumes_are_per_pod_and_removed_with_it(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        store.create("", "secrets", NS, {"metadata": {"name": "conn"}, "stringData": {"key": "k1"}})
        code = """
            import os
            open("/scratch/file".replace("/scratch", os.environ["KUBE_FAKE_MOUNT_SCRATCH"]),
                 "w").write("x")
            print(os.environ["KUBE_FAKE_MOUNT_SCRATCH"], os.environ["KUBE_FAKE_MOUNT_ETC_CONN"])
            print(open(os.environ["KEY_FILE"]).read(), flush=True)
            import time; time.sleep(60)
        """
        pod = python_pod(
            "vols",
            code,
            container={
                "env": [{"name": "KEY_FILE", "value": "/etc/conn/key"}],
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "conn", "mountPath": "/etc/conn", "readOnly": True},
                ],
            },
            volumes=[
                {"name": "scratch", "emptyDir": {}},
                {"name": "conn", "secret": {"secretName": "conn"}},
            ],
            terminationGracePeriodSeconds=1,
        )
        store.create("", "pods", NS, pod)
        text = await logged(kubelet, "vols", "k1")
        scratch, conn = (Path(p) for p in text.splitlines()[0].split())
        assert (scratch / "file").read_text() == "x"
        assert stat.S_IMODE((conn / "key").stat().st_mode) == 0o600
        store.delete("", "pods", NS, "vols")
        await until(lambda: find(store, "vols") is None, what="the pod to go")
        await until(lambda: not scratch.exists() and not conn.exists(), what="the dirs to go")


async def test_an_image_pull_failure_shows_err_image_pull_then_back_off_until_cleared(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        fault = kubelet.fail_image(image="python:*")
        store.create("", "pods", NS, python_pod("pull", "print('pulled')"))

        def waiting(reason: str) -> Obj | None:
            pod = find(store, "pull")
            statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
            found = statuses[0].get("state", {}).get("waiting") or {}
            return found if found.get("reason") == reason else None

        pulled = await until(lambda: waiting("ErrImagePull"), what="ErrImagePull")
        assert 'Failed to pull image "python:3.11"' in pulled["message"]
        backoff = await until(lambda: waiting("ImagePullBackOff"), what="ImagePullBackOff")
        assert backoff["message"] == 'Back-off pulling image "python:3.11"'
        assert phase(store, "pull") == "Pending"
        fault.clear()
        await until(lambda: phase(store, "pull") == "Succeeded", what="Succeeded")


async def test_an_unschedulable_pod_reports_insufficient_gpu_until_the_fault_clears(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        kubelet.unschedulable(selector="app=big")
        store.create("", "pods", NS, python_pod("big", "print(1)"))
        store.create("", "pods", NS, python_pod("small", "print(1)"))

        def unschedulable() -> bool:
            pod = find(store, "big")
            return condition(pod, "PodScheduled").get("reason") == "Unschedulable"

        await until(unschedulable, what="Unschedulable")
        await until(lambda: phase(store, "small") == "Succeeded", what="small Succeeded")
        pod = store.get("", "pods", NS, "big")
        message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        assert condition(pod, "PodScheduled")["message"] == message
        assert pod["status"]["phase"] == "Pending"
        await seen(store, "big", lambda found: ("FailedScheduling", message) in found)
        kubelet.clear_faults()
        await until(lambda: phase(store, "big") == "Succeeded", what="big Succeeded")


async def test_a_missing_secret_or_command_keeps_the_container_waiting(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, _):
        secret = python_pod("nosecret", "print(1)")
        secret["spec"]["containers"][0]["env"].append(
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}
        )
        store.create("", "pods", NS, secret)
        bare = python_pod("bare", "")
        del bare["spec"]["containers"][0]["command"]
        store.create("", "pods", NS, bare)

        def waiting(name: str) -> Obj | None:
            pod = find(store, name)
            statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
            found: Obj | None = statuses[0].get("state", {}).get("waiting")
            return found

        missing = await until(lambda: waiting("nosecret"), what="waiting")
        await until(lambda: (waiting("nosecret") or {}).get("reason") != "ContainerCreating")
        missing = waiting("nosecret")
        assert missing == {
            "reason": "CreateContainerConfigError",
            "message": 'secret "absent" not found',
        }
        no_command = await until(
            lambda: (
                (waiting("bare") or {}).get("reason") == "CreateContainerError" and waiting("bare")
            )
        )
        assert "command" in no_command["message"]
        store.create("", "secrets", NS, {"metadata": {"name": "absent"}, "stringData": {"k": "v"}})
        await until(lambda: phase(store, "nosecret") == "Succeeded", what="Succeeded")


async def test_restart_policy_on_failure_restarts_a_failing_container(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        code = """
            import os, sys
            marker = os.path.join(os.getcwd(), "tries")
            tries = int(open(marker).read()) if os.path.exists(marker) else 0
            open(marker, "w").write(str(tries + 1))
            print("try", tries, flush=True)
            sys.exit(0 if tries >= 2 else 3)
        """
        store.create("", "pods", NS, python_pod("flaky", code, restartPolicy="OnFailure"))
        await until(lambda: phase(store, "flaky") == "Succeeded", what="Succeeded")
        status = store.get("", "pods", NS, "flaky")["status"]["containerStatuses"][0]
        assert status["restartCount"] == 2
        assert status["lastState"]["terminated"]["exitCode"] == 3
        assert kubelet.logs(NS, "flaky").splitlines() == ["try 0", "try 1", "try 2"]


def _session_members(sessions: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[3]) in sessions:  # state, ..., session
                    found.append(int(entry))
    return found


async def test_aclose_leaves_no_process_and_no_listener(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        code = """
            import subprocess, time
            subprocess.Popen(["sleep", "60"])  # a grandchild in the container's session
            print("started", flush=True)
            time.sleep(60)
        """
        store.create("", "pods", NS, python_pod("lingers", code))
        store.create(
            "",
            "services",
            NS,
            {
                "metadata": {"name": "svc"},
                "spec": {"selector": {"app": "lingers"}, "ports": [{"port": 7000}]},
            },
        )
        await started(store, kubelet, "lingers", "started")
        status = store.get("", "pods", NS, "lingers")["status"]
        pid = int(status["containerStatuses"][0]["containerID"].removeprefix("fake://"))
        ip = store.get("", "services", NS, "svc")["spec"]["clusterIP"]
        await until(lambda: kubelet.network.listening(NS, "svc"), what="the listener")
        assert len(_session_members({pid})) == 2

    assert _session_members({pid}) == []
    with pytest.raises(OSError):
        await asyncio.open_connection(ip, 7000)


def kernel_service(store: Store, name: str, **spec: Any) -> Obj:
    """A Service `name` of kernel `k1`'s pods: port 5000 to their `shell` port."""
    ports = [{"name": "shell", "port": 5000, "targetPort": "shell"}]
    body = {"metadata": {"name": name}, "spec": {"selector": {"kernel": "k1"}, "ports": ports}}
    body["spec"].update(spec)
    return store.create("", "services", NS, body)


def kernel_pod(name: str, delay: str, *, period: int = 1) -> Obj:
    """A pod of kernel `k1` serving its name on the `shell` port after `delay` seconds, probed
    for readiness there every `period` seconds."""
    return python_pod(
        name,
        SERVE,
        delay,
        labels={"kernel": "k1"},
        terminationGracePeriodSeconds=1,
        container={
            "ports": [{"name": "shell", "containerPort": 8765}],
            "readinessProbe": {"tcpSocket": {"port": "shell"}, "periodSeconds": period},
        },
    )


async def test_a_service_reaches_the_ready_pod_and_then_its_replacement_at_the_same_address(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        service = kernel_service(store, "kernel")
        ip = service["spec"]["clusterIP"]
        assert ip.startswith("127.20.")
        assert service["spec"]["clusterIPs"] == [ip]
        store.create("", "pods", NS, kernel_pod("first", "0"))
        await until(lambda: kubelet.network.listening(NS, "kernel"), what="the listener")
        reader, writer = await asyncio.open_connection(ip, 5000)  # held until first is ready
        assert await asyncio.wait_for(reader.readline(), 10) == b"first\n"
        first_ip = store.get("", "pods", NS, "first")["status"]["podIP"]
        endpoints = store.get("", "endpoints", NS, "kernel")
        assert endpoints["subsets"] == [
            {
                "addresses": [
                    {
                        "ip": first_ip,
                        "nodeName": "fake-node",
                        "targetRef": {
                            "kind": "Pod",
                            "namespace": NS,
                            "name": "first",
                            "uid": store.get("", "pods", NS, "first")["metadata"]["uid"],
                        },
                    }
                ],
                "ports": [{"name": "shell", "port": 8765, "protocol": "TCP"}],
            }
        ]

        store.delete("", "pods", NS, "first")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # its connection closes
        writer.close()
        await until(lambda: find(store, "first") is None, what="first to go")
        assert "subsets" not in store.get("", "endpoints", NS, "kernel")

        store.create("", "pods", NS, kernel_pod("second", "0.5"))
        reader, writer = await asyncio.open_connection(ip, 5000)

        def not_ready() -> bool:
            subsets = store.get("", "endpoints", NS, "kernel").get("subsets") or [{}]
            return "notReadyAddresses" in subsets[0]

        await until(not_ready, what="a not-ready address")
        assert await asyncio.wait_for(reader.readline(), 10) == b"second\n"
        second_ip = store.get("", "pods", NS, "second")["status"]["podIP"]
        assert second_ip != first_ip
        subsets = store.get("", "endpoints", NS, "kernel")["subsets"]
        assert [a["ip"] for a in subsets[0]["addresses"]] == [second_ip]
        writer.close()
        await writer.wait_closed()


async def test_readiness_is_probed_as_a_kubelet_does_at_the_start_then_every_period(
    tmp_path: Path,
) -> None:
    # The kernel listens 0.3 s after its start; the probe at the start failed, the next comes
    # periodSeconds (5) later: Ready comes then, not as soon as the port opens.
    async with cluster(tmp_path) as (store, kubelet):
        pod = kernel_pod("slow-probe", "0.3", period=5)
        store.create("", "pods", NS, pod)
        await logged(kubelet, "slow-probe", "listening")
        await asyncio.sleep(0.5)
        assert condition(find(store, "slow-probe"), "Ready")["status"] == "False"
        await until(
            lambda: condition(find(store, "slow-probe"), "Ready")["status"] == "True",
            what="Ready at the next period",
        )


async def test_a_service_publishing_not_ready_pods_reaches_one_early_and_a_refusal_ends_at_once(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        service = kernel_service(store, "early", publishNotReadyAddresses=True)
        ip = service["spec"]["clusterIP"]
        pod = kernel_pod("early", "1.5", period=30)
        store.create("", "pods", NS, pod)
        await until(lambda: kubelet.network.listening(NS, "early"), what="the listener")
        await until(lambda: phase(store, "early") == "Running", what="Running")
        # the pod runs, nothing listens yet: the connection ends at once (not held 30 s)
        reader, writer = await asyncio.open_connection(ip, 5000)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await logged(kubelet, "early", "listening")
        reader, writer = await asyncio.open_connection(ip, 5000)
        assert await asyncio.wait_for(reader.readline(), 5) == b"early\n"
        assert condition(find(store, "early"), "Ready")["status"] == "False"
        endpoints = store.get("", "endpoints", NS, "early")
        assert [a["ip"] for a in endpoints["subsets"][0]["addresses"]] == [
            find(store, "early")["status"]["podIP"]
        ]
        writer.close()
        await writer.wait_closed()


async def test_the_termination_message_file_reaches_the_pod_status(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, _kubelet):
        script = (
            "import os, sys; open(os.environ['MSG'], 'w').write('saved 3 variables'); sys.exit(2)"
        )
        pod = {
            "metadata": {"name": "msg"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "python",
                        "command": ["python", "-c", script],
                        "env": [{"name": "MSG", "value": "/dev/termination-log"}],
                    }
                ],
            },
        }
        store.create("", "pods", "default", pod)

        def ended() -> dict[str, Any] | None:
            status = store.get("", "pods", "default", "msg")["status"]
            if status.get("phase") != "Failed":
                return None
            return dict(status["containerStatuses"][0]["state"]["terminated"])

        terminated = await until(ended)
        assert terminated["exitCode"] == 2
        assert terminated["message"] == "saved 3 variables"


async def test_a_config_map_volume_carries_binary_data_byte_for_byte(tmp_path: Path) -> None:
    """A zipapp in a ConfigMap's binaryData, mounted read-only, runs as `python /app/app.pyz`."""
    archive = tmp_path / "app.pyz"
    import zipfile

    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("__main__.py", "print('from the archive', flush=True)\n")
    data = archive.read_bytes()
    async with cluster(tmp_path) as (store, kubelet):
        config = {
            "metadata": {"name": "app"},
            "binaryData": {"app.pyz": base64.b64encode(data).decode()},
        }
        store.create("", "configmaps", NS, config)
        pod = python_pod(
            "zipped",
            "",
            container={
                "command": ["python", "/app/app.pyz"],
                "volumeMounts": [{"name": "app", "mountPath": "/app", "readOnly": True}],
            },
            volumes=[{"name": "app", "configMap": {"name": "app", "defaultMode": 0o444}}],
        )
        store.create("", "pods", NS, pod)
        await logged(kubelet, "zipped", "from the archive")
        await until(lambda: phase(store, "zipped") == "Succeeded", what="Succeeded")


async def test_an_image_without_python_fails_to_start_as_a_real_kubelet_says(
    tmp_path: Path,
) -> None:
    """An image mapped to a bin dir without `python` finds none (never this interpreter): the
    container is terminated StartError 128 with the runtime's `executable file not found`."""
    empty = tmp_path / "no-python" / "bin"
    empty.mkdir(parents=True)
    async with cluster(tmp_path, image_paths={"busybox:*": str(empty)}) as (store, _):
        pod = python_pod("nopython", "print(1)", container={"image": "busybox:1.36"})
        store.create("", "pods", NS, pod)
        await until(lambda: phase(store, "nopython") == "Failed", what="Failed")
        ended = terminated(store.get("", "pods", NS, "nopython"))
        assert ended["exitCode"] == 128
        assert ended["reason"] == "StartError"
        assert 'exec: "python": executable file not found in $PATH' in ended["message"]
        found = await seen(store, "nopython", lambda found: any(r == "Failed" for r, _ in found))
        failed = [m for r, m in found if r == "Failed"]
        assert 'exec: "python": executable file not found in $PATH' in failed[0]


# -- the node agent's API semantics --------------------------------------------------------


async def test_without_bind_the_agent_runs_only_the_pods_a_scheduler_bound_to_its_node(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, bind=False) as (store, kubelet):
        store.create("", "pods", NS, python_pod("waiting", "print('bound later')"))
        store.create("", "pods", NS, python_pod("elsewhere", "print(1)", nodeName="node-2"))
        store.create("", "pods", NS, python_pod("here", "print('here')", nodeName="fake-node"))
        await until(lambda: phase(store, "here") == "Succeeded", what="here Succeeded")
        assert kubelet.logs(NS, "here") == "here\n"
        for name in ("waiting", "elsewhere"):
            status = store.get("", "pods", NS, name)["status"]
            assert (status["phase"], "podIP" in status) == ("Pending", False)
        assert "nodeName" not in store.get("", "pods", NS, "waiting")["spec"]

        binding = {"target": {"kind": "Node", "name": "fake-node"}}  # the scheduler's
        pod_rules.bind(store, NS, "waiting", binding)
        await until(lambda: phase(store, "waiting") == "Succeeded", what="waiting Succeeded")
        assert kubelet.logs(NS, "waiting") == "bound later\n"
        assert store.get("", "pods", NS, "elsewhere")["status"]["phase"] == "Pending"
        assert kubelet.heartbeat.served is False  # the fake serves no Leases: no renewals
        node = store.get("", "nodes", None, "fake-node")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}


async def test_the_agent_binds_through_the_binding_subresource_and_the_scheduled_condition(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, _):
        store.create("", "pods", NS, python_pod("p", "print(1)"))
        await until(lambda: phase(store, "p") == "Succeeded", what="Succeeded")
        pod = store.get("", "pods", NS, "p")
        assert pod["spec"]["nodeName"] == "fake-node"
        assert condition(pod, "PodScheduled") == {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": condition(pod, "PodScheduled")["lastTransitionTime"],
        }


async def test_a_status_write_keeps_the_conditions_other_writers_set(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (store, _):
        pod = python_pod(
            "kept",
            SERVE,
            "0.4",
            terminationGracePeriodSeconds=1,
            container={
                "ports": [{"name": "shell", "containerPort": 8765}],
                "readinessProbe": {"tcpSocket": {"port": "shell"}, "periodSeconds": 1},
            },
        )
        pod["metadata"]["finalizers"] = [FINALIZER]
        store.create("", "pods", NS, pod)
        await until(lambda: phase(store, "kept") == "Running", what="Running")
        found = store.get("", "pods", NS, "kept")
        assert condition(found, "Ready")["status"] == "False"
        target = {"type": "TerminationTarget", "status": "True", "reason": "PreemptedByKueue"}
        found["status"]["conditions"].append(target)  # Kueue's, as an eviction writes it
        store.replace("", "pods", NS, "kept", found, subresource="status")

        await until(lambda: condition(find(store, "kept"), "Ready").get("status") == "True")
        assert condition(find(store, "kept"), "TerminationTarget") == target
        store.delete("", "pods", NS, "kept")

        def final() -> Obj | None:
            found = store.get("", "pods", NS, "kept")
            return found if found["metadata"]["deletionGracePeriodSeconds"] == 0 else None

        ended = await until(final, what="the agent's final delete")
        assert ended["status"]["phase"] == "Failed"  # the default SIGTERM action: 143
        assert condition(ended, "TerminationTarget") == target
        assert condition(ended, "Ready")["status"] == "False"


async def test_a_graceful_delete_keeps_the_pod_until_the_agent_deletes_it_with_grace_0(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (store, kubelet):
        store.create(
            "", "pods", NS, python_pod("slow", TRAP, "0", terminationGracePeriodSeconds=30)
        )
        await started(store, kubelet, "slow", "trapped")
        seen: list[tuple[str, str | None, int | None]] = []

        def record(kind: str, obj: Obj) -> None:
            meta = obj["metadata"]
            seen.append((kind, obj["status"].get("phase"), meta.get("deletionGracePeriodSeconds")))

        store.add_listener("", "pods", record)
        marked = store.delete("", "pods", NS, "slow")
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
        assert find(store, "slow") is not None  # no finalizer, and still it stays
        await until(lambda: find(store, "slow") is None, what="the agent's final delete")
        assert seen[0] == ("MODIFIED", "Running", 30)
        assert ("MODIFIED", "Succeeded", 30) in seen  # the final status, before the delete
        assert seen[-1][:2] == ("DELETED", "Succeeded")

        store.create("", "pods", NS, python_pod("forced", TRAP, "ignore"))
        await started(store, kubelet, "forced", "trapped")
        status = store.get("", "pods", NS, "forced")["status"]
        pid = int(status["containerStatuses"][0]["containerID"].removeprefix("fake://"))
        store.delete("", "pods", NS, "forced", grace_seconds=0)
        assert find(store, "forced") is None  # gone at once; the agent kills what it ran
        await until(lambda: not _session_members({pid}), what="the process to be killed")


async def test_a_deleted_pod_bound_here_that_the_agent_never_ran_is_failed_and_deleted(
    tmp_path: Path,
) -> None:
    async with serving() as (store, server):
        pod = python_pod("orphan", "print(1)", nodeName="fake-node")
        pod["metadata"]["finalizers"] = [FINALIZER]
        store.create("", "pods", NS, pod)
        marked = store.delete("", "pods", NS, "orphan")  # bound: graceful, and no agent yet
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
        agent = NodeAgent(server.url, tmp_path / "node", bind=True)
        await agent.start()
        try:
            await until(
                lambda: (
                    store.get("", "pods", NS, "orphan")["metadata"].get(
                        "deletionGracePeriodSeconds"
                    )
                    == 0
                ),
                what="the agent's final delete",
            )
            assert store.get("", "pods", NS, "orphan")["status"]["phase"] == "Failed"
            assert not (tmp_path / "node" / "pods").exists()  # nothing of it ran
            held = store.get("", "pods", NS, "orphan")
            held["metadata"]["finalizers"] = []
            store.replace("", "pods", NS, "orphan", held)
            assert find(store, "orphan") is None
        finally:
            await agent.aclose()


async def test_the_kubelet_endpoint_serves_container_logs_over_https(tmp_path: Path) -> None:
    """What a real API server proxies `kubectl logs [-f]` to: /containerLogs at the Node's
    kubelet port, over HTTPS with the agent's self-signed certificate."""
    async with cluster(tmp_path, logs_port=0) as (store, kubelet):
        port = kubelet.kubelet_port
        node = store.get("", "nodes", None, "fake-node")
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port > 0
        code = "import time\nfor i in range(3):\n    print('line', i, flush=True); time.sleep(0.3)"
        store.create("", "pods", NS, python_pod("talks", code))
        await logged(kubelet, "talks", "line 0")
        base = f"https://127.0.0.1:{port}/containerLogs/{NS}/talks"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http:
            async with http.get(f"{base}/main", params={"follow": "true"}) as answer:
                assert answer.status == 200
                followed = await asyncio.wait_for(answer.text(), 10)  # ends with the container
            async with http.get(f"{base}/main", params={"tailLines": "1"}) as answer:
                assert await answer.text() == "line 2\n"
            async with http.get(f"{base}/nope") as answer:
                assert answer.status == 400
                assert "container nope is not valid" in await answer.text()
            async with http.get(f"https://127.0.0.1:{port}/healthz") as answer:
                assert await answer.text() == "ok"
        assert followed == "line 0\nline 1\nline 2\n"
