"""The read path's group commit (``activities/ledger/coalescer.py``) without a database: what queues
during a batch runs as the next one, one call per key, a failed batch's calls each alone."""

from __future__ import annotations

import asyncio

import pytest

from mcpsync.activities.ledger.coalescer import Coalescer


class Recorder:
    """A ``run`` that records its batches and answers each request doubled; a request ``"bad"``
    fails its whole batch (as a transaction rolls back), alone too."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()

    async def run(self, reqs: list[str]) -> list[str]:
        self.batches.append(list(reqs))
        await self.release.wait()
        if "bad" in reqs:
            raise ValueError("rolled back")
        return [r * 2 for r in reqs]


def _key(req: str) -> str:
    return req[0]  # requests of one key share their first letter


async def test_calls_during_a_batch_run_together_next_one_per_key() -> None:
    rec = Recorder()
    co: Coalescer[str, str] = Coalescer(rec.run, key=_key, name="test")
    first = asyncio.ensure_future(co.submit("a1"))
    await asyncio.sleep(0)  # the first batch is in flight
    rest = [asyncio.ensure_future(co.submit(r)) for r in ("b1", "c1", "a2", "b2")]
    rec.release.set()
    assert await asyncio.gather(first, *rest) == ["a1a1", "b1b1", "c1c1", "a2a2", "b2b2"]
    # a2 and b2 wait for the batch after the one holding a1's and b1's keys.
    assert rec.batches == [["a1"], ["b1", "c1", "a2"], ["b2"]]
    assert (co.batches, co.largest, co.retried) == (3, 3, 0)


async def test_a_failed_batch_answers_each_call_alone() -> None:
    rec = Recorder()
    rec.release.set()
    co: Coalescer[str, str] = Coalescer(rec.run, key=_key, name="test")
    got = await asyncio.gather(*(co.submit(r) for r in ("a1", "bad", "c1")), return_exceptions=True)
    assert got[0] == "a1a1" and got[2] == "c1c1"
    assert isinstance(got[1], ValueError)
    assert rec.batches == [["a1", "bad", "c1"], ["a1"], ["bad"], ["c1"]]
    assert co.retried == 3


async def test_a_cancelled_caller_leaves_its_batch_running_and_one_not_started_is_dropped() -> None:
    rec = Recorder()
    co: Coalescer[str, str] = Coalescer(rec.run, key=_key, name="test")
    running = asyncio.ensure_future(co.submit("a1"))
    await asyncio.sleep(0)
    other = asyncio.ensure_future(co.submit("b1"))  # queued for the next batch
    await asyncio.sleep(0)
    running.cancel()
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    after = asyncio.ensure_future(co.submit("c1"))
    rec.release.set()
    assert await after == "c1c1"
    assert rec.batches == [["a1"], ["c1"]]  # a1's batch ran to its end; b1 never ran
