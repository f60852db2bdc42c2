"""Kubernetes and Kueue for the kubernetes backend, in rooms by role.

- `kueue`: every key we use, Kueue's and ours, and pure readers of them; `names`: object names
  Kubernetes accepts. Both are pure and every role uses them.
- `client/`: talking to the API server: the `KubeApi` verbs and their errors (`verbs`), their
  one implementation over the Kubernetes client (`api`, the only importer of that client),
  retries, the sentence of a failed call (`explain`), and the shared informers and their caches.
- `objects/`: what we create for a kernel: pure builders of its Secret, Service and pods
  (`manifests`, `templates`, `pod_policy`), the checks before creating (`preflight`), creating
  them as ours (`ownership`, `submission`), replacement pods, and the launcher archive and its
  delivery.
- `queueing/`: where a group stands in Kueue: its status from its Workload and pods, why it
  waits (`reasons`, `local_queues`), its place (`positions`), a queue's use (`capacity`), why
  its pod could not start (`launch_failures`), parking (`activation`) and the API versions each
  Kueue release serves (`kueue_versions`).
- `deletion/`: ending what we made: a kernel's objects (`cleanup`), what a crashed server left
  and failed deletions handed over (`reaper`), a parked kernel's checkpoints (`janitor`).
"""
