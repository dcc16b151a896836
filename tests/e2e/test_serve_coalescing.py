"""``mcpsync serve`` on the real stack: a 2025-11-25 session's pending notifications are level-based
(docs/serve.md, "Bounded per-client buffers"). A burst of changes to one URI, far more than
``--client-buffer``, reaches a paused client and a reading one as a few ``updated`` notifications,
the last one after the last change, and cuts neither off; a client that never reads while many
distinct URIs change is cut off, and the reason is the last thing it gets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from tests.conftest import eventually, ledger_rows, unique
from tests.e2e.serve_helpers import (
    Seed,
    Served,
    ServeStack,
    raw_session,
    raw_sse_stream,
    read_sse_until,
    serve_client,
    serve_stack_factory,
    sse_messages,
)
from tests.e2e.test_e2e_subscription import _wait_record

REPEAT = (
    "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, content_digest,"
    " read_ordinal, detail) SELECT event_type, workflow_id, subject, server, uri, receipt_id,"
    " content_digest, read_ordinal, detail FROM outbox, generate_series(1, %s) WHERE outbox_id = %s"
)


@pytest.fixture
def serve_stack(
    temporal_client: Client, ledger: Ledger, fx: FixtureProcess, database_url: str, tmp_path: Path
) -> ServeStack:
    return serve_stack_factory(temporal_client, ledger, fx, database_url, tmp_path)


@pytest.fixture(autouse=True)
async def _serve_consumers_dropped(ledger: Ledger) -> AsyncIterator[None]:
    """As in test_serve.py: the test's durable serve consumers go when it ends."""
    yield
    await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name LIKE %s", "serve-%")


def _updated(messages: list[Any], uri: str) -> list[int]:
    """Where ``notifications/resources/updated`` for ``uri`` is among ``messages`` (SDK objects or raw
    JSON-RPC dicts)."""
    return [
        i for i, m in enumerate(messages)
        if (isinstance(m, types.ResourceUpdatedNotification) and str(m.params.uri) == uri)
        or (isinstance(m, dict) and m.get("method") == "notifications/resources/updated"
            and m["params"]["uri"] == uri)
    ]


def _after_marker(messages: list[Any], uri: str, marker: str) -> bool:
    """``marker``'s change arrived (an ``updated`` after its subscribe's) and an ``updated`` for ``uri``
    after it."""
    marks = _updated(messages, marker)
    return len(marks) >= 2 and any(i > marks[-1] for i in _updated(messages, uri))


async def _changed(st: Served, ledger: Ledger, fx: FixtureProcess, uri: str, text: str) -> int:
    """A real upstream change of ``uri``, accepted: its outbox event's id."""
    v = await fx.edit(uri, text=text, mime_type="text/markdown")
    digest = v["committed"]["digest"]
    await _wait_record(st.handles[uri], lambda r: r.last_accepted_digest == digest, f"{text!r} accepted")
    rows = await ledger_rows(
        ledger, "SELECT max(outbox_id) FROM outbox WHERE uri = %s AND content_digest = %s", uri, digest
    )
    return int(rows[0][0])


async def _announced(ledger: Ledger, consumer: str, uri: str) -> None:
    """Serve's follower acknowledged every outbox event of ``uri`` so far (each one announced)."""

    async def acknowledged() -> bool:
        rows = await ledger_rows(
            ledger,
            "SELECT c.position >= (SELECT max(position) FROM outbox WHERE uri = %s) AND NOT EXISTS"
            " (SELECT 1 FROM outbox WHERE uri = %s AND position IS NULL)"
            " FROM outbox_consumers c WHERE c.name = %s",
            uri,
            uri,
            consumer,
        )
        return bool(rows) and bool(rows[0][0])

    await eventually(acknowledged, timeout=60, what=f"serve announced every event of {uri}")


async def _raw_subscribe(raw: httpx2.AsyncClient, url: str, headers: dict[str, str], uri: str,
                         n: int) -> bytes:
    """``resources/subscribe`` on a raw session: the response's bytes."""
    request = {"jsonrpc": "2.0", "id": n, "method": "resources/subscribe", "params": {"uri": uri}}
    return (await raw.post(url, json=request, headers=headers)).content


@dataclass
class _Clients:
    raw: httpx2.AsyncClient  # the raw session's requests (``headers`` name it)
    headers: dict[str, str]
    stream: asyncio.StreamReader  # its GET stream, read only when the test reads it
    stream_writer: asyncio.StreamWriter
    reading: Any  # an SDK client that reads everything into ``inbox``
    inbox: list[Any]


@asynccontextmanager
async def _raw_and_reading(url: str, token: str, uris: Sequence[str], *,
                           small: bool = False) -> AsyncIterator[_Clients]:
    """Two 2025-11-25 clients of one subject, both subscribed to every URI of ``uris``: a raw session
    whose stream the test reads (or not) itself (``small``: ``raw_sse_stream``'s small buffers), and
    an SDK client that reads."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    inbox: list[Any] = []
    async with (
        httpx2.AsyncClient(timeout=30) as raw,
        serve_client(url, token, "legacy", inbox) as reading,
    ):
        headers["mcp-session-id"] = await raw_session(raw, url, headers)
        stream, stream_writer = await raw_sse_stream(url, token, headers["mcp-session-id"], small=small)
        for n, uri in enumerate(uris, start=2):
            assert b'"result"' in await _raw_subscribe(raw, url, headers, uri, n)
            with pytest.warns(Warning):
                await reading.subscribe_resource(uri)
        yield _Clients(raw, headers, stream, stream_writer, reading, inbox)


async def test_a_burst_on_one_uri_is_coalesced_and_cuts_off_no_client(
    serve_stack: ServeStack, ledger: Ledger, fx: FixtureProcess
) -> None:
    """``--client-buffer 4``; a paused client (a raw stream left unread all through the burst; its
    socket and reader hold what serve sends) and a reading one (the SDK), both subscribed to ``uri``
    and to ``marker``. The burst: v2, its outbox event repeated 1,000 times (the follower fans out
    rounds of at most 100 events), a change of ``marker``, then v3, the last change. Before coalescing,
    each client was cut off in the first round (100 notifications > 4).

    "After the last change": pending items go oldest first and ``marker`` changes after every
    repetition and before v3, so an ``updated`` for ``uri`` that follows ``marker``'s on a stream was
    pended after ``marker``'s change, i.e. by v3."""
    alice = unique("alice")
    uri, marker = f"demo://serve/{unique('burst')}.md", f"demo://serve/{unique('marker')}.md"
    repeats = 1000
    seeds = Seed(alice, uri, "# burst one"), Seed(alice, marker, "# marker one")
    async with serve_stack(*seeds, serve_args=("--client-buffer", "4")) as st:
        serve = st.serve
        async with _raw_and_reading(serve.url, st.tokens[alice], (uri, marker)) as clients:
            raw, headers, reading, inbox = clients.raw, clients.headers, clients.reading, clients.inbox
            paused, paused_writer = clients.stream, clients.stream_writer
            await eventually(lambda: len(_updated(inbox, uri)) == len(_updated(inbox, marker)) == 1,
                             what="the subscribe announcements")
            (first_change,) = (await ledger_rows(ledger, "SELECT max(outbox_id) + 1 FROM outbox"))[0]
            # The burst; the paused client reads nothing from here until the end.
            v2_event = await _changed(st, ledger, fx, uri, "# burst two")
            for _ in range(repeats // 100):
                await ledger_rows(ledger, REPEAT, 100, v2_event)
            await _announced(ledger, st.consumer, uri)
            await _changed(st, ledger, fx, marker, "# marker two")
            await _changed(st, ledger, fx, uri, "# burst three")  # the last change
            await _announced(ledger, st.consumer, uri)
            sql = "SELECT count(*) FROM outbox WHERE uri = %s AND outbox_id >= %s"
            changes = (await ledger_rows(ledger, sql, uri, first_change))[0][0]
            assert changes >= repeats + 2

            # The reading client: a few notifications, the last after v3; it reads v3.
            await eventually(lambda: _after_marker(inbox, uri, marker), what="updated after the last change")
            read = await reading.read_resource(uri)
            assert read.contents[0].text == "# burst three"  # type: ignore[union-attr]
            # The paused client, reading at last: the same, and no cut-off.
            received = await read_sse_until(paused, b"", lambda ms: _after_marker(ms, uri, marker))
            messages = sse_messages(received)
            assert b"cut off" not in received and "cut off (slow client)" not in serve.log.read_text()
            again = await _raw_subscribe(raw, serve.url, headers, uri, 9)
            assert b'"result"' in again and b"cut off" not in again, again
            await asyncio.sleep(1.0)  # anything still on its way to the reading client
            sent = {"paused": len(_updated(messages, uri)), "reading": len(_updated(inbox, uri))}
            print(f"burst on one URI: {changes} changes; updated notifications, subscribe's included: {sent}")
            for client, count in sent.items():
                assert 2 <= count <= changes // 20, f"{client}: {count} notifications for {changes} changes"
            paused_writer.close()


async def test_a_client_that_never_reads_is_cut_off_and_the_others_are_not(
    serve_stack: ServeStack, ledger: Ledger, fx: FixtureProcess
) -> None:
    """``--client-buffer 3``, five URIs of 7,000 characters (each notification ~7 KB). One real HTTP
    client opens its stream with small buffers and stops reading while the URIs change in rounds of
    three (each URI's real change repeated 100 times in the outbox); a client connected at the same
    time reads each round's changes. Once the stalled client's send is stuck (serve's socket buffer
    full: hundreds of KiB on loopback), its pending URIs pile up and the fourth distinct one is one
    too many: serve cuts it off with a reason, the last thing it gets; the reading client, never more
    than three URIs behind, is not cut off."""
    alice = unique("alice")
    tag = unique("slow")
    uris = [f"demo://serve/{tag}/{i}/{'x' * 7000}.md" for i in range(5)]
    async with serve_stack(*(Seed(alice, u, f"# slow {i}") for i, u in enumerate(uris)),
                           serve_args=("--client-buffer", "3")) as st:
        serve = st.serve
        async with _raw_and_reading(serve.url, st.tokens[alice], uris, small=True) as clients:
            raw, headers, reading, inbox = clients.raw, clients.headers, clients.reading, clients.inbox
            stream, stream_writer = clients.stream, clients.stream_writer
            # The slow client reads nothing from here on. A real change of each URI first ...
            events = [await _changed(st, ledger, fx, uri, f"# slow {i} two") for i, uri in enumerate(uris)]
            for uri in uris:
                await eventually(lambda u=uri: len(_updated(inbox, u)) >= 2, what="each URI's change")

            # ... then rounds of three URIs (no more than the buffer) until serve cuts the slow client
            # off; the reading client gets each round's URIs once more before the next round.
            async def round_of(i: int) -> None:
                picked = [(3 * i + k) % len(uris) for k in range(3)]
                before = {k: len(_updated(inbox, uris[k])) for k in picked}
                for k in picked:
                    await ledger_rows(ledger, REPEAT, 100, events[k])
                await eventually(lambda: all(len(_updated(inbox, uris[k])) > before[k] for k in picked),
                                 timeout=60, what=f"round {i} reached the reading client")

            rounds = 0
            while "cut off (slow client)" not in serve.log.read_text():
                assert rounds < 400, "serve never cut the client that does not read off"
                await round_of(rounds)
                rounds += 1
            # The slow client stalls 11 s past the cut-off (its send was stuck before that): the reason
            # waits for the client however long, so a stuck send dropped after a 10 s timeout would fail
            # below. Meanwhile the reading client reads, and another round reaches it.
            stall_ends = asyncio.get_running_loop().time() + 11
            read = await reading.read_resource(uris[0])
            assert read.contents[0].text == "# slow 0 two"  # type: ignore[union-attr]
            await round_of(rounds)
            # The reading client was never cut off, and nothing more is pending for it.
            assert not any(isinstance(m, types.LoggingMessageNotification) for m in inbox)
            seen = sum(len(_updated(inbox, u)) for u in uris)
            await asyncio.sleep(1.0)
            assert sum(len(_updated(inbox, u)) for u in uris) == seen
            await asyncio.sleep(stall_ends - asyncio.get_running_loop().time())
            # The slow client, reading at last, finds the backlog end in the reason it was cut off, and the
            # reason is the last thing it gets: the round after the cut-off did not reach it.
            received = await read_sse_until(stream, b"", lambda ms: any("cut off: " in str(m) for m in ms))
            messages = sse_messages(received)
            last = messages[-1]
            assert last["method"] == "notifications/message" and last["params"]["level"] == "error"
            assert "cut off: " in last["params"]["data"]["reason"]
            assert "reconnect and list again" in last["params"]["data"]["reason"]
            slow_sent = sum(len(_updated(messages, u)) for u in uris)  # the subscribe ones, 5 changes, rounds
            print(f"cut off after {rounds} rounds of 3 x 100; the slow client got {slow_sent} updated")
            assert slow_sent < len(uris) * 2 + 3 * rounds
            stream_writer.close()
            again = await _raw_subscribe(raw, serve.url, headers, uris[0], 99)
            assert b"cut off: " in again, again
            # Only the slow client was cut off.
            assert serve.log.read_text().count("cut off (slow client)") == 1
            assert not any(isinstance(m, types.LoggingMessageNotification) for m in inbox)
