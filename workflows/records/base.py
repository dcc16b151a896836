"""The base of every mcpsync record, and the names all records share.

Contract:
- ``FrozenRecord``: immutable, and an unknown field is an error, never ignored.
- ``replaced(record, update)`` is ``record.model_copy(update=update)``: the same fields, fields set,
  extra and private attributes (the same state), made without pydantic's generic copy.
- No record carries a resource body or a credential: content travels as a digest
  (``sha256:<hex>``) plus metadata; bodies live only in the PostgreSQL content store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["DEFAULT_TASK_QUEUE", "FrozenRecord", "replaced"]

R = TypeVar("R", bound=BaseModel)
_set = object.__setattr__

DEFAULT_TASK_QUEUE = "mcpsync"
"""Task queue of the main worker: workflows and ledger activities."""


class FrozenRecord(BaseModel):
    """The base of every mcpsync record: immutable, and unknown fields are an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")



def replaced(record: R, update: Mapping[str, Any]) -> R:
    """``record.model_copy(update=update)`` (no validation of ``update``), made directly: pydantic's
    ``__copy__`` copies each of the record's three containers through the ``copy`` module's dispatch,
    which doubles the cost of a copy, and the in-memory ledger copies its row on every write. A record
    with extra fields or private attributes is ``model_copy``'d."""
    if record.__pydantic_extra__ is not None or getattr(record, "__pydantic_private__", None) is not None:
        return record.model_copy(update=update)
    cls = type(record)
    copied = cls.__new__(cls)
    values = record.__dict__.copy()
    values.update(update)
    fields = record.__pydantic_fields_set__.copy()
    fields.update(update)
    _set(copied, "__dict__", values)
    _set(copied, "__pydantic_extra__", None)
    _set(copied, "__pydantic_fields_set__", fields)
    _set(copied, "__pydantic_private__", None)
    return copied
