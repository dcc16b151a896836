"""One task queue per ingress process (issue 12 item 5) on the real stack.

Many subjects on one ingress share its one queue, yet every subscription reads through the
session of its own (subject, server): the fixture shows each subject only its own resource, and
every receipt names that session's generation. A takeover moves the session (and its queue) to
the other ingress with a higher generation; the ingress that lost it answers SESSION_LOST for
every generation, as a stale generation always was. The queue of a previous holder is polled by
the new one only while that holder holds no live lease, and only for a bounded time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress import orphan_queues
from mcpsync.worker.ingress.process import Ingress, ingress_task_queue
from mcpsync.worker.ingress.session_host import SessionHost
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind, ReadRequest
from mcpsync.workflows.records.subscription import SessionInfo, SubscriptionKey, TriggerReason
from tests.conftest import eventually, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

SUBJECTS = [f"subject-{i}" for i in range(6)]
TOKENS = {s: f"tok-{s}-{uuid.uuid4().hex}" for s in SUBJECTS}


@pytest.fixture
async def auth_fx(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    proc = await FixtureProcess.start_http(tmp_path, seed="none", tokens=TOKENS, require_auth=True)
    try:
        yield proc
    finally:
        await proc.stop()


async def test_many_subjects_share_one_queue_and_each_reads_through_its_own_session(
        temporal_client: Client, ledger: Ledger, auth_fx: FixtureProcess,
        monkeypatch: pytest.MonkeyPatch) -> None:
    token_env = {s: f"MCPSYNC_TEST_TOKEN_{i}" for i, s in enumerate(SUBJECTS)}
    for s, var in token_env.items():
        monkeypatch.setenv(var, TOKENS[s])
    server = ServerConfig(name=unique("fx"), transport="http", url=auth_fx.mcp_url, subjects=SUBJECTS,
                          token_env=token_env)
    # Each subject's resource is visible to that subject only: a read through any other
    # subject's session would not find it.
    uris = {s: f"demo://own/{s}/{uuid.uuid4().hex}" for s in SUBJECTS}
    first = {s: await auth_fx.create(uris[s], text=f"for {s} only", visible_to=[s]) for s in SUBJECTS}
    keys = {s: SubscriptionKey(subject=s, server=server.name, uri=uris[s]) for s in SUBJECTS}
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handles = {s: await start_subscription(temporal_client, keys[s], task_queue=cfg.temporal.task_queue)
                   for s in SUBJECTS}
        for s in SUBJECTS:
            want = first[s]["committed"]["digest"]
            await _wait_record(handles[s], lambda r, want=want: r.last_accepted_digest == want, f"v1 of {s}",
                               timeout=60)
        sessions: dict[str, SessionInfo] = {}
        for s in SUBJECTS:
            info = await ledger.current_session(s, server.name)
            assert info is not None
            sessions[s] = info
        # One process, one queue: every session row names the same ingress queue, that of the
        # ingress holding every lease.
        queues = {info.task_queue for info in sessions.values()}
        assert len(queues) == 1, queues
        holders = {(await ledger.sessions.lease_holder(s, server.name) or ("", 0))[0] for s in SUBJECTS}
        assert len(holders) == 1 and queues == {ingress_task_queue(holders.pop())}

        second = {s: await auth_fx.edit(uris[s], text=f"for {s} only, v2") for s in SUBJECTS}
        for s in SUBJECTS:
            want = second[s]["committed"]["digest"]
            rec = await _wait_record(handles[s], lambda r, want=want: r.last_accepted_digest == want,
                                     f"v2 of {s}", timeout=60)
            assert rec.session_generation == sessions[s].generation

    for s in SUBJECTS:
        accepted = [r for r in await ledger.reports.receipts(keys[s]) if r.status == AcceptVerdict.ACCEPTED]
        assert [r.content_digest for r in accepted] == [first[s]["committed"]["digest"],
                                                        second[s]["committed"]["digest"]]
        for r in accepted:  # read through the session of its own (subject, server)
            assert (r.subject, r.server, r.session_generation) == (s, server.name, sessions[s].generation)


@asynccontextmanager
async def _ingress(client: Client, ledger: Ledger, server: ServerConfig) -> AsyncIterator[tuple[Ingress,
                                                                                                SessionHost]]:
    """One ingress process's parts, as ``run_services`` wires them: its worker and one host."""
    ingress = Ingress(client, ledger)
    host = SessionHost(server, "alice", ledger, client, ingress=ingress)
    tasks = [asyncio.create_task(ingress.run()), asyncio.create_task(host.run())]
    try:
        yield ingress, host
    finally:
        host.stop()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with suppress(asyncio.CancelledError, Exception):
                await t


def _read(key: SubscriptionKey, generation: int) -> ReadRequest:
    return ReadRequest(key=key, session_generation=generation, subscription_generation=1, ordinal=0,
                       request_id=uuid.uuid4().hex, trigger=TriggerReason.UPDATED)


async def test_takeover_moves_the_session_and_its_queue(temporal_client: Client, ledger: Ledger,
                                                        fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"],
                          lease_seconds=2.0, ping_interval_seconds=0.5, ping_timeout_seconds=2)
    uri = f"demo://takeover/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    v1 = await fx.create(uri, text="v1")
    async with running_services(temporal_client, ledger, []) as cfg, \
            _ingress(temporal_client, ledger, server) as (a, host_a):
        await eventually(lambda: host_a.live is not None, what="ingress A's session")
        async with _ingress(temporal_client, ledger, server) as (b, host_b):
            assert a.task_queue != b.task_queue
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == v1["committed"]["digest"], "v1",
                               timeout=60)
            s1 = await ledger.current_session("alice", server.name)
            lease1 = await ledger.sessions.lease_holder("alice", server.name)
            assert s1 is not None and lease1 is not None
            assert (s1.task_queue, lease1[0], host_b.live) == (a.task_queue, a.identity, None)

            host_a.stop()  # A gives the session (and releases the lease) up; its worker and queue live on
            s2 = await eventually(lambda: _session_after(ledger, server.name, s1.generation), timeout=20,
                                  what="B's session")
            lease2 = await ledger.sessions.lease_holder("alice", server.name)
            assert lease2 is not None and lease2[0] == b.identity
            assert s2.task_queue == b.task_queue
            v2 = await fx.edit(uri, text="v2 after the takeover")
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == v2["committed"]["digest"],
                                     "v2 through B", timeout=60)
            assert rec.session_generation == s2.generation

            # Dispatch by key and generation: A holds nothing any more, B only the new generation.
            for ingress, generation in ((a, s1.generation), (a, s2.generation), (b, s1.generation)):
                out = await ingress.mcp.read(_read(key, generation))
                assert out.kind == ReadOutcomeKind.SESSION_LOST, (ingress.identity, generation, out)
            out = await b.mcp.read(_read(key, s2.generation))
            assert out.kind == ReadOutcomeKind.CONTENT and out.content_digest == v2["committed"]["digest"]
            other = SubscriptionKey(subject="bob", server=server.name, uri=uri)
            assert (await b.mcp.read(_read(other, s2.generation))).kind == ReadOutcomeKind.SESSION_LOST

    receipts = [r for r in await ledger.reports.receipts(key) if r.status == AcceptVerdict.ACCEPTED]
    assert [(r.content_digest, r.session_generation) for r in receipts] == [
        (v1["committed"]["digest"], s1.generation), (v2["committed"]["digest"], s2.generation)]


async def _session_after(ledger: Ledger, server: str, generation: int) -> SessionInfo | None:
    s = await ledger.current_session("alice", server)
    return s if s is not None and s.generation > generation else None


async def test_an_adopted_queue_is_polled_while_its_ingress_holds_no_lease(
        temporal_client: Client, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Ingress.adopt`` (``mcpsync.worker.ingress.orphan_queues``), level-based: the queue of the previous
    holder is polled only while that holder holds no live lease on any pair, and only until the
    adoption's bound; never its own queue."""
    monkeypatch.setattr(orphan_queues, "ADOPT_SECONDS", 8.0)
    gone, server = f"gone-host:1:{uuid.uuid4().hex[:8]}", unique("fx")
    queue = ingress_task_queue(gone)
    assert await ledger.sessions.acquire_lease("carol", server, gone, 1.5)
    ingress = Ingress(temporal_client, ledger)
    run = asyncio.create_task(ingress.run())
    try:
        await eventually(lambda: ingress.polling, what="the ingress worker polling")
        ingress.adopt(ingress.task_queue, ingress.identity)  # its own queue: nothing to adopt
        ingress.adopt(queue, gone)
        await asyncio.sleep(0.5)
        assert ingress.orphans.polled == frozenset()  # its holder has a live lease: it may be alive
        await eventually(lambda: ingress.orphans.polled == {queue}, timeout=5, interval=0.05,
                         what="the adopted queue polled once its holder's lease lapsed")
        assert await ledger.sessions.lease_holder("carol", server) is None

        assert await ledger.sessions.acquire_lease("carol", server, gone, 30.0)  # the holder is back
        await eventually(lambda: ingress.orphans.polled == frozenset(),
                         timeout=orphan_queues.RECHECK_SECONDS + 3, interval=0.05,
                         what="the adopted queue left to its holder, who holds a lease again")
        await ledger.sessions.release_lease("carol", server, gone)
        await eventually(lambda: ingress.orphans.polled == {queue}, timeout=orphan_queues.RECHECK_SECONDS + 3,
                         interval=0.05, what="the adopted queue polled again")
        await eventually(lambda: ingress.orphans.polled == frozenset(), timeout=10, interval=0.05,
                         what="the adoption over")
        assert ingress.polling  # its own queue is polled all along
    finally:
        run.cancel()
        with suppress(asyncio.CancelledError):
            await run


@pytest.mark.parametrize("lost", ["before the open", "after the open"])
async def test_a_lease_lost_while_the_session_opens_leaves_no_session(temporal_client: Client, ledger: Ledger,
                                                                     fx: FixtureProcess, lost: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose lease is taken while its session is opening (a starved ingress: seen in
    test_e2e_scaleout on a loaded box) keeps no session it holds no lease for: before the ledger's
    open, the open is refused (no generation is taken from the holder); after it, the session ends
    as soon as it is published (the renewal found none to end). The host then waits for the lease
    and takes over when the other holder goes."""
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"],
                          lease_seconds=2.0, ping_interval_seconds=0.5, ping_timeout_seconds=2)
    thief = f"thief:1:{uuid.uuid4().hex[:8]}"
    hosts: list[SessionHost] = []
    opened: list[SessionInfo | None] = []
    real_open = ledger.sessions.open_session

    async def steal() -> None:
        host = hosts[0]
        await ledger.sessions.release_lease("alice", server.name, host.host_id)
        assert await ledger.sessions.acquire_lease("alice", server.name, thief, 3600.0)
        await eventually(host._lease_lost.is_set, timeout=5, what="the renewal finds the lease lost")

    async def open_with_the_lease_taken(**kwargs: Any) -> SessionInfo | None:
        first = not opened
        if first and lost == "before the open":
            await steal()
        info = await real_open(**kwargs)
        if first and lost == "after the open":
            await steal()
        opened.append(info)
        return info

    monkeypatch.setattr(ledger.sessions, "open_session", open_with_the_lease_taken)
    async with _ingress(temporal_client, ledger, server) as (_, host):
        hosts.append(host)
        await eventually(lambda: opened, timeout=20, what="the open the lease was lost around")
        await eventually(lambda: host.live is None, timeout=5, what="no session without the lease")
        first = opened[0]
        assert (first is None) == (lost == "before the open")
        session = await ledger.current_session("alice", server.name)
        assert session is None  # never opened, or closed
        assert (await ledger.sessions.lease_holder("alice", server.name) or ("",))[0] == thief
        await ledger.sessions.release_lease("alice", server.name, thief)
        await eventually(lambda: host.live is not None, timeout=10,
                         what="the host's session once it holds the lease")
        assert host.live is not None
        assert host.live.generation == (1 if first is None else first.generation + 1)
        assert (await ledger.sessions.lease_holder("alice", server.name) or ("",))[0] == host.host_id
