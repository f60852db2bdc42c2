"""One queue per machine and user: the queue service, its protocol and its client (issue 17).

`protocol` is the wire format, `service` the process that owns the machine's queue and runs
`admission.schedule` for every client, `client` what a backend calls (it starts the service on
first use). Nothing is imported here, so `python -m kernel_queue.machine` stays small.
"""
