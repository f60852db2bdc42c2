"""`jupyter kernel-queue` and its subcommands (install, lab, status)."""
