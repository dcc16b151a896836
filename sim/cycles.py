"""The session queue's cycles, run by production's activity code one step per event.

Contract:
- ``CycleRunner`` is one object of a ``Simulation`` (``sim.cycles``) with its own fields. ``step`` runs
  ``McpSessionActivities.run_cycle`` / ``run_subscribe_cycle`` as a coroutine over the simulated server
  and ``MemoryLedger`` (``SimSessionActivities``): the cycle pauses after each effect it goes on from
  (subscribed, marked, allocated, read), so one event takes one effect and other events run between
  them as between its awaits. ``Activity.step`` counts the pauses of the current attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, cast

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
from mcpsync.activities.mcp_session import McpSessionActivities
from mcpsync.workflows.ledger_rules import marked_active
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    FenceSnapshot,
    KeyRequest,
    MarkActiveRequest,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import (
    ReadOutcome,
    ReadOutcomeKind,
    ReadRequest,
    SubscribeOutcome,
    SubscribeRequest,
)
from mcpsync.workflows.records.read_cycle import SubscribeCycleResult
from sim.ledger import LEDGER_ACTIVITIES, MemoryLedger
from sim.world import Activity, McpServer, Oracle, ReadFailed

__all__ = ["CycleRunner", "SimSessionActivities"]

# Coverage names of the verdicts, made once (an f-string reads the member's ``value`` through Enum's slow
# descriptor).
VERDICT_LABELS = {v: f"verdict.{v.value}" for v in AcceptVerdict}
# Read once (an ``Enum`` class attribute goes through the metaclass's slow ``__getattr__`` on 3.11).
_SESSION_LOST, _SUBSCRIBE_CYCLE = ReadOutcomeKind.SESSION_LOST, Act.MCP_SUBSCRIBE_CYCLE


class _Pause:
    def __await__(self) -> Generator[None, None, None]:
        yield


class SimSessionActivities(McpSessionActivities):
    """Production's session activities with the world's MCP server (``subscribe``, ``_read``) and
    ledger (``_SimLedger``) under them."""

    def __init__(self, host: McpServer, oracle: Oracle, ledger: MemoryLedger) -> None:
        super().__init__(current=lambda subject, server: None, ledger=cast(Ledger, _SimLedger(self, ledger)))
        self.host = host
        self.oracle = oracle
        self.act: Activity | None = None  # the activity the current event steps
        self.fault = ""  # that event's fault

    async def pause(self) -> None:
        assert self.act is not None
        self.act.step += 1
        await _Pause()

    async def subscribe(self, req: SubscribeRequest) -> SubscribeOutcome:
        out = self.host.subscribe(req)
        if out.ok:
            await self.pause()
        return out

    async def _read(self, req: ReadRequest) -> tuple[ReadOutcome, ReadBody | None]:
        outcome = self.host.read(req, self.oracle, fault=self.fault)
        if outcome.kind != _SESSION_LOST:
            await self.pause()
        return outcome, None


class _SimLedger:
    """The ``Ledger`` (and ``Ledger.fence``) calls of the cycles, on ``MemoryLedger``."""

    def __init__(self, sessions: SimSessionActivities, ledger: MemoryLedger) -> None:
        self.sessions = sessions
        self.ledger = ledger
        self.fence = self

    async def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        ticket = await self.ledger.allocate_read(req)
        if ticket.granted:
            assert self.sessions.act is not None
            self.sessions.act.ticket = ticket
            await self.sessions.pause()
        return ticket

    async def load_fence(self, req: KeyRequest) -> FenceSnapshot:
        return self.ledger.row

    async def mark_active(self, req: MarkActiveRequest) -> FenceSnapshot:
        row: FenceSnapshot = LEDGER_ACTIVITIES[Act.MARK_ACTIVE](self.ledger, req)
        if marked_active(row, session_generation=req.session_generation,
                         subscription_generation=req.subscription_generation):
            await self.sessions.pause()
        return row

    async def accept_judged(self, req: AcceptRequest,
                            body: ReadBody | None = None) -> tuple[AcceptResult, str | None]:
        return self.ledger.accept_judged(req)


class CycleRunner:
    """Steps of the session queue's cycles over the world; ``cover`` counts what they exercised."""

    def __init__(self, sessions: SimSessionActivities, cover: Callable[[str], None]) -> None:
        self.sessions = sessions
        self.cover = cover

    def step(self, act: Activity, fault: str, cycle_id: str | None = None,
                    absorb: Callable[[], int] | None = None) -> tuple[bool, Any]:
        """One step of ``act``'s cycle (a new attempt when none is under way); (done, result), None
        when its read failed. ``cycle_id`` (default the activity's) and ``absorb``: ``run_cycle``'s."""
        if act.cycle is None:
            cycle_id = cycle_id or f"run{act.run}/a{act.aid}"
            act.cycle = self.sessions.run_subscribe_cycle(act.arg, cycle_id=cycle_id) \
                if act.name == _SUBSCRIBE_CYCLE else \
                self.sessions.run_cycle(act.arg, cycle_id=cycle_id, absorb=absorb)
        self.sessions.act, self.sessions.fault = act, fault
        try:
            act.cycle.send(None)
        except StopIteration as stop:
            result = stop.value
        except ReadFailed:
            return True, None  # retries exhausted: the program sees ActivityFailed
        else:
            return False, None
        cycle = result.cycle if isinstance(result, SubscribeCycleResult) else result
        if isinstance(result, SubscribeCycleResult) and result.active is not None:
            self.cover("start_cycle" if cycle is not None else "start_cycle.not_marked")
        if cycle is not None and cycle.accept is not None:
            self.cover("read_cycle")
            self.cover(VERDICT_LABELS[cycle.accept.verdict])
        return True, result
