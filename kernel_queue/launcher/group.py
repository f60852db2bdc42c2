"""What every pod of a multi-pod kernel knows of its group: the variables the kubernetes backend
sets in the head's and each worker's environment, and their values (pure).

Our own names, and beside them the ones ``torch.distributed``'s ``env://`` rendezvous reads
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, and ``LOCAL_RANK`` 0: one process
per pod), so ``init_process_group`` in the head's cells and in each worker finds its peers with
no argument. Every address is a pod's stable DNS name (its hostname in the group's headless
Service), which follows the pod to its replacement after a preemption or a park. A group of one
pod gets none of these. The kernel reads them as any variable (the launcher passes them on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ENV_RANK = "KERNEL_QUEUE_RANK"
"""This pod's index in the group: 0 is the head, workers are 1 and up."""
ENV_WORLD_SIZE = "KERNEL_QUEUE_WORLD_SIZE"
"""Pods in the group (``pod_group_size``)."""
ENV_HEAD_ADDRESS = "KERNEL_QUEUE_HEAD_ADDRESS"
"""The head pod's DNS name (rank 0), which reaches every port of the head pod."""
ENV_ADDRESSES = "KERNEL_QUEUE_ADDRESSES"
"""Every pod's DNS name, comma-separated in rank order (the head first)."""
TORCH_MASTER_ADDR, TORCH_MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
TORCH_RANK, TORCH_WORLD_SIZE, TORCH_LOCAL_RANK = "RANK", "WORLD_SIZE", "LOCAL_RANK"
DEFAULT_MASTER_PORT = "29500"
"""torch.distributed's own default port, on the head; a kernelspec's ``env`` may set another."""
NAMES = (
    ENV_RANK,
    ENV_WORLD_SIZE,
    ENV_HEAD_ADDRESS,
    ENV_ADDRESSES,
    TORCH_MASTER_ADDR,
    TORCH_MASTER_PORT,
    TORCH_RANK,
    TORCH_WORLD_SIZE,
    TORCH_LOCAL_RANK,
)
"""Every variable of the group, in the order they are set."""


def environment(
    rank: int, addresses: Sequence[str], kernel_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The group's variables for the pod of `rank` in a group whose pods are at `addresses`
    (rank order); ``MASTER_PORT`` is `kernel_env`'s where it sets one, else 29500."""
    size, head = str(len(addresses)), addresses[0]
    port = (kernel_env or {}).get(TORCH_MASTER_PORT) or DEFAULT_MASTER_PORT
    return {
        ENV_RANK: str(rank),
        ENV_WORLD_SIZE: size,
        ENV_HEAD_ADDRESS: head,
        ENV_ADDRESSES: ",".join(addresses),
        TORCH_MASTER_ADDR: head,
        TORCH_MASTER_PORT: port,
        TORCH_RANK: str(rank),
        TORCH_WORLD_SIZE: size,
        TORCH_LOCAL_RANK: "0",
    }
