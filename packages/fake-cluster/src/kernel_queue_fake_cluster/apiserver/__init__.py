"""The fake API server: what kube-apiserver keeps and serves.

The object store (metadata, resourceVersions, finalizers, the status subresource, watches), the
HTTP layer (paths, discovery, patch content types, `Status` errors, injected faults), RBAC, the
built-in kinds and CRDs with their schemas, and the admission the apiserver itself runs (pod
rules, ServiceAccount and Pod Security, Service ClusterIPs). It imports neither `node` nor
`kueue` (an import contract): they plug into it through the store's hooks and the server's
routes.
"""
