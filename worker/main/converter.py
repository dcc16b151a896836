"""The data converter of mcpsync's Temporal clients and workers.

Contract:
- ``DATA_CONVERTER`` encodes exactly as ``temporalio.contrib.pydantic.pydantic_data_converter``
  (same encodings, same bytes: histories and payloads do not change), but with one process-wide
  cache of pydantic ``TypeAdapter``s.
- The SDK asks ``payload_converter_class()`` for a converter for every workflow run it creates (and
  keeps it while the run stays cached) and for every workflow activation
  (``_CommandAwareDataConverter.create``). Constructing ``SharedAdaptersPayloadConverter``
  returns the process's one instance (the converter keeps no state of a run: its only cache is the
  adapters', and no component takes a serialization context, so ``with_context`` returns it as is).
- Why: with the SDK's own converter, each run built the adapters (and, for a dataclass or a union
  hint, the whole pydantic schema) of every type it decodes and kept them; with adapters shared, a
  run still kept a converter of its own (six converters, a ``SchemaSerializer``): ~1.2 KiB of the
  worker's memory per cached run (docs/benchmarks/journal-2026-12-05.md, "What a subscription keeps in
  the worker").
"""

from __future__ import annotations

import functools
import threading
from typing import Any, ClassVar

from pydantic import TypeAdapter
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import DataConverter

__all__ = ["DATA_CONVERTER", "SharedAdaptersPayloadConverter"]

MAX_TYPE_ADAPTERS = 1024  # the SDK's default per converter, now per process

_TYPE_ADAPTERS: functools._lru_cache_wrapper[TypeAdapter[Any]] = functools.lru_cache(
    maxsize=MAX_TYPE_ADAPTERS)(TypeAdapter)


class SharedAdaptersPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` whose JSON converter uses the process-wide adapter cache; there is one
    per process, which every construction returns."""

    _instance: ClassVar[SharedAdaptersPayloadConverter | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls) -> SharedAdaptersPayloadConverter:
        with cls._lock:
            if cls._instance is None:
                instance = super().__new__(cls)
                PydanticPayloadConverter.__init__(instance)
                for converter in instance.converters.values():
                    if isinstance(converter, PydanticJSONPlainPayloadConverter):
                        converter._type_adapter = _TYPE_ADAPTERS
                cls._instance = instance
            return cls._instance

    def __init__(self) -> None:
        """Nothing: the one instance was built by ``__new__``, and is in use by other runs."""


DATA_CONVERTER = DataConverter(payload_converter_class=SharedAdaptersPayloadConverter)
