"""Group commit: the calls that arrive while one batch is in flight run together as the next batch.

Contract:
- ``Coalescer(run, key)`` answers ``submit(request)`` with what ``run`` answered for it. ``run``
  takes a list of requests (one transaction for all of them, in the ledger) and answers one result
  per request, in order. A single call is a batch of one: there is one implementation.
- One batch at a time: the first call starts a drain task, whose first batch is the calls made
  before it first runs (the same turn of the event loop); every call that arrives while a batch
  runs waits for the next one. No clock, no linger: a batch is whatever queued meanwhile (at most
  ``max_batch``), so a call alone waits for nothing but the batch in flight. Two requests with
  the same ``key`` never share a batch: the later one waits for the next, so it sees the earlier
  one's committed effect, as alone.
- A batch that raises (any error: a unique violation, a deadlock, a serialization failure, a bug in
  one request's rule) ran in a transaction that rolled back: each of its requests runs again alone,
  so each caller gets its own result or its own exception.
- A caller cancelled before its batch starts is dropped from it; one cancelled while its batch runs
  leaves that batch running (the drain task, not the caller, awaits it), so it neither cancels nor
  corrupts the others' work: its effect commits (as a cancellation after the commit would leave it)
  and the caller's retry finds it (the ledger's calls are idempotent).
- ``TOTALS`` counts, per coalescer ``name``, the batches run, the calls they answered and the calls
  run again alone, over the process's life (the metrics endpoint exports them: calls / batches is
  the mean batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["TOTALS", "BatchTotals", "Coalescer"]

Req = TypeVar("Req")
Res = TypeVar("Res")


@dataclass(slots=True)
class BatchTotals:
    """One kind of batch's counts over the process's life."""

    batches: int = 0  # batches run (the runs of a failed batch's calls alone not counted)
    calls: int = 0  # calls those batches took
    retried: int = 0  # calls run again alone after their batch failed


TOTALS: dict[str, BatchTotals] = {}
"""Per coalescer name, what every coalescer of that name in this process ran (module contract)."""


@dataclass(slots=True)
class _Call(Generic[Req, Res]):
    request: Req
    future: asyncio.Future[Res]


class Coalescer(Generic[Req, Res]):
    def __init__(self, run: Callable[[list[Req]], Awaitable[list[Res]]], key: Callable[[Req], Hashable], *,
                 name: str, max_batch: int = 64) -> None:
        self._run = run
        self._totals = TOTALS.setdefault(name, BatchTotals())
        self._key = key
        self.max_batch = max_batch
        self._queued: list[_Call[Req, Res]] = []
        self._drain: asyncio.Task[None] | None = None
        self.batches = 0  # batches run (retries alone not counted): for tests and measurements
        self.largest = 0  # the largest batch run
        self.retried = 0  # requests run again alone after their batch failed

    async def submit(self, request: Req) -> Res:
        loop = asyncio.get_running_loop()
        call: _Call[Req, Res] = _Call(request, loop.create_future())
        self._queued.append(call)
        if self._drain is None or self._drain.done() or self._drain.get_loop() is not loop:
            # (A drain left on another loop, one that has closed, answers nobody: its calls go.)
            self._queued = [c for c in self._queued if c.future.get_loop() is loop]
            self._drain = loop.create_task(self._drain_queue())
        return await call.future

    async def _drain_queue(self) -> None:
        while self._queued:
            batch = self._next_batch()
            if batch:
                await self._run_batch(batch)

    def _next_batch(self) -> list[_Call[Req, Res]]:
        """The queued calls whose callers still wait, oldest first, one per key; the rest stay queued."""
        batch: list[_Call[Req, Res]] = []
        left: list[_Call[Req, Res]] = []
        keys: set[Hashable] = set()
        for call in self._queued:
            if call.future.done():  # its caller was cancelled before it ran
                continue
            key = self._key(call.request)
            if key in keys or len(batch) >= self.max_batch:
                left.append(call)
            else:
                keys.add(key)
                batch.append(call)
        self._queued = left
        return batch

    async def _run_batch(self, batch: list[_Call[Req, Res]]) -> None:
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        self._totals.batches += 1
        self._totals.calls += len(batch)
        try:
            results = await self._run([c.request for c in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0].future, exc=exc)
                return
            self.retried += len(batch)
            self._totals.retried += len(batch)
            for call in batch:  # rolled back: each alone, with its own answer
                try:
                    result = (await self._run([call.request]))[0]
                except Exception as alone:
                    _settle(call.future, exc=alone)
                else:
                    _settle(call.future, result=result)
            return
        except BaseException:  # the drain task itself cancelled (the loop is closing): nobody answers
            for call in batch + self._queued:
                call.future.cancel()
            self._queued = []
            raise
        assert len(results) == len(batch)
        for call, result in zip(batch, results, strict=True):
            _settle(call.future, result=result)


def _settle(future: asyncio.Future[Any], *, result: Any = None, exc: BaseException | None = None) -> None:
    """Answer a caller still waiting (a cancelled one has gone: its batch ran all the same)."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
