"""The embedded dev stack: its state and processes, PostgreSQL, Temporal, `mcpsync up`."""

__all__ = ["common", "running", "temporal", "up"]  # the modules other rooms may import
