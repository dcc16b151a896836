"""``worker/main/converter.py``: the same bytes as the SDK's pydantic converter; one converter and one adapter
cache per process."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import ActivitySerializationContext, WorkflowSerializationContext

from mcpsync.worker.main.converter import DATA_CONVERTER, SharedAdaptersPayloadConverter
from mcpsync.workflows.records.catalog import CatalogKey


def test_payloads_are_the_sdks_bytes_and_decode_alike() -> None:
    value = [CatalogKey(subject="team-a", server="docs"), {"n": 1}, None]
    ours = DATA_CONVERTER.payload_converter.to_payloads(value)
    assert ours == pydantic_data_converter.payload_converter.to_payloads(value)
    assert DATA_CONVERTER.payload_converter.from_payloads(ours, [CatalogKey, dict, type(None)]) == value


def test_every_run_gets_the_process_converter_and_its_adapter_cache() -> None:
    # The worker asks payload_converter_class() for a converter per workflow run: it gets the one the data
    # converter itself wraps, whose adapters are reused from one decode to the next.
    first, second = DATA_CONVERTER.payload_converter_class(), SharedAdaptersPayloadConverter()
    assert first is second
    assert DATA_CONVERTER.payload_converter._inner_payload_converter is first  # type: ignore[attr-defined]
    payload = first.to_payloads([CatalogKey(subject="s", server="x")])
    first.from_payloads(payload, [CatalogKey])
    adapters = first.converters[b"json/plain"]._type_adapter  # type: ignore[attr-defined]
    hits = adapters.cache_info().hits
    assert second.from_payloads(payload, [CatalogKey]) == [CatalogKey(subject="s", server="x")]
    assert adapters.cache_info().hits == hits + 1


def test_a_serialization_context_keeps_the_shared_converter() -> None:
    # The SDK binds a converter to each run's and each activity's context: no component takes one, so
    # binding makes no copy (a copy would be kept per cached run again).
    workflow_ctx = WorkflowSerializationContext(namespace="default", workflow_id="wf")
    activity_ctx = ActivitySerializationContext(namespace="default", activity_id="1", activity_type="a",
                                                activity_task_queue="q", workflow_id="wf",
                                                workflow_type="W", is_local=True)
    converter = DATA_CONVERTER.payload_converter
    assert converter.with_context(workflow_ctx) is converter  # type: ignore[attr-defined]
    assert converter.with_context(activity_ctx) is converter  # type: ignore[attr-defined]
