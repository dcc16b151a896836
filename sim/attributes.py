"""Plain attribute reads on production's records, in the simulator's process (its speed alone).

Contract:
- ``plain_attribute_reads()`` (once a process; ``runner.run_schedules`` calls it) gives every
  pydantic model class of ``mcpsync`` that has no private attributes, no ``extra="allow"`` and no
  ``__getattr__`` or ``__getattribute__`` of its own CPython's generic attribute lookup, the one a
  class without ``__getattr__`` has. pydantic's ``BaseModel.__getattr__`` serves private attributes
  and extra fields; on such a class it is reached only by a miss, which raises ``AttributeError``
  either way (with the same message). With the hook CPython 3.11 looks ``__getattr__`` and
  ``__getattribute__`` up again on every read of a field and specialises none: about 5,800 reads a
  schedule, 12 % of its instructions (docs/simulation.md, "Speed").
- The lookup is the type's ``tp_getattro`` slot, written through ``ctypes`` at its offset in
  ``PyTypeObject``; the offset is checked first on a class known to have the generic lookup, and on any
  other layout or interpreter no class is changed. Assigning a special method to a class later gives
  it CPython's own slot again. Only a process that runs batches of schedules (``mcpsync simulate``, its
  workers, the simulator's tier) calls it; in one, production's records behave as before, their reads faster.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator

from pydantic import BaseModel

__all__ = ["plain_attribute_reads"]

# ob_refcnt, ob_type, ob_size, tp_name, tp_basicsize, tp_itemsize, tp_dealloc, tp_vectorcall_offset,
# tp_getattr, tp_setattr, tp_as_async, tp_repr, tp_as_number, tp_as_sequence, tp_as_mapping, tp_hash,
# tp_call, tp_str: then tp_getattro.
_GETATTRO = 18 * ctypes.sizeof(ctypes.c_void_p)
_done = False


class _Generic:
    """A class with CPython's generic attribute lookup: where the offset is checked."""


def _slot(cls: type) -> ctypes.c_void_p:
    return ctypes.c_void_p.from_address(id(cls) + _GETATTRO)


def _models(cls: type[BaseModel]) -> Iterator[type[BaseModel]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _models(sub)


def _plain(cls: type[BaseModel]) -> bool:
    """Reads on ``cls`` need no ``__getattr__``: a record of mcpsync with fields alone."""
    if not cls.__module__.startswith("mcpsync.") or cls.__private_attributes__ \
            or cls.model_config.get("extra") == "allow":
        return False
    own = [c for c in cls.__mro__ if c is not BaseModel and c is not object]
    return not any("__getattr__" in vars(c) or "__getattribute__" in vars(c) for c in own)


def plain_attribute_reads() -> int:
    """Give the record classes defined by now the generic lookup (see the module contract); how many."""
    global _done
    if _done:
        return 0
    _done = True
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return 0
    generic = ctypes.cast(ctypes.pythonapi.PyObject_GenericGetAttr, ctypes.c_void_p).value
    if _slot(_Generic).value != generic or _slot(BaseModel).value == generic:
        return 0
    changed = 0
    for cls in set(_models(BaseModel)):
        if _plain(cls):
            _slot(cls).value = generic
            changed += 1
    return changed
