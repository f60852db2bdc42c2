"""Kubernetes and Kueue for the kubernetes backend: every key and pure readers (`kueue`), object
names (`names`) and pure builders of a kernel's Secret, Service and pods (`manifests`). Only
`api` imports the Kubernetes client; the modules named here do no I/O.
"""
