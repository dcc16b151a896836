"""Bad input gets a clear, classified error and loses nothing.

Malformed JSON-RPC frames and results with wrong types from a lying stdio server, a 10 MB
text body, binary declared as text, URIs with control characters or 10 KB of length.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import QUERY_SUBSCRIPTION
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests import cli_process
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import SpareFixtures
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState
LIAR = Path(__file__).parents[1] / "servers" / "liar_server.py"


async def test_lying_server_malformed_frames_and_wrong_types(temporal_client: Client, ledger: Ledger) -> None:
    server = ServerConfig(name=unique("liar"), transport="stdio", command=[sys.executable, str(LIAR)],
                          ping_interval_seconds=0.5)
    keys = {u: SubscriptionKey(subject="anonymous", server=server.name, uri=u)
            for u in ("liar://ok", "liar://wrong-types", "liar://binary-as-text")}
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handles = {u: await start_subscription(temporal_client, k, task_queue=cfg.temporal.task_queue)
                   for u, k in keys.items()}
        ok = await _wait_record(handles["liar://ok"], lambda r: r.last_accepted_digest is not None,
                                "honest read")
        # Wrong types: a classified failure, audited; the subscription stays ACTIVE and nothing is accepted.
        await eventually(lambda: _audited(ledger, keys["liar://wrong-types"], "READ_FAILED"), what="audit")
        bad = await handles["liar://wrong-types"].query("subscription")
        assert bad["state"] in ("ACTIVE", "UPDATE_SEEN", "READ_PENDING") \
            and bad["last_accepted_digest"] is None
        # Binary declared as text: a guardrail rejection, never released.
        await _wait_record(handles["liar://binary-as-text"], lambda r: "guardrail" in r.detail, "guardrail")
        # The session survived the garbage: a later honest change still converges on it.
        bump = SubscriptionKey(subject="anonymous", server=server.name, uri="liar://bump")
        await start_subscription(temporal_client, bump, task_queue=cfg.temporal.task_queue)
        await _wait_record(handles["liar://ok"], lambda r: r.last_accepted_digest != ok.last_accepted_digest,
                           "update after garbage frames")
        session = await ledger.current_session("anonymous", server.name)
        assert session is not None and session.generation == 1, "no reconnect storm from bad frames"
        misuse = [r for r in await ledger.reports.audit_rows("NOTIFICATION_OUTSIDE_SESSION", limit=500)
                  if r["server"] == server.name]
        assert misuse, "a notification before initialization is audited as lifecycle misuse, never routed"
    assert await ledger.reports.outbox_after(0, 10_000) is not None


async def _audited(ledger: Ledger, key: SubscriptionKey, kind: str) -> bool:
    return any(r["workflow_id"] == key.workflow_id for r in await ledger.reports.audit_rows(kind, limit=2000))


@asynccontextmanager
async def _subscribed_small(
        client: Client, ledger: Ledger, spares: SpareFixtures,
        **server_options: Any) -> AsyncIterator[tuple[FixtureProcess, ServerConfig, WorkflowHandle]]:
    """An HTTP fixture, one subscription to a small text resource, converged and subscribed."""
    async with await spares.take() as fx:
        server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, **server_options)
        uri = f"demo://big/{uuid.uuid4().hex}"
        first = await fx.create(uri, text="small")
        key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
        async with running_services(client, ledger, [server]) as cfg:
            handle = await start_subscription(client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                               "small")
            await fx.wait_subscribed(uri)
            yield fx, server, handle


async def test_ten_megabyte_text_is_read_classified_and_not_released(temporal_client: Client, ledger: Ledger,
                                                                     spare_fixtures: SpareFixtures) -> None:
    async with _subscribed_small(temporal_client, ledger, spare_fixtures,
                                 read_timeout_seconds=60) as (fx, _, handle):
        before = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        key = SubscriptionKey(subject=before.subject, server=before.server, uri=before.uri)
        huge = await fx.edit(key.uri, text="y" * (10 * 1024 * 1024))
        rec = await _wait_record(handle, lambda r: "guardrail" in r.detail, "10 MB classified", timeout=60)
        assert rec.last_accepted_digest == before.last_accepted_digest
        statuses = {r.content_digest: r.status.value for r in await ledger.reports.receipts(key)}
        assert statuses[huge["committed"]["digest"]] == "GUARDRAIL_REJECTED"
        history = (await handle.fetch_history()).to_json()
        assert len(history) < 1_000_000, "the body never entered history"


async def test_body_over_the_http_event_cap_is_malformed_not_a_lost_session(
        temporal_client: Client, ledger: Ledger, spare_fixtures: SpareFixtures) -> None:
    # The session host caps one SSE event at 2 x max_content_bytes + 64 KiB: a larger read result
    # fails that request only. It must be classified, and the session must not reconnect over it.
    async with _subscribed_small(temporal_client, ledger, spare_fixtures,
                                 max_content_bytes=64 * 1024) as (fx, server,
                                                                                                     handle):
        before = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        await fx.edit(before.uri, text="z" * (400 * 1024))
        rec = await _wait_record(handle, lambda r: "malformed" in r.detail, "oversize classified", timeout=30)
        assert rec.last_accepted_digest == before.last_accepted_digest and rec.session_generation == 1
        # Nothing lost: the next change of a sane size converges on the same session.
        fine = await fx.edit(before.uri, text="small again")
        await _wait_record(handle, lambda r: r.last_accepted_digest == fine["committed"]["digest"], "fine")
        session = await ledger.current_session("anonymous", server.name)
        assert session is not None and session.generation == 1, "no reconnect over one oversize response"


@pytest.mark.parametrize("uri,problem", [
    ("demo://ctl/\x01evil", "control characters"),
    ("demo://ctl/line\nbreak", "control characters"),
    ("demo://long/" + "a" * 10_240, "at most 8192 characters"),
    ("no-scheme-at-all", "no scheme"),
])
def test_unusable_uris_are_refused_clearly(uri: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        SubscriptionKey(subject="s", server="x", uri=uri)


def test_cli_refuses_control_characters_in_uri(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[servers]]\nname = "a"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    r = cli_process.run(["--config", str(cfg), "subscribe", "--server", "a", "--uri", "demo://x/\x07bell"])
    assert r.returncode == 2 and "control characters" in r.stderr and "Traceback" not in r.stderr


async def test_notification_with_odd_uri_is_audited_not_routed(temporal_client: Client, ledger: Ledger,
                                                               spare_fixtures: SpareFixtures) -> None:
    async with await spare_fixtures.take() as fx:
        server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url)
        watched = f"demo://w/{uuid.uuid4().hex}"
        first = await fx.create(watched, text="w")
        odd = "demo://odd/" + "z" * 10_000
        await fx.create(odd, text="odd")
        key = SubscriptionKey(subject="anonymous", server=server.name, uri=watched)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "w")
            await fx.notify(odd, unsolicited=True)
            # Longer than any subscription's URI may be (MAX_URI_LENGTH): rejected at
            # the ingress, audited with its head, length, digest and why, never routed.
            rows = await eventually(lambda: _rejected(ledger, server.name), what="audit of the odd URI")
            assert rows[0]["uri"] == odd[:256] and rows[0]["detail"]["uri_length"] == len(odd)
            assert "longer than" in rows[0]["detail"]["reason"]
            assert not await _unknown(ledger, odd)
            assert (await handle.query("subscription"))["reads_issued"] == 1


async def _rejected(ledger: Ledger, server: str) -> list[Any]:
    return [r for r in await ledger.reports.audit_rows("NOTIFICATION_URI_REJECTED", limit=500)
            if r["server"] == server]


async def _unknown(ledger: Ledger, uri: str) -> list[object]:
    return [r for r in await ledger.reports.audit_rows("UNKNOWN_URI", limit=500) if r["uri"] == uri]
