"""The local backend: Kueue's queue semantics on one workstation (`backend.LocalBackend`).

`backend` submits, follows, parks and releases groups; `groups` keeps each kernel's record and
what its launcher's life means for it; `process` runs one launcher subprocess; `machine_link`
is the line to the machine's queue service; `quota` puts the machine in `admission.py`'s terms;
`ports` holds a waiting kernel's ports; `records` keeps what a dead server left to reap;
`gpus` finds the machine's GPUs; `settings` holds the traits (`c.LocalBackend.<trait>`).
"""

from kernel_queue.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
