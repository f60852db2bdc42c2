"""A fake Kubernetes cluster for tests: API server, Kueue pod-group controller, kubelet.

Nothing in kernel_queue's production code imports this package.
"""
