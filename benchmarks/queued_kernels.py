"""Many queued kernels in one server: watch streams, requests/s while waiting, RSS, loop lag.

The fake cluster runs in a child process (so its memory is not the server's) with a GPU quota of
0, so every kernel asking for a GPU waits. This process is the server: one event loop, one
`AsyncKernelManager` per kernel on a kubernetes-backend kernelspec. It measures its RSS after one
warm-up kernel was queued and cancelled (client and informers are then in the baseline), starts
N kernels and waits until each has a queue position, then for a window samples event-loop lag
(a 10 ms sleep loop) and counts the API requests it made (from the cluster's stats). Figures are
printed beside the targets (2,000 kernels positioned within 30 s, <= 2 watch streams per
namespace, <= 1 request/s per LocalQueue, <= 64 KiB per kernel, loop lag p99 <= 20 ms); it
never fails.
Usage: python benchmarks/queued_kernels.py [--kernels 500] [--window 10]
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernel_queue.cli.install import kernel_json

KUBE = kernel_json(
    display_name="queued-gpu", backend="kubernetes", queue="user-queue", gpus=1, image="any"
)
OURS = "app.kubernetes.io/managed-by=kernel-queue"
TICK = 0.010  # the lag probe's sleep


# -- the cluster process: answers each line on stdin with a JSON line; stops at end of input --


async def serve_cluster(root: str) -> None:
    from kernel_queue_fake_cluster.cluster import FakeCluster

    cluster = FakeCluster(root_dir=root, kubelet=False)
    await cluster.start()
    try:
        cluster.setup_queues(quota={"cpu": 1000, "memory": "1Ti", "nvidia.com/gpu": 0})
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


class Cluster:
    """The server's end of the cluster process."""

    async def start(self, root: Path) -> str:
        """Start the process; return its kubeconfig path once it serves."""
        pipe = asyncio.subprocess.PIPE
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve-cluster", str(root), stdin=pipe, stdout=pipe
        )
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
            if not line:
                raise RuntimeError("the fake cluster process ended before it served")
        except BaseException:
            await self.stop()
            raise
        return line.decode().strip()

    async def stats(self) -> dict[str, Any]:
        self.proc.stdin.write(b"stats\n")
        answer: dict[str, Any] = json.loads(await self.proc.stdout.readline())
        answer["requests"] = collections.Counter({(v, r): n for v, r, n in answer["requests"]})
        return answer

    async def stop(self) -> None:
        """End of input stops the cluster; kill it if it has not ended within 30 s."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


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


def queued(km: Any) -> bool:
    """Whether the kernel waits with a known queue position."""
    status = km.provisioner.queue_status() if km.provisioner is not None else None
    return status is not None and status["position"] is not None


async def start_queued(n: int, config: Any, log: logging.Logger, within: float) -> tuple:
    """Start `n` kernels; return their managers and start tasks once all have a position."""
    from jupyter_client.manager import AsyncKernelManager

    kms = [AsyncKernelManager(kernel_name="queued-gpu", config=config, log=log) for _ in range(n)]
    tasks = [asyncio.create_task(km.start_kernel()) for km in kms]
    deadline = time.monotonic() + within
    while not all(queued(km) for km in kms) and time.monotonic() < deadline:
        if any(t.done() for t in tasks):
            break  # a start ended (failed): no point in waiting for it
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


async def main(n: int, window: float, root: Path) -> None:
    import jupyter_client.manager  # noqa: F401  (imported before the first RSS figure)
    from traitlets.config import Config

    import kernel_queue.kube.api  # noqa: F401
    from kernel_queue import backends
    from kernel_queue.backends.kubernetes import KubernetesBackend

    log = logging.getLogger("queued_kernels")
    log.addFilter(_NoCancelled())
    rss_imports = rss_kib()
    cluster = Cluster()
    config = Config({"KubernetesBackend": {"kubeconfig": await cluster.start(root / "cluster")}})
    interval = KubernetesBackend(config=config).position_interval
    kms: list[Any] = []
    tasks: list[asyncio.Task[Any]] = []
    try:
        warm_ends = await cancel_all(*await start_queued(1, config, log, within=60))
        rss_base = rss_kib()

        started = time.perf_counter()
        kms, tasks = await start_queued(n, config, log, within=max(60.0, n * 0.2))
        to_queue = time.perf_counter() - started
        waiting = sum(queued(km) for km in kms)
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
    q = statistics.quantiles(lags, n=100) if len(lags) > 1 else [float("nan")] * 99
    print(f"kernels started: {n}; queued with a position: {waiting} after {to_queue:.1f} s")
    print(f"watch streams open: {after['watches']} (target <= 2 per namespace, 1 namespace)")
    print(f"watch streams peak: {after['peak_watches']} (target <= 2 per namespace)")
    print(
        f"requests/s while waiting: {sum(made.values()) / window:.2f} over {window:g} s "
        f"(target: no per-kernel polling; one visibility read per LocalQueue every "
        f"{interval:g} s = {1 / interval:.2f}/s)"
    )
    for (verb, resource), count in made.most_common():
        print(f"  {verb} {resource}: {count} = {count / window:.2f}/s")
    print(f"RSS after imports: {rss_imports / 1024:.1f} MiB")
    print(f"RSS after the warm-up kernel (baseline): {rss_base / 1024:.1f} MiB")
    print(f"RSS with {waiting} kernels queued: {rss_queued / 1024:.1f} MiB")
    per_kernel = (rss_queued - rss_base) / max(waiting, 1)
    print(f"RSS growth per queued kernel: {per_kernel:.1f} KiB (target <= 100 KiB)")
    ms = [x * 1000 for x in (q[49], q[98], max(lags, default=float("nan")))]
    print(f"event-loop lag, {len(lags)} samples of a {TICK * 1000:.0f} ms sleep:")
    print(f"  p50 {ms[0]:.2f} ms, p99 {ms[1]:.2f} ms (target <= 20 ms), max {ms[2]:.2f} ms")
    print(f"  samples more than 20 ms late: {sum(lag > 0.020 for lag in lags)}")
    print(f"starts ended after cancelling as: {dict(ends)} (warm-up: {dict(warm_ends)})")
    cancel = final["requests"] - after["requests"]
    each = ", ".join(f"{v} {r} {c / n:.1f}" for (v, r), c in sorted(cancel.items()))
    print(f"requests per cancelled kernel: {sum(cancel.values()) / n:.1f} ({each})")
    print(f"kernel objects left in the cluster 2 s after cancelling: {final['left']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=500)
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--serve-cluster", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_cluster:
        asyncio.run(serve_cluster(args.serve_cluster))
        sys.exit()
    with tempfile.TemporaryDirectory() as data:
        folder = Path(data) / "kernels" / "queued-gpu"
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_text(json.dumps(KUBE))
        os.environ["JUPYTER_PATH"] = data
        os.environ["JUPYTER_RUNTIME_DIR"] = str(Path(data) / "runtime")
        asyncio.run(main(args.kernels, args.window, Path(data)))
