"""The base of every mcpsync record, and the names all records share.

Contract:
- ``FrozenRecord``: immutable, and an unknown field is an error, never ignored.
- No record carries a resource body or a credential: content travels as a digest
  (``sha256:<hex>``) plus metadata; bodies live only in the PostgreSQL content store.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["DEFAULT_TASK_QUEUE", "FrozenRecord"]

DEFAULT_TASK_QUEUE = "mcpsync"
"""Task queue of the main worker: workflows and ledger activities."""


class FrozenRecord(BaseModel):
    """The base of every mcpsync record: immutable, and unknown fields are an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

