"""Server-supplied strings are bounded, on the real stack: notification URIs are checked at the
ingress before they are queued, counted or written; UNKNOWN_URI audit rows are budgeted per
session; a 5 MB MIME type is cut to a documented length and audited once; a catalog scan has an
item and byte cap besides its page cap, and a page of 1,000,000 descriptors is refused before it
is parsed. The full scales (10,000 unique 100 KB URIs, a page of 1,000,000 resources) come from
a hostile stdio server that generates and streams them (tests/servers/hostile_server.py); the
ingress runs in this process, whose RSS growth is sampled and bounded. Nothing is lost for the
subscriptions that behave."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.client import Client

from mcpsync.activities import catalog_scan
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.catalog import CatalogLedger
from mcpsync.activities.mcp_session import MAX_METADATA_CHARS
from mcpsync.activities.starters import start_catalog, start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.session_host import AUDIT_ROWS_PER_SESSION, AUDIT_URI_CHARS
from mcpsync.worker.ingress.transport_bounds import MAX_MESSAGE_URIS
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.observe import metrics
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.catalog import CatalogKey, ResourceDiscoveryScanV1, ScanStatus
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.uris import MAX_URI_LENGTH
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_catalog_e2e import FAST, catalog_stack
from tests.e2e.test_cli import CliRun, cli_stack
from tests.e2e.test_e2e_subscription import _wait_record

HOSTILE = Path(__file__).parents[1] / "servers" / "hostile_server.py"
MB = 1024 * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def rss_growth() -> Iterator[list[int]]:
    """The peak growth of this process's RSS over the block (sampled every 5 ms from a thread, which
    the event loop's work cannot starve for long); ``[peak_bytes]`` once the block ended."""
    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss() - base)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out: list[int] = []
    try:
        yield out
    finally:
        done.set()
        thread.join()
        out.append(max(peak[0], _rss() - base))


async def _audit(ledger: Ledger, server: str, kind: str) -> list[tuple[str, dict[str, object]]]:
    rows = await ledger_rows(ledger, "SELECT uri, detail FROM audit WHERE server = %s AND kind = %s", server,
                             kind)
    return [(r[0], r[1]) for r in rows]


async def test_hostile_notification_uris_are_bounded_and_budgeted(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"])
    uri = f"demo://sec/strings/{uuid.uuid4().hex}"
    v1 = await fx.create(uri, text="v1")
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    floods = AUDIT_ROWS_PER_SESSION + 30
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == v1["committed"]["digest"], "v1")
        await fx.wait_subscribed(uri)
        tag = uuid.uuid4().hex
        for i in range(floods):  # unique, 100 KB each: no subscription can have them
            await fx.notify(f"demo://huge/{tag}/{i}/" + "a" * 100_000, unsolicited=True)
        await fx.notify(f"demo://ctl/{tag}\x1b[2J", unsolicited=True)
        for i in range(floods):  # well-formed, nobody subscribed
            await fx.notify(f"demo://nobody/{tag}/{i}", unsolicited=True)

        async def audited() -> bool:
            rejected = await _audit(ledger, server.name, "NOTIFICATION_URI_REJECTED")
            unknown = await _audit(ledger, server.name, "UNKNOWN_URI")
            return len(rejected) == AUDIT_ROWS_PER_SESSION and len(unknown) == AUDIT_ROWS_PER_SESSION \
                and bool(await _audit(ledger, server.name, "NOTIFICATION_URI_REJECTED_SUPPRESSED")) \
                and bool(await _audit(ledger, server.name, "UNKNOWN_URI_SUPPRESSED"))

        await eventually(audited, timeout=60, what="the budgeted audit rows")
        # The subscription that behaves is unharmed: its next change converges.
        v2 = await fx.edit(uri, text="v2 after the flood")
        await _wait_record(handle, lambda r: r.last_accepted_digest == v2["committed"]["digest"], "v2")
    rejected = await _audit(ledger, server.name, "NOTIFICATION_URI_REJECTED")
    assert all(len(u) <= AUDIT_URI_CHARS for u, _ in rejected)
    reasons = {str(d["reason"]) for _, d in rejected}
    assert f"URI longer than {MAX_URI_LENGTH} characters" in reasons
    assert all(len(str(d["uri_sha256"])) == 64 for _, d in rejected)
    for kind in ("NOTIFICATION_URI_REJECTED_SUPPRESSED", "UNKNOWN_URI_SUPPRESSED"):
        assert len(await _audit(ledger, server.name, kind)) == 1, "one row says the rest were suppressed"
    assert not [k for k in list(metrics._pending) if k[1] == server.name and len(k[2]) > MAX_URI_LENGTH], \
        "an oversize URI never became a metrics key"


async def test_a_uri_at_the_documented_limit_subscribes_without_a_memo_warning_and_lists_truncated(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path) -> None:
    # An operator's URI as long as the documented limit: accepted end to end with nothing on stderr
    # (no SDK warning about a memo over its size limit, no raw ANSI colours), and 'list' stays a table.
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = "demo://long/" + "x" * (MAX_URI_LENGTH - len("demo://long/"))
        r = await st.cli("subscribe", *st.key_args(uri))
        assert r.code == 0, r.err
        printed = r.out + r.err
        assert "memo" not in printed.lower() and "\x1b" not in printed, printed[:300]

        async def listed() -> CliRun | None:
            run = await st.cli("list", "--server", st.server.name)
            return run if run.code == 0 and "demo://long/" in run.out else None

        narrow = await eventually(listed, timeout=20, interval=0.3, what="the long URI's row in 'list'")
        assert max(len(line) for line in narrow.out.splitlines()) <= 200
        assert "…" in narrow.out and uri not in narrow.out
        wide = await st.cli("list", "--server", st.server.name, "-o", "wide")
        assert wide.code == 0 and uri in wide.out  # -o wide shows every column whole
        closed = await st.cli("close", *st.key_args(uri))
        assert closed.code == 0, closed.err


async def test_a_five_megabyte_mime_type_is_cut(temporal_client: Client, ledger: Ledger,
                                                fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"])
    uri = f"demo://sec/mime/{uuid.uuid4().hex}"
    mime = "text/plain; x=" + "m" * (5 * 1024 * 1024)
    await fx.create(uri, text="hello", mime_type=mime)
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        with rss_growth() as growth:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            first = await _wait_record(handle, lambda r: r.last_accepted_digest is not None, "accepted")
            await fx.wait_subscribed(uri)
            await fx.edit(uri, text="hello again", mime_type=mime)  # a second read: still one audit row
            await _wait_record(handle,
                               lambda r: r.last_accepted_digest not in (None, first.last_accepted_digest),
                               "the edit")
    receipts = await ledger.reports.receipts(key)
    assert len(receipts) >= 2
    assert all(r.mime_type is not None and len(r.mime_type) == MAX_METADATA_CHARS for r in receipts)
    assert receipts[-1].mime_type == mime[:MAX_METADATA_CHARS]
    truncated = await _audit(ledger, server.name, "METADATA_TRUNCATED")
    assert len(truncated) == 1, "audited once per session, with a reason"
    assert truncated[0][1]["length"] == len(mime) and "longer than" in str(truncated[0][1]["reason"])
    print(f"5 MB MIME type (two reads): RSS growth peak {growth[0] / MB:.1f} MB")
    assert growth[0] < 150 * MB, f"the ingress grew by {growth[0] / MB:.0f} MB"


async def test_a_scan_past_its_item_cap_proves_nothing(temporal_client: Client, ledger: Ledger,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_scan, "MAX_SCAN_ITEMS", 4)  # the activity runs in this process
    async with catalog_stack(temporal_client, ledger, tmp_path, resources=7, start=False) as st:
        st.handles["alice"] = await start_catalog(temporal_client, st.key(), task_queue=st.task_queue,
                                                  policy=FAST)

        async def capped() -> list[object] | None:
            scans = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
                     if s.status == ScanStatus.PAGE_CAP]
            return scans or None

        scans = await eventually(capped, timeout=20, what="a scan stopped by the item cap")
        assert "scan cap reached" in " ".join(scans[0].problems)  # type: ignore[attr-defined]
        assert await st.catalogs.catalogs_for("alice", st.server.name) == [], \
            "a capped scan publishes nothing"


async def test_ten_thousand_unique_hundred_kilobyte_uris(temporal_client: Client, ledger: Ledger,
                                                         tmp_path: Path) -> None:
    """Full scale: 10,000 unique notification URIs of 100 KB each (1 GB on the wire), generated
    and streamed by a hostile stdio server on the session that also carries a well-behaved
    subscription, whose resource changes halfway through the flood and once after it. Each hostile URI
    is refused at the ingress before it is queued or counted; 50 audit rows with a reason, then one
    ``_SUPPRESSED`` row; the ingress (this process) grows by less than 150 MB; both edits converge."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    server = ServerConfig(name=unique("hostile"), transport="stdio", ping_interval_seconds=5,
                          command=[sys.executable, str(HOSTILE), str(ctl)])
    key = SubscriptionKey(subject="anonymous", server=server.name, uri="hostile://ok")
    count, size, unknown = 10_000, 100_000, AUDIT_ROWS_PER_SESSION + 30
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        v1 = await _wait_record(handle, lambda r: r.last_accepted_digest is not None, "revision 1")
        started = time.monotonic()
        with rss_growth() as growth:
            (ctl / "flood.json.tmp").write_text(json.dumps(
                {"tag": uuid.uuid4().hex, "count": count, "size": size, "unknown": unknown}))
            (ctl / "flood.json.tmp").rename(ctl / "flood.json")
            await eventually(lambda: (ctl / "flood.done").exists(), timeout=60, what="the flood written")

            host = await eventually(lambda: next((h for h in list(metrics._hosts)
                                                  if h.server.name == server.name),
                                                 None),
                                    what="the session host (seen by metrics once a URI passed)")
            await eventually(lambda: host.uris_rejected == count, timeout=60,
                             what="every hostile URI refused")

            async def all_audited() -> bool:
                return await _audit_count(ledger, server.name, "NOTIFICATION_URI_REJECTED_SUPPRESSED") == 1 \
                    and await _audit_count(ledger, server.name, "UNKNOWN_URI_SUPPRESSED") == 1

            await eventually(all_audited, timeout=60, what="the flood's audit rows, budgeted")
        flooded = time.monotonic() - started
        # Every unknown URI is routed (and its audit row budgeted) off the receive loop: wait for the last.
        suppressed = count - AUDIT_ROWS_PER_SESSION + unknown - AUDIT_ROWS_PER_SESSION
        await eventually(lambda: host.audits_suppressed == suppressed, timeout=30,
                         what=f"{suppressed} audit rows suppressed (only counted)")
        # The edit made during the flood converged.
        v2 = await _wait_record(handle,
                                lambda r: r.last_accepted_digest not in (None, v1.last_accepted_digest),
                                "the edit during the flood")
        (ctl / "bump").touch()  # and one after it
        await _wait_record(handle, lambda r: r.last_accepted_digest not in (None, v1.last_accepted_digest,
                                                                             v2.last_accepted_digest),
                           "the edit after the flood")
        session = await ledger.current_session("anonymous", server.name)
        assert session is not None and session.generation == 1, "the flood cost no reconnect"
    rejected = await _audit(ledger, server.name, "NOTIFICATION_URI_REJECTED")
    assert len(rejected) == AUDIT_ROWS_PER_SESSION, "audited with a reason, within the budget"
    assert all(len(u) <= AUDIT_URI_CHARS and d["reason"] == f"URI longer than {MAX_URI_LENGTH} characters"
               and d["uri_length"] == size for u, d in rejected)
    assert len({d["uri_sha256"] for _, d in rejected}) == AUDIT_ROWS_PER_SESSION, "unique URIs"
    assert len(await _audit(ledger, server.name, "UNKNOWN_URI")) == AUDIT_ROWS_PER_SESSION
    assert not [k for k in list(metrics._pending) if k[1] == server.name and len(k[2]) > MAX_URI_LENGTH]
    print(f"10,000 x 100 KB URIs: read and refused in {flooded:.1f}s,"
          f" RSS growth peak {growth[0] / MB:.1f} MB")
    assert growth[0] < 150 * MB, f"the ingress grew by {growth[0] / MB:.0f} MB during a 1 GB flood"


async def _audit_count(ledger: Ledger, server: str, kind: str) -> int:
    return len(await _audit(ledger, server, kind))


async def test_a_page_of_a_million_resources(temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    """Full scale: one resources/list page of 1,000,000 descriptors (34 MB, under the default
    transport byte limit of 64 MB), streamed by the hostile stdio server. It is refused before it is
    parsed (``MAX_MESSAGE_URIS``: parsed, it would cost the ingress ~1 GB); the scan fails with that
    reason and publishes nothing; the ingress grows by less than 150 MB; the subscription on the
    same session keeps converging."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    server = ServerConfig(name=unique("hostile"), transport="stdio", ping_interval_seconds=5,
                          command=[sys.executable, str(HOSTILE), str(ctl)])
    key = SubscriptionKey(subject="anonymous", server=server.name, uri="hostile://ok")
    catalogs = CatalogLedger(ledger.pool)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        v1 = await _wait_record(handle, lambda r: r.last_accepted_digest is not None, "revision 1")
        started = time.monotonic()
        with rss_growth() as growth:
            catalog = await start_catalog(temporal_client,
                                          CatalogKey(subject="anonymous", server=server.name),
                                          task_queue=cfg.temporal.task_queue, policy=FAST)

            async def failed() -> list[ResourceDiscoveryScanV1] | None:
                scans = [s for s in await catalogs.scans_for("anonymous", server.name, 50)
                         if s.status == ScanStatus.FAILED]
                return scans or None

            scans = await eventually(failed, timeout=60, what="a scan refused its million-descriptor page")
        refused = time.monotonic() - started
        (ctl / "bump").touch()
        await _wait_record(handle, lambda r: r.last_accepted_digest not in (None, v1.last_accepted_digest),
                           "the edit after the page")
        await catalog.terminate("test over")
    problems = " ".join(scans[0].problems)
    assert "resources: -32700" in problems and f"more than {MAX_MESSAGE_URIS} URIs" in problems, problems
    assert await catalogs.catalogs_for("anonymous", server.name) == [], "a refused page publishes nothing"
    print(f"1,000,000-descriptor page: refused in {refused:.1f}s, RSS growth peak {growth[0] / MB:.1f} MB")
    assert growth[0] < 150 * MB, f"the ingress grew by {growth[0] / MB:.0f} MB for one page"
