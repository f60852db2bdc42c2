"""The kubernetes backend: each kernel a Kueue-managed pod group (`backend.KubernetesBackend`).

`backend` submits, follows, parks and releases groups; `groups` keeps each group's record and
recomputes its status from the informers' caches; `waits` says why a waiting group waits and
for how long; `settings` holds the traits (`c.KubernetesBackend.<trait>`). What they say to the
cluster comes from `kernel_queue.kube`.
"""

from kernel_queue.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
