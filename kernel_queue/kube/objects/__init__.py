"""What kernel-queue creates for a kernel, built, checked and created as ours (see
`kernel_queue.kube`)."""
