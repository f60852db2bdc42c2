"""One `admission.schedule` pass at 50, 200 and 1000 groups, in this process (no service).

Two loads on one flavor of 4 GPUs, 64 cores and 1 TiB, as the machine queue service builds it:
`same`, every group asking 1 GPU at priority 0 (benchmarks/machine_queue.py's load; 4 admitted,
the rest waiting), and `mixed`, groups of six shapes, priorities -1..3 and three local queues,
with a quarter of the GPUs held by priority -1 (so higher ones preempt). Each is timed under
every preemption policy and both strategies; the median of repeated passes is printed beside
issue 17's budget for a whole submit or position update (<= 5 ms median at 200 groups).
Usage: python benchmarks/admission_pass.py [--groups 50 200 1000] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kernel_queue import admission

GIB = 2**30
SHAPES = (
    {"gpu": 1},
    {"gpu": 2},
    {"gpu": 4},
    {"gpu": 1, "cpu": 4000, "memory": 16 * GIB},
    {"cpu": 2000, "memory": 8 * GIB},
    {"gpu": 0},
)


def cluster_queue(strategy: str, preemption: str) -> admission.ClusterQueue:
    quota = {"gpu": 4, "cpu": 64000, "memory": 2**40}
    group = admission.ResourceGroup(frozenset(quota), (admission.Flavor("default", quota),))
    return admission.ClusterQueue(
        "default",
        (group,),
        admission.QueueingStrategy(strategy),
        admission.PreemptionPolicy(preemption),
    )


def load(kind: str, groups: int) -> tuple[list[admission.Request], list[admission.Admitted]]:
    """The waiting requests and the admitted workloads of one load."""
    flavors = {"gpu": "default", "cpu": "default", "memory": "default"}
    if kind == "same":
        requests = [
            admission.Request(f"g{i:04d}", "default", {"gpu": 1}, 0, float(i))
            for i in range(groups)
        ]
        held = [admission.Admitted(r, flavors, r.created) for r in requests[:4]]
        return requests[4:], held
    rng = random.Random(17)
    requests = [
        admission.Request(
            f"g{i:04d}",
            rng.choice(["alice", "bob", "carol"]),
            dict(rng.choice(SHAPES)),
            rng.randint(-1, 3),
            float(i),
        )
        for i in range(groups)
    ]
    low = admission.Request("low", "bob", {"gpu": 1}, -1, -1.0)
    held = [admission.Admitted(low, flavors, 0.0)]
    held += [
        admission.Admitted(admission.Request(f"mid{i}", "alice", {"gpu": 1}, 1), flavors, 1.0)
        for i in range(3)
    ]
    return requests, held


def pass_ms(
    cq: admission.ClusterQueue,
    pending: list[admission.Request],
    admitted: list[admission.Admitted],
    seconds: float,
) -> float:
    """The median time of one pass, over as many passes as fit in `seconds` (at least 5)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < deadline:
        start = time.perf_counter()
        admission.schedule(cq, pending, admitted)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--seconds", type=float, default=0.3, help="time spent per figure")
    args = parser.parse_args()
    sizes = "".join(f"{n:>9}" for n in args.groups)
    print("admission.schedule pass, median ms (issue 17: a whole update <= 5 ms at 200 groups)")
    print(f"{'load':<6}{'strategy':<16}{'preemption':<27}{sizes}")
    for kind in ("same", "mixed"):
        for strategy in admission.QueueingStrategy:
            for policy in admission.PreemptionPolicy:
                cq = cluster_queue(strategy, policy)
                figures = "".join(
                    f"{pass_ms(cq, *load(kind, n), args.seconds):>9.2f}" for n in args.groups
                )
                print(f"{kind:<6}{strategy:<16}{policy:<27}{figures}")


if __name__ == "__main__":
    main()
