"""The churn's driver: edits at a steady rate on every fixture of the run, duplicate notifications and
dropped ones (the fixture's ``drop_notifications`` fault), charged to the change they belong to."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import datetime

from benchmarks.convergence import Change
from benchmarks.naive import text_digest
from benchmarks.options import Options
from mcpsync.fixture import FixtureControl

__all__ = ["drive_churn", "dropped_uris"]


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def dropped_uris(controls: Sequence[FixtureControl]) -> set[str]:
    out: set[str] = set()
    for c in controls:
        out |= set((await c.stats())["notifications_dropped"])
    return out


async def drive_churn(controls: Sequence[FixtureControl], uris: Sequence[str], opts: Options,
                      rng: random.Random) -> tuple[list[Change], float]:
    """Edit at ``opts.rate``/s; each edit notifies once, ``k-1`` duplicates follow; 1/``drop_every`` dropped.

    A drop is armed through the fixture's ``drop_notifications`` fault (the next notification it
    sends is lost); once consumed, ``/stats`` names the URI and the drop is charged to the latest
    change of that URI (``Change.dropped``: per fixture, system first)."""
    loop = asyncio.get_running_loop()
    changes: list[Change] = []
    latest: dict[str, Change] = {}
    start = loop.time()
    total = int(opts.rate * opts.duration)
    notified, next_drop, lag = 0, opts.drop_every, 0.0
    armed: list[dict[str, int] | None] = [None] * len(controls)  # dropped-per-URI before arming

    async def settle_drops(final: bool = False) -> None:
        for j, c in enumerate(controls):
            before = armed[j]
            if before is None:
                continue
            if not final and (await c.faults())["drop_notifications"] > 0:
                continue  # not consumed yet
            after: dict[str, int] = (await c.stats())["notifications_dropped"]
            if final:
                await c.faults(drop_notifications=0)  # an unconsumed drop must not hit the later phases
            for uri, count in after.items():
                if count > before.get(uri, 0) and uri in latest:
                    latest[uri].dropped[j] += count - before.get(uri, 0)
            armed[j] = None

    for i in range(total):
        due = start + i / opts.rate
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        lag = max(lag, loop.time() - due)
        await settle_drops()
        uri = rng.choice(uris)
        k = rng.randint(1, opts.max_notify)
        text = f"{uri} change {i} {rng.getrandbits(48):x}"
        committed: list[float] = []
        for c in controls:
            m = await c.edit(uri, text=text)
            committed.append(ts(m["committed_at"]))
            if k > 1:
                await c.notify(uri, times=k - 1)
        ch = Change(i, uri, text_digest(text), k, committed[0], committed[-1], [0] * len(controls))
        changes.append(ch)
        latest[uri] = ch
        notified += k
        if notified >= next_drop:
            next_drop += opts.drop_every
            for j, c in enumerate(controls):
                if armed[j] is None:
                    armed[j] = dict((await c.stats())["notifications_dropped"])
                    await c.faults(drop_notifications=1)  # the next notification this fixture sends is lost
    await asyncio.sleep(0.5)
    await settle_drops(final=True)
    return changes, lag

