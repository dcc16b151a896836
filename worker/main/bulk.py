"""Many calls at once, at most a bound in flight: results in the given order, and optional progress.

Contract:
- :func:`settle_all` awaits ``call(item)`` for every item, at most ``limit`` at a time, and returns
  the results in the items' order (``call`` returns its failures as values; one raising ends the
  whole command, as a serial loop would).
- With ``progress`` and a terminal on stderr it draws one line there (``\\r``, redrawn at most ten
  times a second and at the end): done / total, a bar, the rate. Without a terminal it draws
  nothing, so scripts and pipes see only the command's own output.
- :func:`waiting` says, once, on a terminal on stderr only, what a command waits for and how long
  at most (``subscribe --wait``, ``close``: up to a minute otherwise without a word).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO, TypeVar

__all__ = ["BAR_WIDTH", "settle_all", "waiting"]

T = TypeVar("T")
R = TypeVar("R")

BAR_WIDTH = 30


class _Progress:
    def __init__(self, total: int, label: str, stream: TextIO) -> None:
        self.total, self.label, self.stream = total, label, stream
        self.done = 0
        self.t0 = time.monotonic()
        self.drawn_at = 0.0

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done == self.total or now - self.drawn_at >= 0.1:
            self.drawn_at = now
            filled = BAR_WIDTH * self.done // max(1, self.total)
            rate = self.done / max(now - self.t0, 1e-9)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            self.stream.write(f"\r{self.label} {self.done}/{self.total} [{bar}] {rate:.0f}/s")
            if self.done == self.total:
                self.stream.write("\n")
            self.stream.flush()


async def settle_all(items: Sequence[T], call: Callable[[T], Awaitable[R]], *, limit: int,
                     progress: bool = False, label: str = "", stream: TextIO | None = None) -> list[R]:
    """``call`` over ``items``, ``limit`` in flight, results in order; see the module contract."""
    out = stream or sys.stderr
    bar = _Progress(len(items), label, out) if progress and items and out.isatty() else None
    gate = asyncio.Semaphore(max(1, limit))

    async def one(item: T) -> R:
        async with gate:
            result = await call(item)
        if bar is not None:
            bar.step()
        return result

    return list(await asyncio.gather(*(one(item) for item in items)))


@contextmanager
def waiting(what: str, timeout: float, stream: TextIO | None = None) -> Iterator[None]:
    """One line on a terminal on stderr (nothing on a pipe) while the block waits for ``what``."""
    out = stream or sys.stderr
    if out.isatty():
        out.write(f"waiting up to {timeout:g} s for {what} (Ctrl-C stops waiting)\n")
        out.flush()
    yield
