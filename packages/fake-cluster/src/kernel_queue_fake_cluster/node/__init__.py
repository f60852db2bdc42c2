"""The node agent: one Kubernetes node running its pods' containers as local processes, and the
Service network (each loopback ClusterIP forwarding to its ready pods), as a kubelet and
kube-proxy would.

It talks to its API server only over HTTP(S) (`client.py`, `informer.py`), so one agent serves the
fake API server (in-process, `FakeCluster`) and a real one (`python -m
kernel_queue_fake_cluster.node`, `__main__.py`). It imports neither the `apiserver` wing nor the
`kueue` wing (import contracts); pure helpers it shares with them are in `common`.
"""
