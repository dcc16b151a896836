"""The data converter of mcpsync's Temporal clients and workers.

Contract:
- ``DATA_CONVERTER`` encodes exactly as ``temporalio.contrib.pydantic.pydantic_data_converter``
  (same encodings, same bytes: histories and payloads do not change), but every payload
  converter it makes shares one process-wide cache of pydantic ``TypeAdapter``s.
- Why: the worker makes a payload converter for every workflow run, and the SDK's keeps its own
  cache, so each run built the adapters (and, for a dataclass or a union hint, the whole pydantic
  schema) of every type it decodes, and kept them for as long as it stayed cached.
- The encoding converters themselves are built once per process too and shared by every
  ``SharedAdaptersPayloadConverter``: they hold no per-run state (none takes a serialization
  context), and the worker makes a data converter, and so a payload converter, for every workflow
  activation (``_CommandAwareDataConverter.create``), where building them (a pydantic-core
  ``SchemaSerializer`` among them) was most of the converter's cost.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import DataConverter, EncodingPayloadConverter

__all__ = ["DATA_CONVERTER", "SharedAdaptersPayloadConverter"]

MAX_TYPE_ADAPTERS = 1024  # the SDK's default per converter, now per process

_TYPE_ADAPTERS: functools._lru_cache_wrapper[TypeAdapter[Any]] = functools.lru_cache(
    maxsize=MAX_TYPE_ADAPTERS)(TypeAdapter)


def _encoding_converters() -> tuple[EncodingPayloadConverter, ...]:
    """``PydanticPayloadConverter``'s encoding converters, in its order, the JSON one on the
    process-wide adapter cache."""
    converters = tuple(PydanticPayloadConverter().converters.values())
    for converter in converters:
        if isinstance(converter, PydanticJSONPlainPayloadConverter):
            converter._type_adapter = _TYPE_ADAPTERS
    return converters


_ENCODING_CONVERTERS = _encoding_converters()


class SharedAdaptersPayloadConverter(PydanticPayloadConverter):
    """``PydanticPayloadConverter`` on the process's one set of encoding converters (whose JSON
    converter uses the process-wide adapter cache)."""

    def __init__(self) -> None:
        # PydanticPayloadConverter.__init__ would build the encoding converters anew.
        self._set_converters(*_ENCODING_CONVERTERS)


DATA_CONVERTER = DataConverter(payload_converter_class=SharedAdaptersPayloadConverter)
