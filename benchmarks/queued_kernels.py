"""Many queued kernels in one server: positions, watch streams, requests/s while waiting, RSS,
loop lag, at each size asked for (500 and 2,000 by default), side by side with the targets.

Each size runs in a process of its own (a server process measures only itself), with the fake
cluster in a child process of that (so its memory is not the server's) admitting nothing
(manual admission), so every kernel asking for a GPU waits with its queue position (a GPU quota
of 0 would fail each at once: a request its ClusterQueue can never admit, ExceedsMaxQuota).
The server process runs one event loop, one `AsyncKernelManager` per kernel on a
kubernetes-backend kernelspec. It measures its RSS after one warm-up kernel was queued and
cancelled (client and informers are then in the baseline), starts N kernels and waits until
each has a queue position, noting when the last one was submitted, checks that the positions
are 1..N, then for a window samples event-loop lag (a 10 ms sleep loop) and counts the API
requests it made (from the cluster's stats). It never fails; it prints.
Usage: python benchmarks/queued_kernels.py [--kernels 500 2000] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster_process import ClusterProcess  # benchmarks/, beside this script

from kernel_queue.cli.install import kernel_json

KUBE = kernel_json(
    display_name="queued-gpu", backend="kubernetes", queue="user-queue", gpus=1, image="any"
)
OURS = "app.kubernetes.io/managed-by=kernel-queue"
TICK = 0.010  # the lag probe's sleep


# -- the cluster process: answers each line on stdin with a JSON line; stops at end of input --


async def serve_cluster(root: str) -> None:
    from kernel_queue_fake_cluster.cluster import FakeCluster

    cluster = FakeCluster(root_dir=root, kubelet=False, manual_admission=True)
    await cluster.start()
    try:
        cluster.setup_queues(quota={"cpu": 1000, "memory": "1Ti", "nvidia.com/gpu": 1})
        print(cluster.kubeconfig, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            stats, store = cluster.stats, cluster.store
            left = {p: len(store.list_objects("", p, labels=OURS)[0]) for p in ("pods", "services")}
            left["secrets"] = len(store.list_objects("", "secrets", labels=OURS)[0])
            left["workloads"] = len(store.list_objects("kueue.x-k8s.io", "workloads")[0])
            answer = {
                "requests": [[*key, count] for key, count in stats.requests.items()],
                "watches": stats.watches,
                "peak_watches": stats.peak_watches,
                "left": left,
            }
            print(json.dumps(answer), flush=True)
    finally:
        await cluster.stop()


# -- the server process ----------------------------------------------------------------------


def rss_kib() -> float:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


class _NoCancelled(logging.Filter):
    """jupyter_client logs every failed start with its traceback; a cancelled wait is expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        from kernel_queue.errors import LaunchCancelled

        return not (record.exc_info and isinstance(record.exc_info[1], LaunchCancelled))


def position(km: Any) -> int | None:
    """The kernel's place in its queue, as its session says (0: only the queue's length)."""
    session = km.provisioner.kernel_session if km.provisioner is not None else None
    status = session.queue_status() if session is not None else None
    return None if status is None else status["position"]


def queued(km: Any) -> bool:
    """Whether the kernel waits with a known queue position."""
    return bool(position(km))


async def start_queued(n: int, config: Any, log: logging.Logger, within: float) -> tuple:
    """Start `n` kernels; return their managers and start tasks once all have a position."""
    from jupyter_client.manager import AsyncKernelManager

    kms = [AsyncKernelManager(kernel_name="queued-gpu", config=config, log=log) for _ in range(n)]
    tasks = [asyncio.create_task(km.start_kernel()) for km in kms]
    deadline, left = time.monotonic() + within, list(kms)
    while time.monotonic() < deadline:
        left = [km for km in left if not queued(km)]  # each positioned one is asked no more
        if not left or any(t.done() for t in tasks):
            break  # all positioned, or a start ended (failed): no point in waiting for it
        await asyncio.sleep(0.2)
    return kms, tasks


async def cancel_all(kms: list[Any], tasks: list[asyncio.Task[Any]]) -> collections.Counter[str]:
    """Cancel every launch, wait (60 s at most) for the starts to end; count how each ended."""
    await asyncio.gather(*(km.provisioner.cancel_launch() for km in kms if km.provisioner))
    _, pending = await asyncio.wait(tasks, timeout=60) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    ends = collections.Counter(
        "still waiting after 60 s" if t in pending else type(t.exception()).__name__ for t in tasks
    )
    for km in kms:
        await km.cleanup_resources()
    return ends


async def lag_probe(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(TICK)
        lags.append(time.perf_counter() - started - TICK)


TARGETS = {
    "positioned_after_last_submit_s": ("<= 30 s at 2,000", 30.0),
    "watch_streams_peak": ("<= 2 (1 namespace)", 2),
    "requests_per_s_waiting": ("<= 1 (1 LocalQueue)", 1.0),
    "rss_kib_per_kernel": ("<= 64 KiB", 64.0),
    "lag_p99_ms": ("<= 20 ms", 20.0),
}


async def main(n: int, window: float, root: Path) -> dict[str, Any]:
    """One size: the figures of `n` queued kernels, as a dict."""
    import jupyter_client.manager  # noqa: F401  (imported before the first RSS figure)
    from traitlets.config import Config

    import kernel_queue.kube.client.api  # noqa: F401
    from kernel_queue import backends
    from kernel_queue.backends.kubernetes import KubernetesBackend

    submitted: list[float] = []  # when each submit returned (the pods exist)
    submit = KubernetesBackend.submit

    async def timed(self: KubernetesBackend, spec: Any) -> Any:
        ref = await submit(self, spec)
        submitted.append(time.perf_counter())
        return ref

    KubernetesBackend.submit = timed  # type: ignore[method-assign]

    log = logging.getLogger("queued_kernels")
    log.addFilter(_NoCancelled())
    rss_imports = rss_kib()
    cluster = ClusterProcess(__file__)
    config = Config({"KubernetesBackend": {"kubeconfig": await cluster.start(root / "cluster")}})
    interval = KubernetesBackend(config=config).position_interval
    kms: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []
    try:
        warm_ends = await cancel_all(*await start_queued(1, config, log, within=60))
        rss_base = rss_kib()

        submitted.clear()
        started = time.perf_counter()
        kms, tasks = await start_queued(n, config, log, within=max(120.0, n * 0.3))
        positioned = time.perf_counter()
        waiting = sum(queued(km) for km in kms)
        places = sorted(
            km.provisioner.kernel_session.queue_status()["position"] for km in kms if queued(km)
        )
        rss_queued = rss_kib()

        lags: list[float] = []
        stop = asyncio.Event()
        before = await cluster.stats()
        probe = asyncio.create_task(lag_probe(lags, stop))
        await asyncio.sleep(window)
        stop.set()
        await probe
        after = await cluster.stats()
    finally:
        ends = await cancel_all(kms, tasks)
        await backends.aclose_all(asyncio.get_running_loop())
        await asyncio.sleep(2)  # Kueue's clean-up of the deleted Workloads' pods
        final = await cluster.stats()
        await cluster.stop()

    made = after["requests"] - before["requests"]
    cancel = final["requests"] - after["requests"]
    q = statistics.quantiles(lags, n=100) if len(lags) > 1 else [float("nan")] * 99
    last_submit = max(submitted, default=started)
    return {
        "kernels": n,
        "positioned": waiting,
        "positions_are_1_to_n": places == list(range(1, n + 1)),
        "submits_s": last_submit - started,
        "positioned_after_last_submit_s": max(positioned - last_submit, 0.0),
        "watch_streams_open": after["watches"],
        "watch_streams_peak": after["peak_watches"],
        "requests_per_s_waiting": sum(made.values()) / window,
        "requests_waiting": {f"{v} {r}": c / window for (v, r), c in made.most_common()},
        "rss_mib_imports": rss_imports / 1024,
        "rss_mib_base": rss_base / 1024,
        "rss_mib_queued": rss_queued / 1024,
        "rss_kib_per_kernel": (rss_queued - rss_base) / max(waiting, 1),
        "lag_samples": len(lags),
        "lag_p50_ms": q[49] * 1000,
        "lag_p99_ms": q[98] * 1000,
        "lag_max_ms": max(lags, default=float("nan")) * 1000,
        "lag_over_20ms": sum(lag > 0.020 for lag in lags),
        "ends": dict(ends),
        "warm_ends": dict(warm_ends),
        "requests_per_cancelled_kernel": sum(cancel.values()) / n,
        "left": final["left"],
        "interval_s": interval,
        "window_s": window,
    }


def table(results: list[dict[str, Any]]) -> str:
    """The figures of every size side by side, the targets beside them."""

    def row(label: str, key: str, form: str, target: str = "") -> str:
        cells = [format(r[key], form) if form else str(r[key]) for r in results]
        if key in TARGETS:
            limit = TARGETS[key][1]
            met = ["met" if r[key] <= limit else "MISSED" for r in results]
            target += f"   ({', '.join(met)})"
        return f"{label:<44}" + "".join(f"{c:>14}" for c in cells) + f"   {target}"

    head = f"{'kernels queued in one LocalQueue':<44}" + "".join(
        f"{r['kernels']:>14,}" for r in results
    )
    lines = [
        head + "   target",
        row("queued with a position", "positioned", "d"),
        row("positions are exactly 1..N", "positions_are_1_to_n", ""),
        row("submits took (s)", "submits_s", ".1f"),
        row(
            "all positioned, s after the last submit",
            "positioned_after_last_submit_s",
            ".1f",
            TARGETS["positioned_after_last_submit_s"][0],
        ),
        row("watch streams open", "watch_streams_open", "d"),
        row("watch streams peak", "watch_streams_peak", "d", TARGETS["watch_streams_peak"][0]),
        row(
            "requests/s while waiting (pages included)",
            "requests_per_s_waiting",
            ".2f",
            TARGETS["requests_per_s_waiting"][0],
        ),
        row("RSS baseline (MiB)", "rss_mib_base", ".1f"),
        row("RSS with the kernels queued (MiB)", "rss_mib_queued", ".1f"),
        row(
            "RSS per queued kernel (KiB)",
            "rss_kib_per_kernel",
            ".1f",
            TARGETS["rss_kib_per_kernel"][0],
        ),
        row("event-loop lag p50 (ms)", "lag_p50_ms", ".2f"),
        row("event-loop lag p99 (ms)", "lag_p99_ms", ".2f", TARGETS["lag_p99_ms"][0]),
        row("event-loop lag max (ms)", "lag_max_ms", ".2f"),
        row("lag samples more than 20 ms late", "lag_over_20ms", "d"),
        row("requests per cancelled kernel", "requests_per_cancelled_kernel", ".1f"),
    ]
    for r in results:
        lines.append(f"while {r['kernels']:,} waited, over {r['window_s']:g} s, per second:")
        lines += [f"  {what}: {rate:.2f}" for what, rate in r["requests_waiting"].items()]
        lines.append(
            f"  {r['kernels']:,} starts ended after cancelling as {r['ends']} (warm-up: "
            f"{r['warm_ends']}); left 2 s after: {r['left']}"
        )
    return "\n".join(lines)


def run_size(n: int, window: float) -> dict[str, Any]:
    """One size in a fresh process, so that its RSS is its own."""
    found = subprocess.run(
        [sys.executable, __file__, "--one", str(n), "--window", str(window)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(found.stdout.strip().splitlines()[-1])
    return result


def one(n: int, window: float) -> None:
    with tempfile.TemporaryDirectory() as data:
        folder = Path(data) / "kernels" / "queued-gpu"
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_text(json.dumps(KUBE))
        os.environ["JUPYTER_PATH"] = data
        os.environ["JUPYTER_RUNTIME_DIR"] = str(Path(data) / "runtime")
        result = asyncio.run(main(n, window, Path(data)))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-cluster", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_cluster:
        asyncio.run(serve_cluster(args.serve_cluster))
    elif args.one:
        one(args.one, args.window)
    else:
        results = []
        for size in args.kernels:
            print(f"running {size:,} kernels ...", file=sys.stderr, flush=True)
            results.append(run_size(size, args.window))
        print(table(results))
