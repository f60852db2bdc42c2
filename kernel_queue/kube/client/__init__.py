"""Talking to the API server: the `KubeApi` verbs, their implementation, retries, failures in
words, and the shared informers (see `kernel_queue.kube`)."""
