"""Observability: Prometheus meters, collectors and health endpoints; the server probe."""

__all__ = ["metrics", "probe"]  # the modules other rooms may import
