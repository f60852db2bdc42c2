"""The node agent's cluster DNS (`node/dns.py`): which names a pod resolves, on literal objects,
and the names resolving in real pod processes through nss_wrapper, following a replaced pod."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.node import dns
from prerequisites import skip_unless_ci
from test_kubelet import NS, cluster, find, python_pod, until


def service(name: str, ip: str, namespace: str = NS, **spec: object) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterIP": ip, **spec}}


def member(
    name: str,
    hostname: str,
    ip: str,
    *,
    ready: bool = True,
    deleting: bool = False,
    created: str = "2026-01-01T00:00:00Z",
    labels: dict[str, str] | None = None,
) -> Obj:
    meta: Obj = {"name": name, "namespace": NS, "labels": labels or {"group": "g"}}
    meta["creationTimestamp"] = created
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": meta,
        "spec": {"hostname": hostname, "subdomain": "grp"},
        "status": {"phase": "Running", "podIP": ip, "conditions": [condition]},
    }


def ip_of(pod: Obj) -> str | None:
    return pod.get("status", {}).get("podIP")  # type: ignore[no-any-return]


def test_a_pod_resolves_services_and_its_group_s_members_by_their_dns_names() -> None:
    services = [
        service("web", "127.20.0.5"),
        service("db", "127.20.0.6", namespace="other"),
        service("grp", "None", selector={"group": "g"}),
        service("quiet", "None", selector={"group": "q"}),
        {"metadata": {"name": "ext", "namespace": NS}, "spec": {"type": "ExternalName"}},
    ]
    pods = [
        member("head-0", "head", "127.10.0.1"),
        member("w1-0", "w1", "127.10.0.2", ready=False),  # not ready, not published: no name
        member("other", "x", "127.10.0.3", labels={"group": "h"}),  # not selected
    ]
    assert dns.records(services, pods, NS, ip_of) == [
        (
            "127.20.0.5",
            ["web.default.svc.cluster.local", "web.default.svc", "web.default", "web"],
        ),
        ("127.20.0.6", ["db.other.svc.cluster.local", "db.other.svc", "db.other"]),
        (
            "127.10.0.1",
            [
                "head.grp.default.svc.cluster.local",
                "head.grp.default.svc",
                "head.grp.default",
                "head.grp",
            ],
        ),
    ]
    services[2]["spec"]["publishNotReadyAddresses"] = True
    found = dict((names[1], ip) for ip, names in dns.records(services, pods, NS, ip_of))
    assert found["w1.grp.default.svc"] == "127.10.0.2"
    assert "x.grp.default.svc" not in found
    # from another namespace, only the qualified names
    assert (
        "127.10.0.1",
        ["head.grp.default.svc.cluster.local", "head.grp.default.svc", "head.grp.default"],
    ) in dns.records(services, pods, "other", ip_of)


def test_of_two_pods_of_one_name_the_one_not_being_deleted_answers_else_the_newest() -> None:
    services = [service("grp", "None", selector={"group": "g"}, publishNotReadyAddresses=True)]
    old = member("w1-0", "w1", "127.10.0.2", deleting=True, created="2026-01-01T00:00:09Z")
    new = member("w1-1", "w1", "127.10.0.7", ready=False, created="2026-01-01T00:00:01Z")
    newer = member("w1-2", "w1", "127.10.0.8", created="2026-01-01T00:00:02Z")
    for pods, answer in (([old, new], "127.10.0.7"), ([old, new, newer], "127.10.0.8")):
        ((ip, _),) = dns.records(services, pods, NS, ip_of)
        assert ip == answer
    gone = {**newer, "status": {**newer["status"], "phase": "Failed"}}
    assert dns.records(services, [gone], NS, ip_of) == []


RESOLVER = """
    import json, os, socket, sys, time
    last = None
    while True:
        found = {}
        for name in sys.argv[1:]:
            try:
                found[name] = socket.getaddrinfo(name, 1, type=socket.SOCK_STREAM)[0][4][0]
            except OSError:
                found[name] = None
        if found != last:
            print(json.dumps({"resolved": found, "HOSTNAME": os.environ["HOSTNAME"]}), flush=True)
            last = found
        time.sleep(0.02)
"""


async def test_pod_processes_resolve_the_names_and_follow_a_replaced_member(
    tmp_path: Path,
) -> None:
    if dns.find_library() is None:
        skip_unless_ci(f"{dns.LIBRARY} is missing: the pods cannot resolve names ({dns.INSTALL})")
    names = ["w1.grp.default.svc", "w1.grp", "web.default.svc.cluster.local", "web"]
    async with cluster(tmp_path) as (store, kubelet):
        web = store.create("", "services", NS, service("web", "", ports=[{"port": 80}]))
        store.create(
            "",
            "services",
            NS,
            service("grp", "None", selector={"group": "g"}, publishNotReadyAddresses=True),
        )
        subdomain = {"subdomain": "grp"}
        store.create(
            "",
            "pods",
            NS,
            python_pod(
                "head-0", RESOLVER, *names, labels={"group": "g"}, hostname="head", **subdomain
            ),
        )
        sleeper = "import time; time.sleep(60)"
        for name in ("w1-0", "w1-1"):
            store.create(
                "",
                "pods",
                NS,
                python_pod(name, sleeper, labels={"group": "g"}, hostname="w1", **subdomain),
            )
            ip = await until(lambda n=name: (find(store, n) or {}).get("status", {}).get("podIP"))
            if name == "w1-0":
                first = ip
                store.delete("", "pods", NS, "w1-0")  # being deleted: its replacement answers

        def lines() -> list[dict[str, object]]:
            text = kubelet.logs(NS, "head-0") if find(store, "head-0") else ""
            return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

        def answered(ip: str) -> bool:
            return any(line["resolved"]["w1.grp.default.svc"] == ip for line in lines())

        second = find(store, "w1-1")["status"]["podIP"]  # type: ignore[index]
        await until(lambda: answered(second), what="w1 resolving to its replacement")
        last = lines()[-1]
        assert last["HOSTNAME"] == "head"
        assert last["resolved"] == {
            "w1.grp.default.svc": second,
            "w1.grp": second,
            "web.default.svc.cluster.local": web["spec"]["clusterIP"],
            "web": web["spec"]["clusterIP"],
        }
        assert first != second and ipaddress.ip_address(second).is_loopback
        hosts = kubelet.dns.path(NS)
        assert hosts.is_relative_to(tmp_path)
    assert not hosts.exists()
