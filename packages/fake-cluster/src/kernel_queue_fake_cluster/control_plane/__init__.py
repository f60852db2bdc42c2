"""The real control plane under the kube tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the real Kueue, built from Go modules (`build`) and started as envtest
starts them (`plane`), with the node agent (`node`) running the pods as local processes.

It is the reference the fake cluster is held to: a behaviour that differs between the two is a
bug in one of them. It needs Go and the Go module proxy (`build.missing_go` says what is
missing), and writes Kueue's certificates where Kueue reads them (`/etc/kueue/metrics/certs`,
`/visibility`), so it runs as root or where those paths are writable.
"""
