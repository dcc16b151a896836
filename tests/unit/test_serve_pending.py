"""``worker/serve/pending.py``: a 2025-11-25 serve session's pending notifications are level-based (one
per URI, the oldest first, re-pended during a send, the bound counts distinct URIs) (docs/serve.md)."""

from __future__ import annotations

import asyncio

import pytest

from mcpsync.worker.serve.pending import Added, PendingNotifications


def _drain_now(pending: PendingNotifications) -> list[tuple[str, str | None]]:
    taken = []
    while (item := pending.take_nowait()) is not None:
        taken.append(item)
    return taken


def test_a_uri_already_pending_is_merged() -> None:
    pending = PendingNotifications(limit=4)
    assert pending.add("updated", "demo://a") is Added.PENDING
    assert [pending.add("updated", "demo://a") for _ in range(1000)] == [Added.MERGED] * 1000
    assert pending.add("list_changed") is Added.PENDING
    assert pending.add("list_changed") is Added.MERGED
    assert len(pending) == 2
    assert _drain_now(pending) == [("updated", "demo://a"), ("list_changed", None)]


def test_the_oldest_pending_item_goes_first_and_a_merge_keeps_its_place() -> None:
    pending = PendingNotifications(limit=10)
    for kind, uri in [("updated", "a"), ("updated", "b"), ("updated", "a"), ("list_changed", None),
                      ("updated", "c"), ("updated", "b"), ("list_changed", None), ("updated", "a")]:
        pending.add(kind, uri)  # type: ignore[arg-type]
    oldest_first = [("updated", "a"), ("updated", "b"), ("list_changed", None), ("updated", "c")]
    assert pending.in_order() == oldest_first
    assert _drain_now(pending) == oldest_first


async def test_a_uri_changed_during_its_send_is_sent_once_more_after_it() -> None:
    pending = PendingNotifications(limit=4)
    sent: list[tuple[str, str | None]] = []
    in_flight, release = asyncio.Event(), asyncio.Event()

    async def drain() -> None:  # as ServeHub._drain: take, then a send that may block
        while True:
            item = await pending.take()
            if item == ("updated", "a") and not sent:
                in_flight.set()
                await release.wait()  # the first send of "a" is stuck in the transport
            sent.append(item)

    task = asyncio.create_task(drain())
    try:
        await asyncio.sleep(0)  # the drain waits: nothing pending
        assert pending.add("updated", "a") is Added.PENDING
        await asyncio.wait_for(in_flight.wait(), 5)
        assert pending.in_order() == []  # "a" is being sent, no longer pending
        assert pending.add("updated", "b") is Added.PENDING
        assert pending.add("updated", "a") is Added.PENDING  # changed again during its send: pending again
        assert pending.add("updated", "a") is Added.MERGED  # ... once
        release.set()
        for _ in range(100):
            await asyncio.sleep(0)
        assert sent == [("updated", "a"), ("updated", "b"), ("updated", "a")]
        assert len(pending) == 0
    finally:
        task.cancel()


def test_the_bound_counts_distinct_uris_waiting_not_notifications() -> None:
    pending = PendingNotifications(limit=3)
    for _ in range(500):  # a burst on one URI far above the bound: one item
        assert pending.add("updated", "a") in (Added.PENDING, Added.MERGED)
    assert pending.add("updated", "b") is Added.PENDING
    assert pending.add("updated", "c") is Added.PENDING
    assert pending.add("list_changed") is Added.PENDING  # the flag is one more, never counted
    assert pending.add("updated", "a") is Added.MERGED and pending.add("updated", "c") is Added.MERGED
    assert pending.add("updated", "d") is Added.FULL  # a 4th distinct URI waiting unread
    assert ("updated", "d") not in pending.in_order()
    assert pending.take_nowait() == ("updated", "a")  # taken (in flight): no longer waiting
    assert pending.add("updated", "d") is Added.PENDING
    assert pending.add("updated", "e") is Added.FULL


async def test_finish_drops_what_is_pending_and_its_item_is_the_last() -> None:
    pending = PendingNotifications(limit=2)
    pending.add("updated", "a")
    pending.add("list_changed")
    pending.finish(("cut_off", "why"))
    assert pending.finished
    assert pending.add("updated", "b") is Added.FINISHED and pending.add("list_changed") is Added.FINISHED
    assert await asyncio.wait_for(pending.take(), 1) == ("cut_off", "why")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pending.take(), 0.2)  # nothing after the final item


async def test_take_waits_for_an_add() -> None:
    pending = PendingNotifications(limit=2)
    taker = asyncio.create_task(pending.take())
    await asyncio.sleep(0.05)
    assert not taker.done()
    pending.add("updated", "a")
    assert await asyncio.wait_for(taker, 1) == ("updated", "a")


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PendingNotifications(limit=0)
