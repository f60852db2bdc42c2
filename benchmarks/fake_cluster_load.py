"""300 pods, each its own Kueue pod group, through the fake cluster with the asyncio client.

Prints requests per second for creating the pods, the time until all 300 Workloads exist and are
admitted, and list/get rates on a cluster holding them, so a slowdown in the fake (store,
watch log, Kueue's reconcile passes) shows as a lower figure. No pass/fail: it only prints.
Usage: python benchmarks/fake_cluster_load.py [--pods 300]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from kernel_queue_fake_cluster.cluster import FakeCluster
from kubernetes.aio import client, config


def pod(i: int) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"bench-{i}",
            "labels": {
                "kueue.x-k8s.io/queue-name": "user-queue",
                "kueue.x-k8s.io/pod-group-name": f"bench-{i}",
            },
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": "1"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": "none",
                    "command": ["true"],
                    "resources": {"requests": {"cpu": "10m"}},
                }
            ],
        },
    }


async def run(pods: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        # No kubelet: this measures the API server and Kueue, not process start-up.
        async with FakeCluster(root_dir=Path(root), kubelet=False) as fake:
            fake.setup_queues(quota={"cpu": pods, "memory": "1Ti"})
            api = await config.new_client_from_config(config_file=str(fake.kubeconfig))
            async with api:
                core = client.CoreV1Api(api)
                custom = client.CustomObjectsApi(api)
                started = time.perf_counter()
                for i in range(pods):
                    await core.create_namespaced_pod("default", pod(i))
                created = time.perf_counter() - started
                while True:
                    workloads = await custom.list_namespaced_custom_object(
                        "kueue.x-k8s.io", "v1beta2", "default", "workloads"
                    )
                    admitted = sum(
                        any(
                            c["type"] == "Admitted" and c["status"] == "True"
                            for c in w.get("status", {}).get("conditions", [])
                        )
                        for w in workloads["items"]
                    )
                    if admitted == pods:
                        break
                    await asyncio.sleep(0.05)
                all_admitted = time.perf_counter() - started
                started = time.perf_counter()
                for i in range(pods):
                    await core.read_namespaced_pod(f"bench-{i}", "default")
                gets = time.perf_counter() - started
                started = time.perf_counter()
                for _ in range(20):
                    await core.list_namespaced_pod("default")
                lists = time.perf_counter() - started
    print(f"pods (one group each):       {pods}")
    print(f"create pods:                 {pods / created:8.0f} requests/s")
    print(f"all Workloads admitted after {all_admitted:8.2f} s")
    print(f"get one pod:                 {pods / gets:8.0f} requests/s")
    print(f"list {pods} pods:              {20 / lists:8.1f} requests/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=300)
    asyncio.run(run(parser.parse_args().pods))
