"""The data converter of mcpsync's Temporal clients and workers.

Contract:
- ``DATA_CONVERTER`` encodes exactly as ``temporalio.contrib.pydantic.pydantic_data_converter``
  (same encodings, same bytes: histories and payloads do not change), but every payload
  converter it makes shares one process-wide cache of pydantic ``TypeAdapter``s.
- Why: the worker makes a payload converter for every workflow run, and the SDK's keeps its own
  cache, so each run built the adapters (and, for a dataclass or a union hint, the whole pydantic
  schema) of every type it decodes, and kept them for as long as it stayed cached.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import DataConverter

__all__ = ["DATA_CONVERTER", "SharedAdaptersPayloadConverter"]

MAX_TYPE_ADAPTERS = 1024  # the SDK's default per converter, now per process

_TYPE_ADAPTERS: functools._lru_cache_wrapper[TypeAdapter[Any]] = functools.lru_cache(
    maxsize=MAX_TYPE_ADAPTERS)(TypeAdapter)


class SharedAdaptersPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` whose JSON converter uses the process-wide adapter cache."""

    def __init__(self) -> None:
        super().__init__()
        for converter in self.converters.values():
            if isinstance(converter, PydanticJSONPlainPayloadConverter):
                converter._type_adapter = _TYPE_ADAPTERS


DATA_CONVERTER = DataConverter(payload_converter_class=SharedAdaptersPayloadConverter)
