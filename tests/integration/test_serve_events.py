"""The Events extension's poll on a real ledger (a fresh database: it moves retention's marker):
cursor resume, hasMore paging, subject isolation, ``truncated: true`` below what retention pruned or
before the ``maxAgeMs`` floor; an ``overdue`` outbox event is no ``resource.changed`` event."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError
from psycopg.rows import dict_row

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.outbox import OutboxEventType, event_from_row
from mcpsync.worker.serve.cursors import CursorSigner
from mcpsync.worker.serve.events import EventsPollParams, poll_events
from mcpsync.worker.serve.server import ServeConfig, ServeHub


async def _emit(ledger: Ledger, subject: str, n: int) -> None:
    async with ledger.pool.connection() as conn:
        for i in range(n):
            await conn.execute(
                "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, content_digest,"
                " read_ordinal, detail)"
                " VALUES ('version_accepted', %s, %s, 's', %s, %s, %s, '{}'::jsonb)",
                (f"wf-{subject}", subject, f"demo://{subject}", f"sha256:{subject}{i}", i + 1),
            )


def _params(
    cursor: str | None, max_events: int = 100, name: str = "resource.changed", max_age_ms: int | None = None
) -> EventsPollParams:
    return EventsPollParams.model_validate(
        {"name": name, "cursor": cursor, "maxEvents": max_events, "maxAgeMs": max_age_ms}
    )


async def test_poll_resumes_pages_isolates_and_truncates(private_ledger: Ledger) -> None:
    hub = ServeHub(ServeConfig(), private_ledger.pool, CursorSigner(b"k" * 32))
    start = await poll_events(hub, "alice", _params(None))
    assert start["events"] == [] and start["truncated"] is False
    await _emit(private_ledger, "alice", 5)
    await _emit(private_ledger, "bob", 3)
    got, cursor = [], start["cursor"]
    while True:
        page = await poll_events(hub, "alice", _params(cursor, max_events=2))
        got += page["events"]
        cursor = page["cursor"]
        if not page["hasMore"]:
            break
    assert [e["data"]["content_digest"] for e in got] == [f"sha256:alice{i}" for i in range(5)]
    assert len({e["eventId"] for e in got}) == 5 and all(e["data"]["subject"] == "alice" for e in got)
    assert (await poll_events(hub, "alice", _params(cursor)))["events"] == []  # nothing twice
    # Resume from an event's own cursor: exactly what came after it.
    again = await poll_events(hub, "alice", _params(got[2]["cursor"]))
    assert [e["eventId"] for e in again["events"]] == [e["eventId"] for e in got[3:]]
    with pytest.raises(MCPError) as foreign:
        await poll_events(hub, "bob", _params(cursor))
    assert foreign.value.code == -32602
    with pytest.raises(MCPError) as unknown:
        await poll_events(hub, "alice", _params(None, name="nope"))
    assert unknown.value.code == -32011
    # Retention pruned beyond the client's cursor: truncated, then the events still kept.
    async with private_ledger.pool.connection() as conn:
        fourth = await (await conn.execute("SELECT position FROM outbox WHERE subject = 'alice'"
                                           " ORDER BY position OFFSET 3 LIMIT 1")).fetchone()
        assert fourth is not None
        await conn.execute("UPDATE outbox_state SET pruned_through = %s", (fourth[0],))
    late = await poll_events(hub, "alice", _params(start["cursor"]))
    assert late["truncated"] is True
    assert [e["eventId"] for e in late["events"]] == [got[4]["eventId"]]


async def test_max_age_ms_floors_the_replay(private_ledger: Ledger) -> None:
    hub = ServeHub(ServeConfig(), private_ledger.pool, CursorSigner(b"k" * 32))
    start = await poll_events(hub, "alice", _params(None))
    await _emit(private_ledger, "alice", 3)
    async with private_ledger.pool.connection() as conn:  # the first two are an hour old
        await conn.execute(
            "UPDATE outbox SET created_at = now() - interval '1 hour' WHERE content_digest IN"
            " ('sha256:alice0', 'sha256:alice1')"
        )
    floored = await poll_events(hub, "alice", _params(start["cursor"], max_age_ms=60_000))
    assert [e["data"]["content_digest"] for e in floored["events"]] == ["sha256:alice2"]
    assert floored["truncated"] is True
    whole = await poll_events(hub, "alice", _params(start["cursor"], max_age_ms=7_200_000))
    assert len(whole["events"]) == 3 and whole["truncated"] is False
    assert (await poll_events(hub, "alice", _params(start["cursor"])))["truncated"] is False
    with pytest.raises(MCPError) as negative:
        await poll_events(hub, "alice", _params(start["cursor"], max_age_ms=-1))
    assert negative.value.code == -32602


async def test_event_ids_and_data_tell_nothing_of_other_subjects(private_ledger: Ledger) -> None:
    """An event names no outbox position (the order across every subject): its ``eventId`` is opaque,
    stable for its subject (polled twice, the same id), and ``data`` carries no ``position`` nor
    ``outbox_id``; bob's events in between change nothing alice can see."""
    hub = ServeHub(ServeConfig(), private_ledger.pool, CursorSigner(b"k" * 32))
    start = (await poll_events(hub, "alice", _params(None)))["cursor"]
    bob_start = (await poll_events(hub, "bob", _params(None)))["cursor"]
    await _emit(private_ledger, "alice", 1)
    await _emit(private_ledger, "bob", 7)
    await _emit(private_ledger, "alice", 1)
    first = (await poll_events(hub, "alice", _params(start)))["events"]
    second = (await poll_events(hub, "alice", _params(start)))["events"]
    async with private_ledger.pool.connection() as conn:
        positions = [r[0] for r in await (await conn.execute(
            "SELECT position FROM outbox WHERE subject = 'alice' ORDER BY position")).fetchall()]
    assert len(first) == 2 and [e["eventId"] for e in first] == [e["eventId"] for e in second]
    for event, position in zip(first, positions, strict=True):
        assert str(position) not in event["eventId"].removeprefix("ev_"), event["eventId"]
        assert "position" not in event["data"] and "outbox_id" not in event["data"], event["data"]
    bob = (await poll_events(hub, "bob", _params(bob_start)))["events"]
    assert len(bob) == 7 and not {e["eventId"] for e in bob} & {e["eventId"] for e in first}


async def test_an_overdue_event_is_no_resource_change(private_ledger: Ledger) -> None:
    hub = ServeHub(ServeConfig(), private_ledger.pool, CursorSigner(b"k" * 32))
    start = await poll_events(hub, "carol", _params(None))
    await _emit(private_ledger, "carol", 1)
    async with private_ledger.pool.connection() as conn:
        # The watchdog's row (activities/ledger/verification.py): the current version, verified late.
        await conn.execute(
            "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, content_digest, read_ordinal,"
            " detail) VALUES ('overdue', 'wf-carol', 'carol', 's', 'demo://carol', 'sha256:carol0', 1,"
            " '{\"reason\": \"verifications up to 900 s apart, over the 300 s staleness bound\"}'::jsonb)")
    page = await poll_events(hub, "carol", _params(start["cursor"]))  # stamps the positions too
    assert [e["data"]["event_type"] for e in page["events"]] == ["version_accepted"]
    async with private_ledger.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute("SELECT * FROM outbox WHERE event_type = 'overdue' AND subject = 'carol'")
        row = await cur.fetchone()
    assert row is not None
    overdue = event_from_row(row)
    assert overdue.event_type == OutboxEventType.OVERDUE and overdue.reason and overdue.invalidates is None
    await hub.announce(overdue)  # no client is told a resource changed
    assert hub.stats["announced"] == 0
