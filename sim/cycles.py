"""The read cycle and the start cycle as the session-queue activity runs them, one step per event.

Contract:
- ``CycleRunner`` is a part of ``Simulation`` (a mixin over its state). ``_read_cycle_step`` makes the
  calls ``McpSessionActivities.read_cycle`` makes, in the same order (allocate on the ledger, read on
  the server, accept on the ledger), one per event, so other events run between them as between its
  awaits; ``_subscribe_cycle_step`` is ``subscribe_cycle``: subscribe, mark (``fence.marked_active``
  decides whether to read), then the read cycle's three steps.
"""

from __future__ import annotations

from typing import Any

from mcpsync.workflows.ledger_rules import marked_active
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import AcceptRequest
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind, ReadRequest, SubscribeOutcome
from mcpsync.workflows.records.read_cycle import (
    ReadCycleRequest,
    ReadCycleResult,
    SubscribeCycleRequest,
    SubscribeCycleResult,
)
from sim.checker import Checker
from sim.ledger import LEDGER_ACTIVITIES
from sim.model import SUBSCRIBE_CYCLE_READ
from sim.world import Activity, McpServer

__all__ = ["CycleRunner"]


class CycleRunner(Checker):
    """Steps of the session queue's cycles over the world (state named by these annotations)."""

    host: McpServer

    def _subscribe_cycle_step(self, act: Activity, fault: str) -> tuple[bool, Any]:
        """One step of the start cycle; (done, result)."""
        req: SubscribeCycleRequest = act.arg
        if act.step == 0:
            out = self.host.subscribe(req.subscribe)
            if not out.ok:
                return True, SubscribeCycleResult(subscribe=out)
            act.step = 1
            return False, None
        ok = SubscribeOutcome(ok=True, session_generation=req.subscribe.session_generation)
        if act.step == 1:
            m = req.mark
            active = LEDGER_ACTIVITIES[Act.MARK_ACTIVE](self.ledger, m)
            if not marked_active(active, session_generation=m.session_generation,
                                 subscription_generation=m.subscription_generation):
                self._cover("start_cycle.not_marked")
                return True, SubscribeCycleResult(subscribe=ok, active=active)
            act.active, act.step = active, SUBSCRIBE_CYCLE_READ
            return False, None
        done, cycle = self._read_cycle_step(act, fault, req.read, base=SUBSCRIBE_CYCLE_READ)
        if not done:
            return False, None
        if cycle is None:
            return True, None  # retries exhausted: the program sees ActivityFailed
        self._cover("start_cycle")
        return True, SubscribeCycleResult(subscribe=ok, active=act.active, cycle=cycle)

    def _read_cycle_step(self, act: Activity, fault: str, req: ReadCycleRequest | None = None, *,
                         base: int = 0) -> tuple[bool, Any]:
        """One step of the read cycle; (done, result). ``req`` and ``base``: the read cycle inside a start
        (``_subscribe_cycle_step``), from its step ``base``."""
        req = req if req is not None else act.arg
        assert isinstance(req, ReadCycleRequest)
        led = self.ledger
        step = act.step - base
        if step == 0:
            ingress = act.ingress.cycle if act.ingress is not None else None
            cycle_id = ingress.cycle_id if ingress is not None else f"run{act.run}/a{act.aid}"
            granted = led.allocate_read(req.allocate.model_copy(update={"cycle_id": cycle_id}))
            if not granted.granted:
                return True, ReadCycleResult(ticket=granted, fence=led.row)
            act.ticket, act.step = granted, base + 1
            return False, None
        ticket = act.ticket
        assert ticket is not None
        if step == 1:
            a = req.allocate
            outcome = self.host.read(ReadRequest(key=a.key, session_generation=a.session_generation,
                                                 subscription_generation=a.subscription_generation,
                                                 ordinal=ticket.ordinal, request_id=ticket.request_id,
                                                 trigger=a.trigger), self.oracle, fault=fault)
            if outcome is None:
                return True, None  # retries exhausted: the program sees ActivityFailed
            if outcome.kind == ReadOutcomeKind.SESSION_LOST:
                return True, ReadCycleResult(ticket=ticket, outcome=outcome)
            act.outcome, act.step = outcome, base + 2
            return False, None
        assert act.outcome is not None
        absorbed = act.ingress.absorbed if act.ingress is not None else 0
        result = led.accept(AcceptRequest(outcome=act.outcome, expected_state=req.expected_state,
                                          absorbed=absorbed, close_epoch=req.close_epoch))
        self._cover("read_cycle")
        self._cover(f"verdict.{result.verdict.value}")
        return True, ReadCycleResult(ticket=ticket, outcome=act.outcome, accept=result)
