"""A fleet of servers in one namespace: what each server's informers cost it and the API server.

Measured on this repository's 2-core machine (load about 1 for the runs of 200 servers, 5 to 8
for the others), one round, so each min/median/max is over the servers (they agree to the last
digit):

    per server                               fake, 200 x 4   real plane, 200 x 2  target (issue 29)
      objects cached (pods + Workloads)          8                 4
      cached / own                               1.0               1.0            <= 2           met
      watch streams open (1 namespace)           2                 2              <= 2           met
      events received per own-kernel change      1.0               1.0
      RSS: informers synced, no kernel         943 KiB           944 KiB
      RSS: its kernels running                1186 KiB          1445 KiB
      requests/s idle (65 s)                     0.045             0.045          <= 0.05        met
                                            (one sweep of the reaper: Services, Secrets and
                                             launcher ConfigMaps; its pods come from the cache)
    API server
      watch streams open                       400 (ours)        407 (400 ours)
      requests/s while the kernels start        63.9 (76 s)       33.1 (95 s)
      requests/s idle                            9.08              9.00 (ours)
      events the servers were sent per change    1.0               0.7            <= 2           met
      events delivered per pod change, every
        watcher (Kueue's, the node's too)        1.0               6.1
      changes per kernel start              3 pod, 4 Workload  6 pod, 8 Workload

`python benchmarks/fleet.py --servers 200 --processes 4 --repeat 1 --idle 65 --stagger 60` (the
800 kernels running 76 s after the first submit, every server had seen its own 3.8 s later) and
`--plane real --servers 200 --kernels-per-server 2 --processes 4 --repeat 1 --idle 65
--stagger 90` (400 running after 95 s, seen 3.1 s later; its node offers a pod for each kernel,
the kubelet's default of 110 would hold the rest Pending). 100 x 4 with every submit at once and
20 x 2 on the real plane met the same targets. Before owner selection
(Kueue copying no label: `--uncopied` shows it again) the fake's 100 x 4 gave 800 objects
cached per server (100 x its own), 100 events delivered per pod change, 0.064 requests/s idle
per server (the reaper listed pods too), and the servers saw the 400 starts 453 s after they ran
(each change written 100 times); every figure grew with the fleet. 200 x 4 with all 800
submits at once met the fake's timeouts on a loaded machine; `--stagger` spreads them as a hub's
users would. The real plane's pods change more per start than the fake's stand-in kubelet makes them
(its scheduler binds, its node reports each condition).

What runs. The fake cluster in a process of its own (`--serve-cluster`, through
`cluster_process.ClusterProcess`), no node agent: a stand-in kubelet in that process marks each
of our pods Running and Ready (one status patch) once Kueue has ungated it, so a kernel's start is
the changes a real one makes to the API (pod created, Workload created and admitted, pod ungated,
pod running) without 800 kernel processes on a small machine. `--servers` `KubernetesBackend`s,
each with its own `owner_id` (`fleet-<i>`), spread over `--processes` worker processes
(`--worker`), all in namespace `default`, LocalQueue `user-queue` (quota for every kernel). Each
server first starts its namespace's informers (as its first kernel would), then, `--repeat`
times: every server submits `--kernels-per-server` GroupSpecs at once (0.1 CPU, no GPU); all are
waited for until Running ("starts"); an idle window of `--idle` seconds; every kernel is released
and waited for until its pods are gone ("ends").

What is counted. Per server, in its worker process: the watch streams its informers opened and
hold, the objects in its caches (`Caches`: the pod and Workload informers) against its own
kernels' objects (pods carrying its owner label, Workloads of its groups), the events its
informers received against those about its own kernels, and RSS (its worker process's growth
since its imports, divided by the servers it holds). On the API server (the fake's own
counters, plus a count of each event written on a watch stream and of each committed change to
our pods and to Workloads): open watch streams, requests/s idle and while kernels start, events
delivered per pod change and per Workload change. Figures over servers and repeats are
min/median/max. No pass/fail: it prints each figure beside its target of issue 29 ("met" or
"MISSED").

`--plane real`: the real control plane (kube-apiserver, etcd, Kueue 0.19, the node agent;
`scripts/control-plane build` first) instead of the fake, through `RealCluster`: the servers
reach it through a `FaultProxy` that counts their requests alone, its pods run a stand-in kernel
that only listens on the readiness probe's port, and the API server's own figures come from its
/metrics.

Usage: python benchmarks/fleet.py [--servers 200] [--kernels-per-server 4] [--processes 4]
       [--repeat 2] [--idle 60] [--stagger 0] [--quick] [--plane fake|real] [--uncopied]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cluster_process import ClusterProcess, RealPlane, queues  # benchmarks/, beside this

NAMESPACE, QUEUE = "default", "user-queue"
IMAGE = "fleet.example/stand-in-kernel:1"
"""The kernels' image: on the real plane, the stand-in kernel (`STAND_IN`)."""
PORTS = (50100, 50101, 50102, 50103, 50104)
"""Every kernel's ports (each pod of the real plane's node has an address of its own)."""
STAND_IN = """#!/bin/sh
# The stand-in kernel: listens on the kernel's shell port (the readiness probe's), nothing else.
exec {python} -c 'import os, socket, time
s = socket.socket()
address = os.environ["KERNEL_QUEUE_LAUNCH_IP"]
s.bind((address, int(os.environ["KERNEL_QUEUE_LAUNCH_PORTS"].split(",")[0])))
s.listen()
time.sleep(10**6)'
"""
UNCOPIED_ENV = "KERNEL_QUEUE_FLEET_UNCOPIED"
"""Set (by `--uncopied`): the fake Kueue copies no label onto Workloads."""
OURS = "app.kubernetes.io/managed-by=kernel-queue"
KUEUE = "kueue.x-k8s.io"
MERGE = "application/merge-patch+json"
WAIT_LIMIT = 900.0  # seconds the fleet's kernels may take to start, or to go
TARGETS = {
    "cached_per_own": ("<= 2 x own objects", 2.0),
    "watches_open": ("<= 2 per namespace", 2.0),
    "idle_rps_per_server": ("<= 0.05 req/s", 0.05),
    "delivered_per_pod_change": ("<= 2", 2.0),
}


def rss_kib() -> float:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


# -- the cluster process: answers each line on stdin with a JSON line; stops at end of input --


async def serve_cluster(root: str) -> None:
    from kernel_queue_fake_cluster.apiserver import watches
    from kernel_queue_fake_cluster.cluster import FakeCluster

    delivered: collections.Counter[str] = collections.Counter()  # "Pod ADDED" -> events written
    changes: collections.Counter[str] = collections.Counter()  # "pods" -> committed changes
    send = watches._send

    async def counted(stream: Any, event: dict[str, Any]) -> None:
        if event["type"] != "BOOKMARK":
            delivered[f"{event['object'].get('kind', '?')} {event['type']}"] += 1
        await send(stream, event)

    watches._send = counted  # every event written on a watch stream, by kind and type
    # Kueue configured as the README asks: our owner label copied onto Workloads.
    cluster = FakeCluster(
        root_dir=root,
        kubelet=False,
        history=100_000,
        label_keys_to_copy=() if os.environ.get(UNCOPIED_ENV) else ("kernel-queue.dev/owner",),
    )
    store = cluster.store

    def kubelet(event: str, pod: dict[str, Any]) -> None:
        """A stand-in kubelet: our ungated, Pending pod becomes Running and Ready."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        if event == "DELETED" or meta.get("deletionTimestamp") or spec.get("schedulingGates"):
            return
        if (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") != "kernel-queue":
            return
        if pod.get("status", {}).get("phase", "Pending") != "Pending":
            return
        status = {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        try:
            now = store.get("", "pods", meta["namespace"], meta["name"])
            if now.get("status", {}).get("phase", "Pending") == "Pending":
                body = {"status": status}
                store.patch(
                    "", "pods", meta["namespace"], meta["name"], body, MERGE, subresource="status"
                )
        except Exception:  # gone meanwhile
            pass

    def count(plural: str) -> Any:
        def listener(event: str, obj: dict[str, Any]) -> None:
            labels = obj["metadata"].get("labels") or {}
            if plural != "pods" or labels.get("app.kubernetes.io/managed-by") == "kernel-queue":
                changes[plural] += 1

        return listener

    await cluster.start()
    try:
        cluster.setup_queues(quota={"cpu": 100_000, "memory": "100Ti", "nvidia.com/gpu": 1})
        store.add_listener("", "pods", count("pods"))
        store.add_listener(KUEUE, "workloads", count("workloads"))
        store.add_listener("", "pods", kubelet)
        print(cluster.kubeconfig, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            stats = cluster.stats
            pods = store.list_objects("", "pods", labels=OURS)[0]
            phases = collections.Counter(p.get("status", {}).get("phase", "Pending") for p in pods)
            answer = {
                "requests": [[*key, n] for key, n in stats.requests.items()],
                "watches": stats.watches,
                "peak_watches": stats.peak_watches,
                "delivered": dict(delivered),
                "changes": dict(changes),
                "pods": len(pods),
                "running": phases["Running"],
                "workloads": len(store.list_objects(KUEUE, "workloads")[0]),
                "time": time.monotonic(),
            }
            print(json.dumps(answer), flush=True)
    finally:
        await cluster.stop()


# -- the real control plane as the fleet's API server -------------------------------------------


class RealCluster:
    """kube-apiserver, etcd, Kueue 0.19 (copying our owner label onto Workloads unless
    `--uncopied`) and the node agent, whose pods run `STAND_IN`; the servers reach it through a
    `FaultProxy` that counts their requests and nobody else's, with the token of
    etc/kubernetes/rbac.yaml's account. `stats()` answers as `ClusterProcess.stats` does, from
    the API server's /metrics: `apiserver_watch_events_total` (events written on watch streams,
    Kueue's and the node agent's too), `apiserver_watch_cache_events_received_total` (changes)
    and `apiserver_longrunning_requests` (open watches of pods and Workloads, theirs too)."""

    def __init__(self, pods: int) -> None:
        self.plane = RealPlane()
        self.pods = pods  # the node's pods: the kubelet's 110 would hold the fleet back
        self.control: Any = None
        self.proxy: Any = None
        self.peak = 0
        self._started = time.monotonic()

    async def start(self, root: Path) -> str:
        import yaml
        from kernel_queue_fake_cluster.control_plane.fault_proxy import FaultProxy
        from kernel_queue_fake_cluster.control_plane.plane import NodeSpec

        stand_in = root / "stand-in-kernel" / "bin"
        stand_in.mkdir(parents=True)
        (stand_in / "python").write_text(STAND_IN.format(python=sys.executable))
        (stand_in / "python").chmod(0o755)
        node = NodeSpec(
            cpu="1000", memory="4000Gi", pods=self.pods, image_paths={IMAGE: str(stand_in)}
        )
        copied = () if os.environ.get(UNCOPIED_ENV) else ("kernel-queue.dev/owner",)
        # the fleet's ClusterQueue: quota for every kernel
        fleet_queues = queues({"cpu": 100_000, "memory": "100Ti", "nvidia.com/gpu": 1})
        await self.plane.start(root, node=node, queues=fleet_queues, label_keys_to_copy=copied)
        self.control = self.plane.control
        self.proxy = await FaultProxy(self.control.url, self.control.pki.ca.cert).start()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": self.proxy.url}}],
            "users": [{"name": "server", "user": {"token": self.plane.token}}],
            "contexts": [
                {"name": "real", "context": {"cluster": "real", "user": "server"}},
            ],
            "current-context": "real",
        }
        path = root / "server-kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return str(path)

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._stats)

    def _stats(self) -> dict[str, Any]:
        admin = self.control.admin
        ours = "app.kubernetes.io/managed-by=kernel-queue"
        pods = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={
            "labelSelector": ours})["items"]  # fmt: skip
        workloads = admin.request("GET", f"/apis/{KUEUE}/v1beta2/namespaces/{NAMESPACE}/workloads")
        metrics = metric_values(admin.request("GET", "/metrics"))

        def total(name: str, resource: str, **labels: str) -> int:
            return sum(
                int(v)
                for key, v in metrics.get(name, {}).items()
                if key.get("resource") == resource
                and all(key.get(k) == x for k, x in labels.items())
            )

        watches = sum(
            total("apiserver_longrunning_requests", r, verb="WATCH") for r in ("pods", "workloads")
        )
        self.peak = max(self.peak, watches)
        ready = [p for p in pods if p.get("status", {}).get("phase") == "Running" and _ready(p)]
        return {
            "time": time.monotonic() - self._started,
            "running": len(ready),
            "pods": len(pods),
            "workloads": len(workloads["items"]),
            "requests": collections.Counter(self.proxy.requests),
            "delivered": {
                "Pod ALL": total("apiserver_watch_events_total", "pods"),
                "Workload ALL": total("apiserver_watch_events_total", "workloads"),
            },
            "changes": {
                "pods": total("apiserver_watch_cache_events_received_total", "pods"),
                "workloads": total("apiserver_watch_cache_events_received_total", "workloads"),
            },
            "watches": watches,
            "peak_watches": self.peak,
        }

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        await self.plane.stop()


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def metric_values(text: str) -> dict[str, dict[Any, float]]:
    """Prometheus text -> metric name -> {labels (a frozen dict) -> value}."""
    found: dict[str, dict[Any, float]] = collections.defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if "=" in part)
        key = _Labels({k: v.strip('"') for k, v in labels.items()})
        found[name][key] = float(value)
    return found


class _Labels(dict[str, str]):
    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


# -- a worker process: some of the fleet's servers, driven by JSON lines on stdin ---------------


class Server:
    """One server of the fleet: its backend and what its informers received."""

    def __init__(self, backend: Any, owner: str, index: int) -> None:
        self.backend, self.owner, self.index = backend, owner, index
        self.refs: list[Any] = []
        self.groups: set[str] = set()  # every group this server ever made
        self.events = self.own_events = 0

    def informers(self) -> tuple[Any, Any]:
        return self.backend._caches._watched[NAMESPACE]  # (pods, Workloads)

    def on_pod(self, event: str, pod: dict[str, Any], old: Any) -> None:
        from kernel_queue.kube import kueue

        self.events += 1
        self.own_events += (pod["metadata"].get("labels") or {}).get(
            kueue.OWNER_LABEL
        ) == self.owner

    def on_workload(self, event: str, workload: dict[str, Any], old: Any) -> None:
        self.events += 1
        self.own_events += workload["metadata"]["name"] in self.groups

    def figures(self) -> dict[str, Any]:
        from kernel_queue.kube import kueue

        pods, workloads = self.informers()
        own_pods = sum(
            (p["metadata"].get("labels") or {}).get(kueue.OWNER_LABEL) == self.owner
            for p in pods.items()
        )
        own_workloads = sum(w["metadata"]["name"] in self.groups for w in workloads.items())
        return {
            "cached": len(pods.items()) + len(workloads.items()),
            "own": own_pods + own_workloads,
            "watches_open": sum(
                i._task is not None and not i._task.done() for i in (pods, workloads)
            ),
            "watches_started": pods.watches + workloads.watches,
            "relists": pods.relists + workloads.relists,
            "events": self.events,
            "own_events": self.own_events,
        }


def group_spec(owner: str) -> Any:
    from kernel_queue.model import ConnectionInfo, GroupSpec

    return GroupSpec(
        kernel_id=str(uuid.uuid4()),
        queue=QUEUE,
        argv=("python", "-c", "pass"),
        connection=ConnectionInfo("", *PORTS, key="k"),
        cpu="100m",
        memory="64Mi",
        namespace=NAMESPACE,
        image=IMAGE,
        backend="kubernetes",
    )


async def worker() -> None:
    import logging

    from kernel_queue.backends.kubernetes import KubernetesBackend
    from kernel_queue.kube.client import api  # noqa: F401  (imported before the RSS baseline)

    logging.getLogger().setLevel(logging.ERROR)
    loop = asyncio.get_running_loop()
    servers: list[Server] = []
    rss_base = rss_kib()

    def answer(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    while line := await loop.run_in_executor(None, sys.stdin.readline):
        order = json.loads(line)
        what = order["do"]
        if what == "start":  # make the servers; each starts its namespace's informers
            for i in order["servers"]:
                owner = f"fleet-{i}"
                backend = KubernetesBackend(
                    kubeconfig=order["kubeconfig"], owner_id=owner, namespace=NAMESPACE
                )
                servers.append(Server(backend, owner, i))
            # As a first kernel would: `submit` starts the namespace's informers this way.
            await asyncio.gather(*(s.backend._watch_namespace(NAMESPACE) for s in servers))
            for s in servers:
                pods, workloads = s.informers()
                pods.add_handler(s.on_pod)
                workloads.add_handler(s.on_workload)
            answer(rss_kib=rss_kib() - rss_base)
        elif what == "submit":

            async def submit(s: Server, kernels: int, after: float) -> None:
                await asyncio.sleep(after)
                specs = [group_spec(s.owner) for _ in range(kernels)]
                s.groups.update(spec.name for spec in specs)
                s.refs += await asyncio.gather(*(s.backend.submit(spec) for spec in specs))

            # Server i of n submits i/n of the way into the stagger window (0: all at once).
            window, n = order["stagger"], order["of"]
            await asyncio.gather(
                *(submit(s, order["kernels"], window * s.index / n) for s in servers)
            )
            answer(ok=True)
        elif what == "release":

            async def release(s: Server) -> None:
                refs, s.refs = s.refs, []
                await asyncio.gather(*(s.backend.release(ref) for ref in refs))

            await asyncio.gather(*(release(s) for s in servers))
            answer(ok=True)
        elif what == "figures":
            answer(servers=[s.figures() for s in servers], rss_kib=rss_kib() - rss_base)
        elif what == "stop":
            await asyncio.gather(*(s.backend.aclose() for s in servers))
            answer(ok=True)
            return


class Worker:
    """The fleet's end of one worker process."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        pipe = asyncio.subprocess.PIPE
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", stdin=pipe, stdout=pipe, limit=2**24
        )

    async def ask(self, **order: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(order).encode() + b"\n")
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a worker process ended early (see its stderr)")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def stop(self) -> None:
        if self.proc is None:
            return
        try:
            await asyncio.wait_for(self.ask(do="stop"), 120)
        except (TimeoutError, RuntimeError):
            self.proc.kill()
        await self.proc.wait()


# -- the fleet -------------------------------------------------------------------------------


async def wait_for(cluster: ClusterProcess | RealCluster, done: Any) -> tuple[dict[str, Any], bool]:
    """Poll the cluster until `done(stats)`, WAIT_LIMIT at most; (the last stats, reached)."""
    deadline = time.monotonic() + WAIT_LIMIT
    while True:
        stats = await cluster.stats()
        if done(stats) or time.monotonic() > deadline:
            return stats, done(stats)
        await asyncio.sleep(0.5)


async def settle(cluster: ClusterProcess | RealCluster, workers: list[Worker]) -> dict[str, Any]:
    """Wait until the watch streams have delivered every event and the servers have applied
    them (the counts of both stand still for a second; WAIT_LIMIT at most): the fake writes each
    stream's events one by one, so they trail the changes by seconds in a large fleet."""
    deadline, last = time.monotonic() + WAIT_LIMIT, None
    while True:
        stats = await cluster.stats()
        servers, _ = await fleet_figures(workers)
        now = (sum(stats["delivered"].values()), sum(s["events"] for s in servers))
        if now == last or time.monotonic() > deadline:
            print(f"  settled: {now[0]} events delivered, {now[1]} received", file=sys.stderr)
            return stats
        last = now
        await asyncio.sleep(1.0)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items()}


def of_kind(counts: dict[str, int], kind: str) -> int:
    return sum(n for key, n in counts.items() if key.split()[0] == kind)


async def fleet_figures(workers: list[Worker]) -> tuple[list[dict[str, Any]], list[float]]:
    answers = await asyncio.gather(*(w.ask(do="figures") for w in workers))
    servers = [s for a in answers for s in a["servers"]]
    per_server_rss = [a["rss_kib"] / max(len(a["servers"]), 1) for a in answers]
    return servers, per_server_rss


async def cycle(
    cluster: ClusterProcess | RealCluster,
    workers: list[Worker],
    n: int,
    k: int,
    idle: float,
    stagger: float,
) -> dict[str, Any]:
    """One round: start every kernel (the servers' submits spread over `stagger` s), idle, end
    every kernel; its figures."""
    total = n * k
    s0 = await settle(cluster, workers)
    before_servers, _ = await fleet_figures(workers)
    await asyncio.gather(*(w.ask(do="submit", kernels=k, stagger=stagger, of=n) for w in workers))
    s1, started = await wait_for(cluster, lambda s: s["running"] >= total)
    print(f"  {s1['running']} running after {s1['time'] - s0['time']:.1f} s", file=sys.stderr)
    s2 = await settle(cluster, workers)  # every server has seen every start
    running_servers, rss = await fleet_figures(workers)
    await asyncio.sleep(idle)
    s3 = await cluster.stats()
    idle_servers, _ = await fleet_figures(workers)
    await asyncio.gather(*(w.ask(do="release") for w in workers))
    s4, gone = await wait_for(cluster, lambda s: s["pods"] == 0 and s["workloads"] == 0)
    s5 = await settle(cluster, workers)
    ended_servers, _ = await fleet_figures(workers)

    def phase(a: dict[str, Any], b: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
        """Requests from a to b (the kernels started, or gone), events from a to c (settled)."""
        sent, made = delta(c["delivered"], a["delivered"]), delta(c["changes"], a["changes"])
        return {
            "seconds": b["time"] - a["time"],
            "settled_s": c["time"] - b["time"],
            "requests": sum((b["requests"] - a["requests"]).values()),
            "pod_changes": made.get("pods", 0),
            "workload_changes": made.get("workloads", 0),
            "pod_events": of_kind(sent, "Pod"),
            "workload_events": of_kind(sent, "Workload"),
        }

    starts, ends = phase(s0, s1, s2), phase(s3, s4, s5)
    idle_requests = s3["requests"] - s2["requests"]
    per_server = []
    for b, r, i, e in zip(
        before_servers, running_servers, idle_servers, ended_servers, strict=True
    ):
        got = e["events"] - b["events"]
        own = e["own_events"] - b["own_events"]
        per_server.append(
            {
                "cached": r["cached"],
                "own": r["own"],
                "cached_per_own": r["cached"] / max(r["own"], 1),
                "watches_open": i["watches_open"],
                "watches_started": i["watches_started"],
                "relists": e["relists"],
                "events_per_own_change": got / max(own, 1),
                "events": got,
            }
        )
    return {
        "started": started,
        "gone": gone,
        "running": s1["running"],
        "starts": starts,
        "ends": ends,
        "idle_s": s3["time"] - s2["time"],
        "idle_requests": {f"{v} {r}": c for (v, r), c in idle_requests.most_common()},
        "idle_rps_per_server": sum(idle_requests.values()) / (s3["time"] - s2["time"]) / n,
        "open_watches": s3["watches"],
        "peak_watches": s3["peak_watches"],
        "servers": per_server,
        "rss_kib_per_server": rss,
        # what the fleet's own watches were sent, per change of a pod or Workload of the round
        "fleet_events_per_change": sum(s["events"] for s in per_server)
        / max(sum(p[c] for p in (starts, ends) for c in ("pod_changes", "workload_changes")), 1),
    }


async def run(
    n: int, k: int, processes: int, repeat: int, idle: float, plane: str, stagger: float
) -> None:
    processes = max(1, min(processes, n))
    with tempfile.TemporaryDirectory() as root:
        cluster: ClusterProcess | RealCluster = (
            RealCluster(pods=max(110, n * k + 10)) if plane == "real" else ClusterProcess(__file__)
        )
        kubeconfig = await cluster.start(Path(root) / "cluster")
        workers = [Worker() for _ in range(processes)]
        rounds: list[dict[str, Any]] = []
        try:
            await asyncio.gather(*(w.start() for w in workers))
            made = time.monotonic()
            started = await asyncio.gather(
                *(
                    w.ask(do="start", kubeconfig=kubeconfig, servers=list(range(p, n, processes)))
                    for p, w in enumerate(workers)
                )
            )
            up = time.monotonic() - made
            rss_empty = [a["rss_kib"] / len(range(p, n, processes)) for p, a in enumerate(started)]
            for r in range(repeat):
                print(f"round {r + 1} of {repeat} ...", file=sys.stderr, flush=True)
                rounds.append(await cycle(cluster, workers, n, k, idle, stagger))
        finally:
            await asyncio.gather(*(w.stop() for w in workers))
            await cluster.stop()
    print(report(n, k, processes, idle, stagger, up, rss_empty, rounds))


def spread(values: list[float], form: str = ".2f") -> str:
    if not values:
        return "-"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{lo:{form}} / {mid:{form}} / {hi:{form}}"


def report(
    n: int,
    k: int,
    processes: int,
    idle: float,
    stagger: float,
    up: float,
    rss_empty: list[float],
    rounds: list,
) -> str:
    servers = [s for r in rounds for s in r["servers"]]

    def row(label: str, values: list[float], form: str = ".2f", target: str = "") -> str:
        text = f"  {label:<52}{spread(values, form):>28}"
        if target in TARGETS:
            words, limit = TARGETS[target]
            met = "met" if values and max(values) <= limit else "MISSED"
            text += f"   target {words} ({met})"
        return text

    starts = [r["starts"] for r in rounds]
    ends = [r["ends"] for r in rounds]
    lines = [
        f"{n} servers x {k} kernels ({n * k} kernels) in one namespace, {processes} worker "
        f"processes, {len(rounds)} rounds, "
        + (f"the servers' submits spread over {stagger:g} s" if stagger else "all submits at once")
        + "; figures min / median / max",
        f"  servers made and their informers synced in {up:.1f} s; every round's kernels "
        f"running: {[r['started'] for r in rounds]}, all gone after: {[r['gone'] for r in rounds]}",
        "per server (over servers x rounds; with its kernels running):",
        row("objects cached (pods + Workloads)", [s["cached"] for s in servers], ".0f"),
        row("its own kernels' objects", [s["own"] for s in servers], ".0f"),
        row("cached / own", [s["cached_per_own"] for s in servers], ".1f", "cached_per_own"),
        row(
            "watch streams open (1 namespace)",
            [s["watches_open"] for s in servers],
            ".0f",
            "watches_open",
        ),
        row("watch streams started so far", [s["watches_started"] for s in servers], ".0f"),
        row("relists so far", [s["relists"] for s in servers], ".0f"),
        row("events received per round", [s["events"] for s in servers], ".0f"),
        row(
            "events received per change of its own kernels",
            [s["events_per_own_change"] for s in servers],
            ".1f",
        ),
        row("RSS, informers synced, no kernel (KiB)", rss_empty, ".0f"),
        row(
            "RSS with the fleet's kernels running (KiB)",
            [x for r in rounds for x in r["rss_kib_per_server"]],
            ".0f",
        ),
        row(
            "requests/s idle",
            [r["idle_rps_per_server"] for r in rounds],
            ".3f",
            "idle_rps_per_server",
        ),
        "API server (over rounds):",
        row("watch streams open", [r["open_watches"] for r in rounds], ".0f"),
        row(
            "requests/s while the kernels start",
            [s["requests"] / s["seconds"] for s in starts],
            ".1f",
        ),
        row("  all running after (s)", [s["seconds"] for s in starts], ".1f"),
        row("  every server had seen them after (s more)", [s["settled_s"] for s in starts], ".1f"),
        row("requests/s idle", [r["idle_rps_per_server"] * n for r in rounds], ".2f"),
        row(
            "requests/s while the kernels end", [s["requests"] / s["seconds"] for s in ends], ".1f"
        ),
        row(
            "events delivered per pod change, every watcher (starts)",
            [s["pod_events"] / max(s["pod_changes"], 1) for s in starts],
            ".1f",
        ),
        row(
            "events delivered per pod change, every watcher (ends)",
            [s["pod_events"] / max(s["pod_changes"], 1) for s in ends],
            ".1f",
        ),
        row(
            "events delivered per Workload change, every watcher (starts)",
            [s["workload_events"] / max(s["workload_changes"], 1) for s in starts],
            ".1f",
        ),
        row(
            "events the fleet's servers were sent per change (round)",
            [r["fleet_events_per_change"] for r in rounds],
            ".1f",
            "delivered_per_pod_change",
        ),
        row("pod changes per kernel (starts)", [s["pod_changes"] / (n * k) for s in starts], ".1f"),
        row(
            "Workload changes per kernel (starts)",
            [s["workload_changes"] / (n * k) for s in starts],
            ".1f",
        ),
        f"idle requests over {idle:g} s, per server per second (last round):",
    ]
    last = rounds[-1]
    lines += [
        f"  {what}: {c / last['idle_s'] / n:.4f}" for what, c in last["idle_requests"].items()
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--kernels-per-server", type=int, default=4)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--idle", type=float, default=60.0, help="idle window (s; 60: a reaper sweep each)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 servers, 2 processes, 1 round, 5 s idle"
    )
    parser.add_argument(
        "--uncopied",
        action="store_true",
        help="Kueue copies no owner label onto Workloads: every server watches them all",
    )
    parser.add_argument("--plane", choices=["fake", "real"], default="fake")
    parser.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="seconds over which the servers' submits are spread (server i at i/n of it; "
        "default 0: every server at once)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-cluster", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.uncopied:  # read by the cluster's process, which inherits it
        os.environ[UNCOPIED_ENV] = "1"
    if args.serve_cluster:
        asyncio.run(serve_cluster(args.serve_cluster))
    elif args.worker:
        asyncio.run(worker())
    else:
        if args.quick:
            args.servers, args.processes, args.repeat, args.idle = 20, 2, 1, 5.0
        asyncio.run(
            run(
                args.servers,
                args.kernels_per_server,
                args.processes,
                args.repeat,
                args.idle,
                args.plane,
                args.stagger,
            )
        )
