"""The fake node: one kubelet running every pod's containers as local processes, and the
Service network (Endpoints, each Service's loopback address forwarding to its ready pods).

It works on the `apiserver` wing's store and never imports the `kueue` wing (an import contract).
"""
