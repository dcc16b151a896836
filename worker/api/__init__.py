"""What host applications import: the answer gate (HOLD/ACCEPT) and the completeness check of a catalog."""

__all__ = ["answer_gate", "completeness"]  # the modules other rooms may import
