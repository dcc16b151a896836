"""Outbox consumers: a stuck consumer cannot keep itself alive by re-acking
(retention judges its lag by the age of the oldest row it holds back, not by when it last acked),
and consumer names are registered explicitly, their number capped."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.outbox import ConsumerError, ConsumerNotFound, OutboxConsumer
from mcpsync.activities.ledger.retention import prune
from tests.conftest import ledger_rows, unique
from tests.integration.test_ledger import _accept, _active, _issue
from tests.integration.test_outbox import consumers, register, settled

__all__ = ["consumers"]  # the fixture, used by name below


async def test_re_ack_does_not_keep_a_stuck_consumer_alive(ledger: Ledger, consumers: list[str]) -> None:
    key = await _active(ledger, uri="demo://sec/consumer")
    subject = key.subject
    stuck = await register(ledger, consumers, subject)
    for digest in ("sha256:c1", "sha256:c2"):
        assert await _accept(ledger, key, await _issue(ledger, key), digest) == "ACCEPTED"
    await settled(ledger, subject)
    batch = await stuck.poll()
    assert len(batch.events) == 2
    # 90 days pass: the events wait unacknowledged; the consumer was registered before them.
    await ledger_rows(ledger, "UPDATE outbox SET created_at = now() - interval '90 days' WHERE subject = %s",
                      subject)
    await ledger_rows(ledger, "UPDATE outbox_consumers SET created_at = now() - interval '91 days',"
                      " last_ack_at = now() - interval '91 days' WHERE name = %s", stuck.name)
    report = await prune(ledger.pool, keep=timedelta(days=365), consumer_max_lag=timedelta(days=30),
                         dry_run=True)
    assert stuck.name in report.consumers_ignored
    # It acks again without moving (the position it already had): still 90 days behind, still ignored.
    assert await stuck.ack(batch.acked) == batch.acked
    assert (await ledger_rows(ledger, "SELECT last_ack_at > now() - interval '1 minute' FROM outbox_consumers"
                              " WHERE name = %s", stuck.name))[0][0], "the re-ack was recorded"
    report = await prune(ledger.pool, keep=timedelta(days=365), consumer_max_lag=timedelta(days=30),
                         dry_run=True)
    assert stuck.name in report.consumers_ignored, "a re-ack is not progress"
    # Progress is: acking what it was given. Nothing is held back any more: live.
    await stuck.ack(batch.position)
    report = await prune(ledger.pool, keep=timedelta(days=365), consumer_max_lag=timedelta(days=30),
                         dry_run=True)
    assert stuck.name not in report.consumers_ignored


async def test_a_new_consumer_is_judged_from_its_registration(ledger: Ledger, consumers: list[str]) -> None:
    key = await _active(ledger, uri="demo://sec/consumer-new")
    assert await _accept(ledger, key, await _issue(ledger, key), "sha256:n1") == "ACCEPTED"
    await settled(ledger, key.subject)
    await ledger_rows(ledger, "UPDATE outbox SET created_at = now() - interval '90 days' WHERE subject = %s",
                      key.subject)
    fresh = await register(ledger, consumers, key.subject)
    await ledger_rows(ledger, "UPDATE outbox_consumers SET position = 0 WHERE name = %s", fresh.name)
    report = await prune(ledger.pool, keep=timedelta(days=365), consumer_max_lag=timedelta(days=30),
                         dry_run=True)
    assert fresh.name not in report.consumers_ignored, "registered just now: not 90 days behind"


async def test_registration_is_explicit_and_capped(ledger: Ledger, consumers: list[str]) -> None:
    subject = unique("reg")
    stray = unique("stray")
    with pytest.raises(ConsumerNotFound, match="register it first"):
        await OutboxConsumer(ledger.pool, stray, [subject]).poll()
    with pytest.raises(ConsumerNotFound):
        await OutboxConsumer(ledger.pool, stray).resync()
    assert not await ledger_rows(ledger, "SELECT 1 FROM outbox_consumers WHERE name = %s", stray), \
        "a poll of an unknown name registers nothing"
    registered = int((await ledger_rows(ledger, "SELECT count(*) FROM outbox_consumers"))[0][0])
    cap = registered + 2
    names = [unique("cap") for _ in range(3)]
    consumers.extend(names)
    for name in names[:2]:
        batch = await OutboxConsumer(ledger.pool, name, [subject], register=True, max_consumers=cap).poll()
        assert batch.gap is None or batch.gap.first >= 1
    with pytest.raises(ConsumerError, match="the most allowed"):
        await OutboxConsumer(ledger.pool, names[2], [subject], register=True, max_consumers=cap).poll()
    assert not await ledger_rows(ledger, "SELECT 1 FROM outbox_consumers WHERE name = %s", names[2])
    # An existing name is never refused by the cap.
    await OutboxConsumer(ledger.pool, names[0], [subject], register=True, max_consumers=cap).poll()
