"""The ingress process: session hosts, transport and its bounds, keepalive, heartbeats, the sweep
(resync.py)."""

__all__ = ["process", "session_host"]  # the modules other rooms may import
