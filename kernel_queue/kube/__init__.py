"""Kubernetes and Kueue for the kubernetes backend: every key and pure readers (`kueue`), object
names (`names`) and pure builders of a kernel's Secret, Service and pods (`manifests`). The API
seam is `verbs` (the `KubeApi` protocol and the errors its calls raise); only `api`, its
implementation, imports the Kubernetes client. The modules named here do no I/O.
"""
