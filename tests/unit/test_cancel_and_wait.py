"""Stopping tasks on a Ctrl-C (``worker/main/services.cancel_and_wait``): each is cancelled once, and a
second cancellation of the caller (serve's uvicorn raises the SIGINT it took again once it stopped)
does not interrupt their cleanup."""

from __future__ import annotations

import asyncio

from mcpsync.worker.main.services import cancel_and_wait


async def test_a_second_cancel_of_the_caller_does_not_reach_a_task_in_its_cleanup() -> None:
    cleaned: list[str] = []
    cleaning = asyncio.Event()

    async def with_cleanup(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await asyncio.sleep(0.05)  # a query that closes a session, say
            cleaned.append(name)

    async def failing() -> None:
        raise RuntimeError("failed before the stop")

    tasks = [asyncio.create_task(with_cleanup("host")), asyncio.create_task(failing())]
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(tasks))
    await cleaning.wait()
    stopper.cancel()  # the second Ctrl-C's cancel, while the host cleans up
    await asyncio.sleep(0)
    stopper.cancel()
    await stopper  # returns once every task finished; the caller's cancels are absorbed
    assert cleaned == ["host"]
    assert all(t.done() for t in tasks)
