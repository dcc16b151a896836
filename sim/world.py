"""The simulated world around the program: the server's resource (``Oracle``), the MCP server's
sessions (``McpServer``), messages on their way to the workflow, and scheduled activities.

Contract:
- ``Oracle`` is the resource as the server holds it: every committed state has a version number and
  a unique digest (``None`` while deleted); a read is answered with the content current when it is
  *served*.
- ``McpServer`` is what the server answers on a session generation (subscribe, unsubscribe, read),
  one live generation at a time, including a generation that is gone; it also keeps the ledger's
  open-session row. It is the environment, not our code: our session host's routing runs as
  ``workflows/ingress.py``.
- ``Activity`` is one scheduled activity (or read at the ingress), executed and completed by events in
  any order; a cycle takes one effect per event.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.records.base import replaced
from mcpsync.workflows.records.ledger import ReadTicket
from mcpsync.workflows.records.mcp_calls import (
    ReadOutcome,
    ReadOutcomeKind,
    ReadRequest,
    SubscribeOutcome,
    SubscribeRequest,
    UnsubscribeOutcome,
    UnsubscribeRequest,
)
from mcpsync.workflows.records.read_cycle import ReadReport
from mcpsync.workflows.records.subscription import CacheScope, ResourceUpdated, SessionInfo, TriggerReason
from sim.interpreter import ProgramRun, Signal
from sim.ledger import MemoryLedger
from sim.model import EPOCH, KEY

if TYPE_CHECKING:
    from sim.ingress import Processing

class _K:
    """The outcome kinds a read answers, read once (an ``Enum`` class attribute goes through the
    metaclass's slow ``__getattr__`` on Python 3.11)."""

    SESSION_LOST, DENIED, MALFORMED = ReadOutcomeKind.SESSION_LOST, ReadOutcomeKind.DENIED, \
        ReadOutcomeKind.MALFORMED
    NOT_FOUND, CONTENT = ReadOutcomeKind.NOT_FOUND, ReadOutcomeKind.CONTENT


_PRIVATE = CacheScope.PRIVATE

# A read's outcome is this record with the request's fields and the answer's set (``replaced``: the
# fields set are the ones given, as validation leaves them): every value is a validated request's
# field or a constant of the right type, and validating twenty fields (six defaults) for each read
# took 1.7 % of a schedule. The request's fields are all outcome fields (the check below), so the
# outcome cannot carry one the record does not have.
_OUTCOME = ReadOutcome(kind=ReadOutcomeKind.CONTENT, key=KEY, ordinal=0, request_id="-", session_generation=0,
                       subscription_generation=0, trigger=TriggerReason.INITIAL)
assert set(ReadRequest.model_fields) <= set(ReadOutcome.model_fields)


class Oracle:
    def __init__(self) -> None:
        self.version = 1
        self.digest: str | None = self._content(1)
        self.committed: dict[str, int] = {self.digest: 1}
        self.unsafe: set[int] = set()  # versions the guardrail chain refuses to release

    @staticmethod
    @cache  # every schedule's oracle serves the same few versions: each digest is hashed once a process
    def _content(version: int) -> str:
        return content_digest([ContentPart("text", "text/plain", f"oracle content v{version}".encode())])

    @property
    def exists(self) -> bool:
        return self.digest is not None

    def mutate(self, *, unsafe: bool = False) -> None:
        self.version += 1
        self.digest = self._content(self.version)
        self.committed[self.digest] = self.version
        if unsafe:
            self.unsafe.add(self.version)

    def delete(self) -> None:
        self.version += 1
        self.digest = None


@dataclass(frozen=True, slots=True)
class Message:
    """A signal on its way to the workflow (the network + ingress + Temporal frontend), with the payload
    it is delivered with: the ``ResourceUpdated`` the ingress stamped, its ``ReadReport``, or the new
    session generation."""

    kind: Signal  # UPDATED | READ_REPORTED | SESSION_CHANGED
    payload: ResourceUpdated | ReadReport | int

    @property
    def notification_id(self) -> str | None:
        update = self.payload.update if isinstance(self.payload, ReadReport) else self.payload
        return update.notification_id if isinstance(update, ResourceUpdated) else None


class ReadFailed(Exception):
    """A read's retries are exhausted: the program sees ActivityFailed."""


@cache
def _session(generation: int, *, subscribe: bool) -> SessionInfo:
    """The session ``McpServer.open`` records: the same record in every schedule for a generation (a
    frozen record, so one is made a process)."""
    return SessionInfo(subject=KEY.subject, server=KEY.server, generation=generation, edition="2025-11-25",
                       subscribe=subscribe, list_changed=False, server_name="oracle", server_version="1",
                       task_queue="mcpsync-session/oracle/sim", opened_at=EPOCH)


@cache
def _subscribed(generation: int) -> SubscribeOutcome:
    """The answer to a subscribe the server took (frozen: one a process a generation)."""
    return SubscribeOutcome(ok=True, session_generation=generation)


_UNSUBSCRIBED = UnsubscribeOutcome(acked=True)


class McpServer:
    def __init__(self, capability: str, ledger: MemoryLedger) -> None:
        self.capability = capability
        self.ledger = ledger
        self.live: SessionInfo | None = None
        self.generation = 0
        self.subscribed: set[int] = set()  # session generations holding a server-side subscription

    def open(self) -> int:
        self.generation += 1
        self.live = _session(self.generation, subscribe=self.capability != "none")
        self.ledger.session = self.live
        return self.generation

    def drop(self) -> None:
        if self.live is not None:
            self.subscribed.discard(self.live.generation)
        self.live = None
        self.ledger.session = None

    def _live(self, generation: int) -> SessionInfo | None:
        return self.live if self.live is not None and self.live.generation == generation else None

    def subscribe(self, req: SubscribeRequest) -> SubscribeOutcome:
        live = self._live(req.session_generation)
        if live is None:
            return SubscribeOutcome(ok=False, session_generation=self.live.generation if self.live else 0,
                                    error="session generation is gone")
        if self.capability == "rejects":
            return SubscribeOutcome(ok=False, session_generation=live.generation, error_code=-32601,
                                    error="Method not found")
        self.subscribed.add(live.generation)
        return _subscribed(live.generation)

    def unsubscribe(self, req: UnsubscribeRequest, *, ack_lost: bool) -> UnsubscribeOutcome | None:
        live = self._live(req.session_generation)
        if live is None:
            return UnsubscribeOutcome(acked=False, error="session generation is gone")
        self.subscribed.discard(live.generation)
        return None if ack_lost else _UNSUBSCRIBED

    def read(self, req: ReadRequest, oracle: Oracle, *, fault: str) -> ReadOutcome:
        # The outcome names the request: every field of it (a record's ``__dict__`` holds its fields and
        # nothing else; iterating the record filters it again, and ``dict(req)`` would first probe the
        # model for a ``keys`` attribute, a slow miss in pydantic's ``__getattr__``).
        base: dict[str, Any] = dict(req.__dict__)
        if self._live(req.session_generation) is None:
            base.update(kind=_K.SESSION_LOST, error="session generation is gone")
            return replaced(_OUTCOME, base)
        if fault == "error":
            raise ReadFailed
        # The oracle stamps the version it served into server_version (metadata only) so the
        # checker can tell which committed state a receipt came from.
        base["server_version"] = f"v{oracle.version}"
        if fault == "denied":
            base.update(kind=_K.DENIED, error_code=-32001, error="denied")
        elif fault == "malformed":
            base.update(kind=_K.MALFORMED, error="invalid result")
        elif oracle.digest is None:
            base.update(kind=_K.NOT_FOUND, error_code=-32002, error="not found")
        else:
            # Every third version carries a ttlMs longer than the 30 s poll interval: the poll period
            # (and the deadline armed before the read came back) grows, and shrinks again after it.
            rejection = "simulated guardrail" if oracle.version in oracle.unsafe else None
            base.update(kind=_K.CONTENT, content_digest=oracle.digest, mime_type="text/plain", size=20,
                        content_count=1, guardrail_rejection=rejection,
                        ttl_ms=45_000 if oracle.version % 3 == 0 else 0, cache_scope=_PRIVATE)
        return replaced(_OUTCOME, base)


@dataclass(slots=True)
class Activity:
    aid: int
    run: int
    seq: int  # the command's sequence number in its run
    name: str
    arg: Any
    executed: bool = False
    result: Any = None
    poisoned: bool = False  # PostgreSQL rejects it every time: it never completes
    # A cycle (``sim.cycles``) runs one effect per event: ``cycle`` is the attempt under way, ``step``
    # its pauses so far; a lost attempt starts again (the ledger's cycle id hands the retry the same
    # ticket, and a committed accept replays). ``ticket``: the newest allocation it was granted.
    cycle: Coroutine[Any, Any, Any] | None = None
    step: int = 0
    ticket: ReadTicket | None = None
    ingress: Processing | None = None  # INGRESS_READ: the routing program's processing it belongs to


@dataclass(slots=True)
class Checkpoint:
    run: ProgramRun  # the run the checkpoint was taken in; a reset replays its first ``inputs`` inputs
    inputs: int
    draws: int
    signal_index: int

