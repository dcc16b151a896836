"""`mcpsync serve`: the MCP server per subject over the ledger, its tokens, quota and events."""

__all__ = ["cursors", "quota", "run", "server", "tokens"]  # the modules other rooms may import
