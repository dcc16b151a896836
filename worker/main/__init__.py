"""The main process: config, connecting, the main worker, its services, revocation orchestration."""

__all__ = [
    "bulk", "config", "connect", "converter", "revocation", "services", "worker",
]  # the modules other rooms may import
