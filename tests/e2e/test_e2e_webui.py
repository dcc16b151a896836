"""What an operator sees in the Temporal Web UI for one subscription, on the real stack: static
details with the contract, a summary on every activity, a description on every handler."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions
from tests.conftest import running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record


async def test_static_details_activity_summaries_and_handler_descriptions(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("ui"), transport="http", url=fx.mcp_url, subjects=["alice"],
                          catalog=False)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://ui/{uuid.uuid4().hex}")
        first = await fx.create(key.uri, text="v1")
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                          options=SubscriptionOptions(safety_read_seconds=120))
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           "initial read")

        desc = await handle.describe()
        details = await desc.static_details()
        assert details is not None and key.uri in details \
            and "safety re-read (with subscribe) | 120 s" in details
        # The signals the static details list include resource_read (most of the timeline: ingress reads).
        for name in ("resource_updated", "resource_read", "session_changed", "catalog_reconciled", "revoke",
                     "identity_conflict", "close", "resume", "first_read", "subscription"):
            assert f"`{name}`" in details, name
        assert await desc.static_summary() == f"{key.server} {key.subject} {key.uri}"

        summaries = []
        async for event in handle.fetch_history_events():
            # Ledger calls are local activities: their summary is on the marker.
            if event.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                                    EventType.EVENT_TYPE_MARKER_RECORDED) \
                    and event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
                summaries.append(pydantic_data_converter.payload_converter.from_payload(
                    event.user_metadata.summary, str))
        # One activity subscribes, marks ACTIVE and makes the initial read: the ordinal is
        # not known when it is scheduled, so its summary names the steps; the ordinal is in the details panel.
        assert f"subscribe {key.uri} (subscribe, mark active, initial read)" in summaries, summaries
        # A new run's ensure, session lookup and begin are one local activity (ledger_start_subscription).
        assert f"start subscription {key.uri}" in summaries, summaries
        assert not any(s.startswith(("mark active", "read ")) for s in summaries), summaries

        meta = await handle.query("__temporal_workflow_metadata")
        definition = meta.definition
        described = {d.name: d.description
                     for d in [*definition.signal_definitions, *definition.query_definitions,
                                                     *definition.update_definitions]}
        for name in ("resource_updated", "session_changed", "catalog_reconciled", "revoke",
                     "identity_conflict", "close", "resume", "subscription"):
            assert described.get(name), f"{name} has no description: {described}"

        # The current details: freshness first (what the page is for), one "label: **value**" a line
        # (a table's cells ran into their labels: "reads39").
        current = meta.current_details
        lines = dict(line[2:].split(": ", 1) for line in current.splitlines() if line.startswith("- "))
        assert lines["staleness bound"] == ("**120 s (safety read period, kept by the ingress's ledger sweep;"
                                            " a notification is read sooner)**")
        for label in ("last accepted at", "last verified at"):
            assert lines[label].endswith(" UTC**") and lines[label] != "**-**", (label, current)
        # The ledger schedules its safety reads: the run names that and its watchdog, no deadline of its own.
        assert lines["next read due"].startswith("**by the ledger's schedule (the watchdog looks every 6 h, "
                                                 "next at ") and lines["next read due"].endswith(" UTC)**"), \
            current
        assert lines["reads issued"] == "**1**" and lines["last receipt"] != "**-**"
        assert "|" not in current


async def test_answer_gate_workflow_ids_are_readable(temporal_client: Client, ledger: Ledger) -> None:
    import pytest

    from mcpsync.worker.api.answer_gate import AnswerGate, AnswerGateError
    from mcpsync.workflows.answer_rules import AnswerDependency
    from mcpsync.workflows.names import answer_workflow_id

    answer_id = f"Escalation answer #{uuid.uuid4().hex[:6]}"
    async with running_services(temporal_client, ledger, []) as cfg:
        gate = AnswerGate(temporal_client, cfg.temporal.task_queue)
        with pytest.raises(AnswerGateError, match="does not exist"):  # the workflow runs; the bind is refused
            await gate.bind(answer_id, "who is on call?",
                            [AnswerDependency(subject="a", server="s", uri="demo://x",
                                                                            receipt_id=10**9)])
        desc = await temporal_client.get_workflow_handle(answer_workflow_id(answer_id)).describe()
        assert desc.id.startswith(f"mcpsync-answer/escalation-answer-{answer_id[-6:]}-")
    assert answer_workflow_id("Escalation answer #7").startswith("mcpsync-answer/escalation-answer-7-")
    assert answer_workflow_id("a") != answer_workflow_id("b") \
        and answer_workflow_id("a") == answer_workflow_id("a")
    assert answer_workflow_id("???").startswith("mcpsync-answer/") and "--" not in answer_workflow_id("???")


async def test_each_workflow_type_has_its_own_state_attribute(temporal_client: Client, ledger: Ledger,
                                                              fx: FixtureProcess) -> None:
    # McpState is the subscription's vocabulary only; a catalog's status is McpCatalogState.
    from temporalio.common import SearchAttributeKey

    from mcpsync.activities.starters import start_catalog
    from mcpsync.workflows.records.catalog import CatalogKey
    from tests.conftest import eventually

    server = ServerConfig(name=unique("ui"), transport="http", url=fx.mcp_url, subjects=["alice"],
                          catalog=False)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_catalog(temporal_client, CatalogKey(subject="alice", server=server.name),
                                     task_queue=cfg.temporal.task_queue)

        async def upserted_by_the_workflow() -> str | None:
            attrs = (await handle.describe()).typed_search_attributes
            value = attrs.get(SearchAttributeKey.for_keyword("McpCatalogState"))
            return value if value not in (None, "STARTING") else None  # STARTING is the starter's

        state = await eventually(upserted_by_the_workflow, what="McpCatalogState upserted")
        assert state in ("NO_SESSION", "SCANNING_A", "SCANNING_B", "PUBLISHING", "SNAPSHOT_UNPROVEN",
                         "SNAPSHOT_PROVEN", "BACKOFF"), state
        attrs = (await handle.describe()).typed_search_attributes
        assert attrs.get(SearchAttributeKey.for_keyword("McpState")) is None
        await handle.terminate("test over")
