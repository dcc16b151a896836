"""The processes' event loop (``mcpsync.worker.main.event_loop``): uvloop's by default, asyncio's on
request, anything else in ``MCPSYNC_EVENT_LOOP`` refused before a loop exists."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from mcpsync.worker.main import event_loop
from mcpsync.worker.main.event_loop import ENV, EventLoop, EventLoopError, chosen


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_the_default_is_uvloop() -> None:
    assert chosen({}) == EventLoop.UVLOOP
    assert chosen({ENV: ""}) == EventLoop.UVLOOP
    assert issubclass(event_loop.run(_loop_type(), EventLoop.UVLOOP), uvloop.Loop)


def test_asyncio_on_request() -> None:
    assert chosen({ENV: "asyncio"}) == EventLoop.ASYNCIO
    ran = event_loop.run(_loop_type(), EventLoop.ASYNCIO)
    assert not issubclass(ran, uvloop.Loop) and issubclass(ran, asyncio.BaseEventLoop)


@pytest.mark.parametrize("raw", ["UVLOOP", " asyncio", "uvloop\n", "trio", "\x1b[2Jasyncio", "x" * 10_000,
                                 "0"])
def test_anything_else_is_refused_in_one_line(raw: str) -> None:
    with pytest.raises(EventLoopError) as err:
        chosen({ENV: raw})
    message = str(err.value)
    assert message.startswith(f"{ENV}=") and "\n" not in message and "\x1b" not in message
    assert len(message) < 120


def test_a_refused_choice_leaves_no_coroutine_unawaited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "trio")
    main = _loop_type()
    with pytest.raises(EventLoopError):
        event_loop.run(main)
    assert main.cr_frame is None  # closed, not left pending


def test_uvloop_asked_where_it_is_missing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_loop, "_uvloop_factory", lambda: None)
    assert chosen({}) == EventLoop.ASYNCIO  # the default falls back silently
    with pytest.raises(EventLoopError, match="not installed"):
        chosen({ENV: "uvloop"})
