"""The main process: config, connecting, the event loop, the main worker, its services, revocation
orchestration."""

__all__ = [
    "bulk", "config", "connect", "converter", "event_loop", "revocation", "services", "worker",
]  # the modules other rooms may import
