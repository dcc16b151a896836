"""The `mcpsync` command line: the root parser, one module per command group, the entry point."""

__all__ = ["start"]  # the modules other rooms may import
