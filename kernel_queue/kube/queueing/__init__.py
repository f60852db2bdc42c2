"""Where a kernel's pod group stands in Kueue, why it waits and where, in the words a user reads
(see `kernel_queue.kube`)."""
