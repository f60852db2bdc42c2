"""Ending what kernel-queue made: a kernel's objects, what a crashed server left, a parked
kernel's checkpoints (see `kernel_queue.kube`)."""
