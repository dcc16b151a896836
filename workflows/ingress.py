"""The ingress's routing of notifications, as a program both interpreters run.

Contract:
- Pure and deterministic: no I/O, no clock, no asyncio. ``IngressRouter`` owns the keyed work queue
  (``WorkQueue``, keys (URI, session generation)) and the sequence one router runs for one key
  (``process``): take the key, note the notification in the ledger, read the change here and report
  it or signal the workflow (``_deliver``), then end the processing (``WorkQueue.done``): a key
  added meanwhile is ready again.
- Every effect is a request the program yields (``Note``, ``Stamp``, ``ReadCycle``, ``SignalUpdated``,
  ``ReportRead``, ...) and whose answer the interpreter sends back; an effect that raises is thrown
  into the program, which asks (``RouteFailed``) whether to route the key again. The session host
  (``worker/ingress/session_host.py``) performs them over PostgreSQL, the live MCP session and Temporal;
  the simulator (``sim/``) over its world, one effect or read-cycle step per scheduled event.
- Settle: a notification that arrives for a key after that key's read was sent (``WorkQueue.take``,
  the absorb point) and before its processing ends cannot be covered by that read (it may announce
  a change the server made after serving it), so the key is processed again: a note, then a read.
  That follow-up is held ``SETTLE_SECONDS`` from the first such notification (``WorkQueue.done``
  puts the key in ``settling``; ``release`` hands it out once due, at once if its read ended
  later), so the copies of one change that straddle the read, and a change notified meanwhile,
  cost one follow-up read instead of one each. It hides no change: the follow-up read still comes,
  allocated after every notification it covers was noted; a change notified while its key's read
  is in flight or settling is read at most ``SETTLE_SECONDS`` after its notification (or when that
  read ends, if later), plus one routing. The interpreter supplies the time (``offer(now=)``,
  ``release(now)``: seconds on its own clock) and wakes a router at ``next_due``; no clock decides
  coverage. The sweep's adds (``background``, no ``now``) start no settle.
- A judged read here that found nothing new and leaves nothing owed
  (``ingress_rules.stays_in_ledger``: UNCHANGED, the row clean, right after the current version's
  read) sends no signal: the ledger recorded it (receipt, ``covered``, the next verification due)
  and the workflow is not woken. Every other read here is reported (``resource_read``: a new
  version, not found, a guardrail rejection, a failure, a row left dirty); a read not judged, or
  not made, becomes ``resource_updated`` and the workflow reads. A run whose own timer still makes
  its safety reads (one started on 0.2.0) loses nothing: such a report only mirrored a read.
- The sweep's keys (a key only ``background`` offers made: ``counted`` False) are no notifications.
  Their note is a look (``Note.count`` False): the ledger answers the row and ``coverage.plan_note``'s
  work and writes nothing, so ``notified`` keeps counting notifications only, and the read that
  follows covers what the row counted at its allocation, as the workflow's own safety read does.
  The sweep's own look (``offer(looked=)``: the row as it claimed it) stands for that note: the
  allocation re-checks the row under its lock, and a read issued since the look makes the report go
  out (``stays_in_ledger`` compares the ordinals), so an older look costs a signal, never a change. A
  notification merged into such a key, or absorbed by its read, is counted as any other (the key is
  counted, or the accept counts what the read absorbed). No server named the URI, so no ambiguous
  sibling is meant: the key's routing ends with its own row.
- Counters are the program's and count notifications only: ``coalesced`` (merged into a waiting key,
  absorbed into a read, or a note that created no work), ``read`` (reports delivered), ``verified``
  (reads here kept in the ledger, no signal), ``routed`` (wake-ups delivered). A key only the
  sweep's synthetic notes made (``background`` offers, which the sweep counts) is routed uncounted.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Generic, TypeVar

from mcpsync.workflows.ingress_rules import ingress_read_request, stays_in_ledger
from mcpsync.workflows.records.ledger import NotedNotification
from mcpsync.workflows.records.read_cycle import ReadCycleRequest, ReadCycleResult, ReadReport
from mcpsync.workflows.records.subscription import ResourceUpdated, SubscriptionKey

__all__ = ["SETTLE_SECONDS", "Key", "Offer", "Turn", "Note", "UnknownUri", "Stamp", "Stamped", "ReadCycle",
           "SignalUpdated", "ReportRead", "Siblings", "SiblingInvalidated", "RouteFailed", "Effect",
           "IngressRouter"]

K = TypeVar("K", bound=Hashable)

SETTLE_SECONDS = 0.5
"""How long a key notified after its read was sent waits, from that notification, before it is
processed again (the module's contract: Settle). Long enough for the copies of one change that
straddle the read (milliseconds apart) and a writer's next change in the same burst to land in one
follow-up read; short against the staleness bound a subscription publishes (poll and safety
periods of seconds to minutes, kept by the workflow's own timer whatever the ingress does)."""


class WorkQueue(Generic[K]):
    """The ingress's keyed work queue, as client-go's workqueue: a *dirty* set and a *processing* set.

    A key is work to look at, never "what changed": processing a key reads the ledger row's level
    (``mcpsync.workflows.coverage``). A key added while it waits is merged (it is dirty already); a
    key added while it is processed is handed out again once processing ends (``done``), so one key
    is processed by one worker at a time and nothing added is lost. ``take`` lets the worker absorb
    what arrived so far, just before it requests a read that observes all of it.

    Two lanes: a key only *background* adds made (the resync's due safety reads) is handed out after
    every key a notification made ready, so a change never waits behind a sweep's batch; a
    notification for a key waiting in the background lane moves it to the front one.

    Settling, as client-go's delaying queue: a key a timed add (``now``) marked dirty after the read
    of its processing was sent (``take``) is not ready when its processing ends but ``settling``
    until ``SETTLE_SECONDS`` after that add; adds meanwhile merge into it, and ``release`` hands it
    out in the front lane once due."""

    def __init__(self) -> None:
        self.dirty: set[K] = set()
        self.processing: dict[K, bool] = {}  # key -> only background adds made the work it processes
        self.ready: deque[K] = deque()
        self.background: set[K] = set()  # dirty keys only background adds made
        self._later: deque[K] = deque()  # their lane (entries of keys moved or taken are skipped)
        self.sent: set[K] = set()  # processing keys whose read is sent (``take`` was called)
        self._added_after_send: dict[K, float] = {}  # processing key -> its first timed add since the send
        self.settling: dict[K, float] = {}  # dirty key -> when it is due (``release``)

    def add(self, key: K, *, background: bool = False, now: float | None = None) -> bool:
        """Mark ``key`` dirty; True when it became ready (the caller wakes a worker). False: merged
        into an add not processed yet (a foreground add moves a background key to the front lane),
        or it waits for its processing to end (and settles then when ``now``, the add's time, came
        after the processing's read was sent)."""
        if now is not None and not background and key in self.sent:
            self._added_after_send.setdefault(key, now)
        if key in self.dirty:
            if not background and key in self.background:
                self.background.discard(key)
                if key not in self.processing and key not in self.settling:
                    self.ready.append(key)
            return False
        self.dirty.add(key)
        if background:
            self.background.add(key)
        if key in self.processing:
            return False
        self._enqueue(key)
        return True

    def _enqueue(self, key: K) -> None:
        if key in self.background:
            self._later.append(key)
        else:
            self.ready.append(key)

    def get(self) -> K | None:
        """The next ready key, now processing (its dirty mark is taken), or None. The front lane
        first."""
        if self.ready:
            key = self.ready.popleft()
        else:
            while self._later and self._later[0] not in self.background:
                self._later.popleft()  # moved to the front lane, or taken already
            if not self._later:
                return None
            key = self._later.popleft()
        self.dirty.discard(key)
        self.processing[key] = key in self.background
        self.background.discard(key)
        return key

    def take(self, key: K) -> bool:
        """The worker processing ``key`` takes what was added since it got it (True if anything
        was): it is about to do the work that covers those adds."""
        if key not in self.processing:
            return False
        self.sent.add(key)
        self._added_after_send.pop(key, None)  # (a retried read takes what came after the first one)
        if key in self.dirty:
            self.dirty.discard(key)
            self.background.discard(key)
            return True
        return False

    def done(self, key: K) -> bool:
        """Processing ``key`` ended; True when it was added meanwhile and is ready again. False too
        when it settles (``settling``: added after its read was sent)."""
        self.processing.pop(key, None)
        self.sent.discard(key)
        added = self._added_after_send.pop(key, None)
        if key not in self.dirty:
            return False
        if added is not None:
            self.settling[key] = added + SETTLE_SECONDS
            return False
        self._enqueue(key)
        return True

    def next_due(self) -> float | None:
        """When the first settling key is due (None: none settles)."""
        return min(self.settling.values(), default=None)

    def release(self, now: float) -> list[K]:
        """The settling keys due at ``now``, now ready (front lane), in the order they settled."""
        due = [key for key, at in self.settling.items() if at <= now]
        for key in due:
            del self.settling[key]
            self.background.discard(key)  # (a notification's add made it settle: it is counted work)
            self.ready.append(key)
        return due


Key = tuple[str, int]
"""A work-queue key: (the notified URI, the session generation that received it)."""


class Offer(Enum):
    """What ``IngressRouter.offer`` did with a notification."""

    READY = "ready"  # the key became ready: wake a router
    MERGED = "merged"  # the key was waiting already: this pulse is merged into it
    WAITING = "waiting"  # the key is processing: it is looked at again when that ends
    OVERFLOW = "overflow"  # the generation's ready keys are at the bound: a backlog overflow


class Turn(Enum):
    """How ``IngressRouter.process`` left the key it processed."""

    IDLE = "idle"  # no key was ready, or the key is done with nothing added meanwhile
    READY = "ready"  # added meanwhile: ready again (wake a router)
    SETTLING = "settling"  # added after its read was sent: ready at ``WorkQueue.next_due`` (``release``)


@dataclass(frozen=True, slots=True)
class Note:
    """``FenceLedger.note_notification`` for (``uri``, ``generation``) -> ``NotedNotification | None``
    (None: no subscription has that exact URI). ``count``: a notification made the key, so the ledger
    counts it (``coverage.plan_note``'s write); False for a key only the sweep's synthetic notes made:
    the row is looked up and nothing is written (the module's contract: the sweep's keys)."""

    uri: str
    generation: int
    count: bool = True


@dataclass(frozen=True, slots=True)
class UnknownUri:
    """No exact match for ``uri``: audit it and look for identity conflicts -> None."""

    uri: str
    generation: int


@dataclass(frozen=True, slots=True)
class Stamp:
    """The update to deliver for (``uri``, ``generation``), stamped by the interpreter (``at``: now, its
    receive time; an ingress id), a fresh read request id, and the live session's generation ->
    ``Stamped``."""

    uri: str
    generation: int


@dataclass(frozen=True, slots=True)
class Stamped:
    update: ResourceUpdated
    at: datetime  # the update's received_at: when the read at the ingress was requested
    request_id: str
    live_generation: int | None  # the live session's generation (None: no live session)


@dataclass(frozen=True, slots=True)
class ReadCycle:
    """``McpSessionActivities.run_cycle(request, cycle_id=, absorb=)`` on the live session ->
    ``ReadCycleResult``, or None when it failed or took too long. ``absorb`` (the program's) is called
    once the allocation is granted, just before the read is sent; its count goes into the accept."""

    request: ReadCycleRequest
    cycle_id: str
    absorb: Callable[[], int] | None


@dataclass(frozen=True, slots=True)
class SignalUpdated:
    """``resource_updated`` to ``workflow_id`` -> True when delivered (False: no such workflow)."""

    workflow_id: str
    update: ResourceUpdated


@dataclass(frozen=True, slots=True)
class ReportRead:
    """``resource_read`` to ``workflow_id`` -> True when delivered (False: no such workflow)."""

    workflow_id: str
    report: ReadReport


@dataclass(frozen=True, slots=True)
class Siblings:
    """The other live subscriptions whose URI normalizes like ``uri`` (a listed ambiguous pair) ->
    ``list[tuple[workflow_id, sibling_uri]]``."""

    uri: str
    generation: int


@dataclass(frozen=True, slots=True)
class SiblingInvalidated:
    """Audit ``AMBIGUOUS_SIBLING_INVALIDATED``: ``sibling_uri`` is invalidated for ``observed_uri``
    -> None."""

    workflow_id: str
    sibling_uri: str
    observed_uri: str
    generation: int


@dataclass(frozen=True, slots=True)
class RouteFailed:
    """Routing the key raised ``error`` (attempt ``attempt``, from 0) -> True: route it again (the
    interpreter waited its backoff); False: give it up (the interpreter recorded the loss)."""

    uri: str
    generation: int
    attempt: int
    error: BaseException


Effect = Note | UnknownUri | Stamp | ReadCycle | SignalUpdated | ReportRead | Siblings | SiblingInvalidated \
    | RouteFailed
Routing = Generator[Effect, Any, None]


class IngressRouter:
    """The work queue and routing of one (subject, server)'s notifications.

    ``read_on_notification``: the server's setting (a notified change of a row whose run mirrors
    reports is read here); ``max_pending``: ready or settling keys allowed per session generation
    (None: no bound);
    ``host_id``: names the ingress's read cycles (``ingress/<host_id>/<notification id>``)."""

    def __init__(self, subject: str, server: str, *, host_id: str, read_on_notification: bool,
                 max_pending: int | None = None) -> None:
        self.subject = subject
        self.server = server
        self.host_id = host_id
        self.read_on_notification = read_on_notification
        self.max_pending = max_pending
        self.work: WorkQueue[Key] = WorkQueue()
        self.pending: Counter[int] = Counter()  # ready or settling keys per session generation
        # The row as the sweep's look found it, per key only background adds made (``offer``'s
        # ``looked``): its route takes it instead of a Note.
        self.looked: dict[Key, NotedNotification] = {}
        self.received = 0
        self.merged = 0  # notifications merged into a key a notification made
        self.absorbed = 0  # notifications a read took as they arrived while their key was processed
        self.no_work = 0  # notes that created no work (covered by construction)
        self.read = 0
        self.verified = 0
        self.routed = 0

    @property
    def coalesced(self) -> int:
        return self.merged + self.absorbed + self.no_work

    def owes(self) -> bool:
        """A key is waiting or being processed."""
        return bool(self.work.dirty or self.work.processing)

    # --- the queue -----------------------------------------------------------------------------

    def offer(self, uri: str, generation: int, *, background: bool = False,
              now: float | None = None, looked: NotedNotification | None = None) -> Offer:
        """A notification for (``uri``, ``generation``) arrived (its URI passed the ingress's checks)
        at ``now`` (the interpreter's clock, seconds; None: it starts no settle).
        ``background``: a resync's synthetic note, handed out after the notifications, never counted;
        ``looked``: the row as the sweep's look found it (``VerificationLedger.due``), which the key's
        route takes instead of looking again while no notification made the key."""
        key = (uri, generation)
        self.received += not background
        offer = self._offer(key, background=background, now=now)
        if not background:
            self.looked.pop(key, None)  # a notification's key notes (and counts) itself
        elif looked is not None and offer != Offer.OVERFLOW and key in self.work.background:
            self.looked[key] = looked
        return offer

    def _offer(self, key: Key, *, background: bool, now: float | None) -> Offer:
        generation = key[1]
        if key in self.work.dirty:
            # A notification for a key only background adds made is that key's counted work now.
            self.merged += not background and key not in self.work.background
            # a notification moves a background key ahead
            self.work.add(key, background=background, now=now)
            return Offer.MERGED
        if key not in self.work.processing and self.max_pending is not None \
                and self.pending[generation] >= self.max_pending:
            return Offer.OVERFLOW
        if self.work.add(key, background=background, now=now):
            self.pending[generation] += 1
            return Offer.READY
        return Offer.WAITING

    def release(self, now: float) -> int:
        """Settling keys due at ``now`` become ready; how many (the interpreter wakes that many
        routers)."""
        return len(self.work.release(now))

    def process(self) -> Generator[Effect, Any, Turn]:
        """One router's turn: the next ready key, routed, then done; how it left that key."""
        key = self.work.get()
        if key is None:
            return Turn.IDLE
        generation = key[1]
        self.pending -= Counter([generation])  # (a generation's count that reaches 0 is dropped)
        turn = Turn.IDLE
        try:
            yield from self._route_with_retry(key, counted=not self.work.processing[key])
        finally:
            if self.work.done(key):
                turn = Turn.READY
            elif key in self.work.settling:
                turn = Turn.SETTLING
            if turn != Turn.IDLE:
                self.pending[generation] += 1
        return turn

    # --- one key -------------------------------------------------------------------------------

    def _route_with_retry(self, key: Key, *, counted: bool) -> Routing:
        """PostgreSQL or Temporal briefly away must not lose an invalidation: the interpreter decides
        (``RouteFailed``) whether to route again or give the key up (the next notification or a poll
        repairs it). ``counted``: a notification made this work, not only the resync."""
        uri, generation = key
        attempt = 0
        while True:
            try:
                yield from self._route(uri, generation, counted)
                return
            except Exception as exc:  # noqa: BLE001 - any failure of an effect: retry or give up
                if not (yield RouteFailed(uri, generation, attempt, exc)):
                    return
                attempt += 1

    def _route(self, uri: str, generation: int, counted: bool) -> Routing:
        looked = self.looked.pop((uri, generation), None)
        noted = looked if looked is not None and not counted else (yield Note(uri, generation, count=counted))
        if noted is None:
            yield UnknownUri(uri, generation)
            return
        yield from self._deliver(noted, uri, generation, own=True, counted=counted)
        if not counted:
            return  # the sweep's key: no server named this URI, so no other spelling is meant
        # A listed ambiguous pair (both spellings subscribed): the server may mean either one, so
        # both are read. Each sibling is invalidated under its own exact URI, never this one.
        for workflow_id, sibling_uri in (yield Siblings(uri, generation)):
            yield SiblingInvalidated(workflow_id, sibling_uri, uri, generation)
            sibling = yield Note(sibling_uri, generation)
            if sibling is not None:
                yield from self._deliver(sibling, sibling_uri, generation, own=False, counted=counted)

    def _deliver(self, noted: NotedNotification, uri: str, generation: int, *, own: bool,
                 counted: bool) -> Routing:
        """The update the ledger just recorded for the exact ``uri``, to the workflow its row names: read
        here and reported when the fence allows it and the read was judged (not reported when it stays
        in the ledger: ``stays_in_ledger``); else ``resource_updated``
        (the row stays dirty: the workflow reads), without a read here only when the note created work.
        ``own``: this router processes the key and absorbs the pulses that arrive until the read is sent."""
        stamped: Stamped = yield Stamp(uri, generation)
        sig = stamped.update
        req = None
        if self.read_on_notification and stamped.live_generation == generation:
            key = SubscriptionKey(subject=self.subject, server=self.server, uri=uri)
            req = ingress_read_request(noted, key, generation=generation, request_id=stamped.request_id)
        if req is not None:
            cycle: ReadCycleResult | None = yield ReadCycle(
                req, cycle_id=f"ingress/{self.host_id}/{sig.notification_id}",
                absorb=self._absorber((uri, generation)) if own else None)
            if cycle is not None and cycle.judged:
                if stays_in_ledger(noted, cycle):  # nothing new, nothing owed: no signal
                    self.verified += counted
                    return
                report = ReadReport(update=sig, requested_at=stamped.at, cycle=cycle)
                if (yield ReportRead(noted.workflow_id, report)):
                    self.read += counted
                return
        elif not noted.work:
            self.no_work += counted
            return
        if (yield SignalUpdated(noted.workflow_id, sig)):  # a wake-up: the workflow reads (its row is dirty)
            self.routed += counted

    def _absorber(self, key: Key) -> Callable[[], int]:
        """``run_cycle``'s ``absorb`` for the key this router processes: pulses that arrived since the
        note are taken once the read is allocated, just before it is sent, so the read observes their
        change; its accept counts them (``absorbed`` counts the notifications among them)."""
        def absorb() -> int:
            notified = key not in self.work.background
            if not self.work.take(key):
                return 0
            self.absorbed += notified
            return 1
        return absorb
