"""``worker/converter.py``: the same bytes as the SDK's pydantic converter; one adapter cache per process."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.worker.converter import DATA_CONVERTER
from mcpsync.workflows.records.catalog import CatalogKey


def test_payloads_are_the_sdks_bytes_and_decode_alike() -> None:
    value = [CatalogKey(subject="team-a", server="docs"), {"n": 1}, None]
    ours = DATA_CONVERTER.payload_converter.to_payloads(value)
    assert ours == pydantic_data_converter.payload_converter.to_payloads(value)
    assert DATA_CONVERTER.payload_converter.from_payloads(ours, [CatalogKey, dict, type(None)]) == value


def test_every_converter_shares_one_adapter_cache() -> None:
    # The worker makes a payload converter per workflow run: a second one must reuse the first's adapters.
    first, second = DATA_CONVERTER.payload_converter_class(), DATA_CONVERTER.payload_converter_class()
    payload = first.to_payloads([CatalogKey(subject="s", server="x")])
    first.from_payloads(payload, [CatalogKey])
    json_first = first.converters[b"json/plain"]  # type: ignore[attr-defined]
    json_second = second.converters[b"json/plain"]  # type: ignore[attr-defined]
    assert json_second._type_adapter is json_first._type_adapter
    hits = json_second._type_adapter.cache_info().hits
    assert second.from_payloads(payload, [CatalogKey]) == [CatalogKey(subject="s", server="x")]
    assert json_second._type_adapter.cache_info().hits == hits + 1
