"""settle_all: results in the items' order, at most ``limit`` calls in flight, a progress line on a
terminal only."""

from __future__ import annotations

import asyncio
import io
import random

from mcpsync.worker.main.bulk import BAR_WIDTH, settle_all


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_results_in_order_with_at_most_limit_in_flight() -> None:
    in_flight = peak = 0
    rng = random.Random(3)

    async def call(i: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(rng.randint(0, 5)):  # finish out of order
            await asyncio.sleep(0)
        in_flight -= 1
        return i * i

    assert await settle_all(list(range(200)), call, limit=32) == [i * i for i in range(200)]
    assert peak == 32


async def test_progress_is_drawn_on_a_terminal_and_ends_complete() -> None:
    async def call(i: int) -> int:
        return i

    tty, pipe = _Terminal(), io.StringIO()
    await settle_all(list(range(10)), call, limit=4, progress=True, label="subscribe", stream=tty)
    await settle_all(list(range(10)), call, limit=4, progress=True, label="subscribe", stream=pipe)
    last = tty.getvalue().rsplit("\r", 1)[1]
    assert last.startswith(f"subscribe 10/10 [{'#' * BAR_WIDTH}] ")
    assert tty.getvalue().endswith("/s\n")
    assert pipe.getvalue() == ""
