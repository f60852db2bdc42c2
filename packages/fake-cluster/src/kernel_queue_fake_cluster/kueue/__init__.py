"""The fake Kueue for plain pods and pod groups: the pod webhook, the group reconciler, the
scheduler (decided by `kernel_queue.admission`) and the visibility API's pending workloads.

It works on the `apiserver` wing's store and never imports the `node` wing (an import contract).
"""
