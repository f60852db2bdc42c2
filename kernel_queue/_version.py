"""The single source of kernel-queue's version (read by hatchling)."""

__version__ = "0.1.0"
