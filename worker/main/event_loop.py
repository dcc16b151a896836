"""The event loop every mcpsync process runs on: uvloop's where it is installed, else asyncio's.

Contract:
- ``EventLoop`` names the two loops; ``MCPSYNC_EVENT_LOOP`` chooses (``uvloop``, the default, or
  ``asyncio``); unset or empty is the default. Any other value is refused (``EventLoopError``, one
  line: the CLI exits 2) before anything runs.
- uvloop: the ingress's CPU per read is mostly event-loop and socket work (psycopg's waits, the MCP
  client's HTTP): uvloop takes 13-16 % of it off (docs/benchmarks.md, "Idle cost"). Where uvloop is
  not installed (Windows: the dependency is skipped there) the default is asyncio's loop, silently;
  asking for ``uvloop`` explicitly there is refused.
- ``run(main)`` runs ``main`` to its end on a new loop of the chosen kind, as ``asyncio.run`` does
  (``asyncio.Runner``: a SIGINT cancels ``main`` and raises ``KeyboardInterrupt`` after it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any, TypeVar

__all__ = ["ENV", "EventLoop", "EventLoopError", "chosen", "loop_factory", "run"]

ENV = "MCPSYNC_EVENT_LOOP"

T = TypeVar("T")


class EventLoop(StrEnum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


class EventLoopError(ValueError):
    """``MCPSYNC_EVENT_LOOP`` names no loop this process can run."""


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _uvloop_or_refuse() -> Callable[[], asyncio.AbstractEventLoop]:
    factory = _uvloop_factory()
    if factory is None:
        raise EventLoopError(f"{ENV}=uvloop: uvloop is not installed here (use asyncio)")
    return factory


def chosen(environ: dict[str, str] | None = None) -> EventLoop:
    """The loop ``MCPSYNC_EVENT_LOOP`` in ``environ`` (default: the process's) asks for (module
    contract); raises ``EventLoopError`` for anything else."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    if raw == "":
        return EventLoop.UVLOOP if _uvloop_factory() is not None else EventLoop.ASYNCIO
    try:
        loop = EventLoop(raw)
    except ValueError:
        shown = raw if raw.isprintable() and len(raw) <= 40 else repr(raw[:40])
        raise EventLoopError(f"{ENV}={shown}: not an event loop (uvloop or asyncio)") from None
    if loop == EventLoop.UVLOOP:
        _uvloop_or_refuse()
    return loop


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new loops of kind ``loop``."""
    return _uvloop_or_refuse() if loop == EventLoop.UVLOOP else asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], loop: EventLoop | None = None) -> T:
    """Run ``main`` on a new loop of kind ``loop`` (default: ``chosen()``), as ``asyncio.run``."""
    try:
        factory = loop_factory(chosen() if loop is None else loop)
    except EventLoopError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
