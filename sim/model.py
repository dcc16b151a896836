"""The simulator's vocabulary: invariants, fault classes, events, profiles, traces, configuration.

Contract:
- An ``Event`` is one scheduled step of the world (a change, a delivery, an activity step, a timer,
  a reset ...); every random choice the generator made is recorded in it, so a ``Trace`` (seed,
  profile, events) replays to the same result, byte for byte.
- ``Invariant`` names what the checker (``sim/checker.py``) reports; ``SAFETY_INVARIANTS`` are the
  release gates, the rest is liveness.
- ``SimConfig`` holds the generator's knobs and the seams tests may replace (``judge``); it is
  pickled to worker processes, so its seams are module-level functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from mcpsync.workflows.ledger_rules import Judgement, judge_read
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import AcceptVerdict, OutboxEventType
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState

S = SubscriptionState
V = AcceptVerdict
KEY = SubscriptionKey(subject="sim", server="oracle", uri="oracle://doc/a")
WRONG_URI = "oracle://doc/%61"  # the same resource only after percent-decoding: never routed
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # fixed: the simulator has no clock
# outbox rows a read or catalog makes
INVALIDATIONS = frozenset({OutboxEventType.VERSION_ACCEPTED, OutboxEventType.TOMBSTONED})
# on the session queue
MCP_ACTIVITIES = frozenset({Act.MCP_UNSUBSCRIBE, Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE})
FLUSH_BUDGET = 3000  # drain steps before we call it a failure to quiesce
# A read the ingress makes itself (the routing program's ``ReadCycle``, ``McpSessionActivities.run_cycle``
# in production): a pseudo-activity of the session host, not of any run (a workflow reset does not touch
# it), executed in the read cycle's three steps. The program reports its verdict or falls back to a signal.
INGRESS_READ = "ingress_read_cycle"
# MCP_SUBSCRIBE_CYCLE: subscribe (step 0), mark (1), then the read cycle's three steps
SUBSCRIBE_CYCLE_READ = 2


# --- invariants and violations ---------------------------------------------------------------


class Invariant(StrEnum):
    # durable ordinals/watermark or accepted oracle version went back
    VERSION_REGRESSION = "version_regression"
    # version/tombstone/outbox row while the row was not ACTIVE (or on another generation)
    NOT_ACTIVE_WRITE = "not_active_write"
    LATE_TOMBSTONE = "late_tombstone"  # TOMBSTONE_PENDING from a read issued before a close
    OUTBOX_AFTER_CLOSE = "outbox_after_close"  # outbox row after the close fence froze
    UNCOMMITTED_DIGEST = "uncommitted_digest"  # an accepted digest the oracle never committed
    ORDINAL_ORDER = "ordinal_order"  # ordinals not unique and monotonic
    # a write PostgreSQL would reject (UNIQUE/CHECK): the activity never succeeds
    LEDGER_INTEGRITY = "ledger_integrity"
    WORKFLOW_ERROR = "workflow_error"  # an exception in workflow code
    LIVELOCK = "livelock"  # the main loop spins without blocking (Temporal: deadlocked workflow task)
    NO_CONVERGENCE = "no_convergence"  # quiet end, drained, final invalidation: not the oracle's last state
    # a clean row whose newest announced change was not read, or a dirty row whose work nobody owns
    COVERED_UNREAD = "covered_unread"
    # an idle ACTIVE subscription with a published bound (poll interval, or the safety period) armed its
    # next wake-up later than one bound after the last read the ledger allocated (or armed none)
    STALENESS_BOUND = "staleness_bound"
    # the run's record (the ``subscription`` query) names a receipt and a digest or watermark of two reads
    RECORD_ONE_READ = "record_one_read"
    # consecutive verifications of a scheduled row more than its period apart, the sweep running throughout
    VERIFICATION_GAP = "verification_gap"
    # an overdue verification not reported (an ``overdue`` outbox entry) or read within the watchdog's horizon
    OVERDUE_MISSED = "overdue_missed"


SAFETY_INVARIANTS = frozenset({
    Invariant.VERSION_REGRESSION, Invariant.NOT_ACTIVE_WRITE, Invariant.LATE_TOMBSTONE,
    Invariant.OUTBOX_AFTER_CLOSE, Invariant.UNCOMMITTED_DIGEST, Invariant.ORDINAL_ORDER,
})
"""The seed's release gates: what the fences promise whatever the schedule (the rest is liveness)."""


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: Invariant
    step: int
    detail: str


# --- faults, events, profiles, traces ------------------------------------------------------


class Fault(StrEnum):
    """Fault classes the generator may use (all by default); each can be switched off."""

    DROP = "drop"  # a change emits no notification
    DUPLICATE = "duplicate"  # a change emits 2-3 notifications (same or distinct ingress ids)
    REORDER = "reorder"  # queued messages delivered out of order
    OLD_SESSION = "old_session"  # notifications stamped with an older session generation
    WRONG_URI = "wrong_uri"  # a notification naming a URI variant
    DELETE = "delete"  # oracle deletes / recreates
    CLOSE = "close"  # close requests (update and signal)
    LOST_ACK = "lost_ack"  # unsubscribe ACK lost
    SESSION_LOSS = "session_loss"  # session dropped; reconnect as a new generation (maybe after a gap)
    READ_FAILURE = "read_failure"  # a read's activity fails or its result is malformed
    REVOKE = "revoke"  # a read is denied (the judge revokes) or the platform revokes
    GUARDRAIL = "guardrail"  # some content versions are not releasable to a model
    RETRY = "retry"  # an activity's response is lost after it took effect: it runs again
    CONTINUE_AS_NEW = "continue_as_new"
    RESET = "reset"  # workflow reset to an earlier snapshot
    CATALOG = "catalog"  # catalog_reconciled observations
    CONFLICT = "conflict"  # identity_conflict signals and resume updates
    RESTART = "restart"  # a closed key started again (new incarnation)
    CONCURRENT_READS = "concurrent_reads"  # profiles with SubscriptionOptions.max_concurrent_reads > 1
    POLLING = "polling"  # servers without subscribe, or that reject it
    SWEEP_STOP = "sweep_stop"  # the ingress's sweep stops (alive, not sweeping; or killed) and comes back


ALL_FAULTS = frozenset(Fault)


class Op(StrEnum):
    MUTATE = "mutate"  # oracle commits new content; n = notification copies (0: dropped);
    # fault tokens joined by "+": "same_id" (duplicates share the ingress id), "unsafe" (guardrail rejects it)
    DELETE = "delete"  # oracle deletes the resource; n = notification copies
    RECREATE = "recreate"  # oracle recreates it with new content; n = notification copies
    DELIVER = "deliver"  # network delivers the n-th queued message (n > 0: reordered)
    OLD_NOTE = "old_note"  # a notification from session generation (live - 1 - n)
    WRONG_URI = "wrong_uri"  # a notification for a URI variant
    CLOSE = "close"  # close update (fault "signal": the fire-and-forget signal)
    EXEC = "exec"  # the n-th scheduled activity named ``act`` runs
    # (fault: lost | ack_lost | denied | error | malformed)
    COMPLETE = "complete"  # the n-th executed activity named ``act`` returns to the workflow
    TIMER = "timer"  # the main loop's timer fires (poll, safety re-read or session recheck)
    RECONNECT = "reconnect"  # the session is lost; a new generation opens (n = 1: after a gap)
    SESSION_OPEN = "session_open"  # the session host opens a new generation after a gap
    CAN = "can"  # Temporal suggests continue-as-new
    CHECKPOINT = "checkpoint"  # remember the workflow as it is now (a reset point)
    RESET = "reset"  # reset to the n-th newest checkpoint (fault "reapply": later signals reapplied)
    CATALOG = "catalog"  # a reconciled catalog says whether the URI is listed, as measured n steps ago
    # (fault "proven": SNAPSHOT_PROVEN, which may revoke; otherwise SNAPSHOT_UNPROVEN)
    CONFLICT = "conflict"  # identity_conflict signal
    RESUME = "resume"  # resume update
    RESTART = "restart"  # start the key again after its chain finished
    REVOKE = "revoke"  # the platform's revoke signal
    FINAL_NOTE = "final_note"  # drain: one final invalidation from the live session
    SETTLE = "settle"  # the session host's settle timer: settling keys due now are processed
    FIRST_READ = "first_read"  # the first_read update (Update-with-Start's); in written traces only
    SWEEP = "sweep"  # time passes to the row's next due verification: the sweeping ingress looks then
    SWEEP_OFF = "sweep_off"  # the ingress stops sweeping (fault "kill": it dies, its session with it)
    SWEEP_ON = "sweep_on"  # the sweep runs again (after a kill: an ingress with a new session)


@dataclass(frozen=True, slots=True)
class Event:
    op: Op
    n: int = 0
    act: str = ""
    fault: str = ""

    def to_json(self) -> dict[str, Any]:
        """``op`` and the fields set (a default is left out)."""
        return {k: v for k, v in asdict(self).items() if v or k == "op"}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        return cls(**(obj | {"op": Op(obj["op"])}))


_EVENTS: dict[tuple[Op, int, str, str], Event] = {}


def event(op: Op, n: int = 0, act: str = "", fault: str = "") -> Event:
    """``Event(op, n, act, fault)``, one object a process for each value: events are frozen, the
    generator and the drain make one every step, and a dict lookup costs a fifth of a frozen
    dataclass's ``__init__``."""
    key = (op, n, act, fault)
    e = _EVENTS.get(key)
    if e is None:
        e = _EVENTS[key] = Event(op, n, act, fault)
    return e


@dataclass(frozen=True, slots=True)
class Profile:
    """Per-schedule environment: what the server does and how the workflow is configured."""

    capability: str = "subscribe"  # "subscribe" | "none" (polls) | "rejects" (advertised, refused: polls)
    max_concurrent_reads: int = 1  # SubscriptionOptions.max_concurrent_reads
    session_at_start: bool = True
    safety_read_seconds: float = 300.0  # SubscriptionOptions.safety_read_seconds (0: no safety re-read)
    sweep: bool = False  # the session host sweeps the ledger's due verifications from the start


@dataclass(frozen=True, slots=True)
class Trace:
    """A replayable schedule: ``replay(Trace.from_json(json.loads(text)))`` reproduces it."""

    seed: str
    profile: Profile
    events: tuple[Event, ...]
    violations: tuple[str, ...] = ()
    # The session host's ``read_on_notification`` setting the trace ran with (``SimConfig``).
    read_on_notification: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "profile": asdict(self.profile),
                "read_on_notification": self.read_on_notification,
                "events": [e.to_json() for e in self.events], "violations": list(self.violations)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Trace:
        return cls(seed=str(obj["seed"]), profile=Profile(**obj["profile"]),
                   events=tuple(Event.from_json(e) for e in obj["events"]),
                   violations=tuple(obj.get("violations", ())),
                   read_on_notification=bool(obj.get("read_on_notification", True)))


JudgeFn = Callable[..., Judgement]
"""``judge_read``'s signature: ``(row, issued, outcome, *, row_uri) -> Judgement`` (a seam for tests)."""

@dataclass(frozen=True)
class SimConfig:
    mean_events: int = 50  # events per schedule before the drain (uniform in [10, 2*mean-10])
    faults: frozenset[Fault] = ALL_FAULTS
    judge: JudgeFn = judge_read
    shrink_budget: int = 3000  # replays the shrinker may spend on one failing schedule
    # The session host's ``ServerConfig.read_on_notification``: a notified change of a row whose run
    # mirrors reports (``ingress_rules.ingress_read_request``) is read by the session host and reported
    # (``resource_read``); pulses for that (URI, generation) queue behind the read. False: every update
    # is signalled for the workflow to read.
    read_on_notification: bool = True


def schedule_seed(seed: int | str, index: int) -> str:
    return f"{seed}:{index}"


@dataclass(slots=True)
class ScheduleResult:
    seed: str
    profile: Profile
    events: list[Event]
    violations: list[Violation]
    steps: int = 0
    converged_after: int | None = None  # steps from the oracle's last change to convergence
    notification_reads: int = 0  # judged reads triggered by updated / follow_up
    fresh_reads: int = 0  # ... that served an oracle version no earlier read had served
    duplicate_deliveries: int = 0
    covered_updates: int = 0  # updates that skipped their read as COVERED
    coverage: dict[str, int] = field(default_factory=dict)
    read_on_notification: bool = True  # the ingress read notified changes itself

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def trace(self) -> Trace:
        return Trace(seed=self.seed, profile=self.profile, events=tuple(self.events),
                     violations=tuple(f"{v.invariant.value}@{v.step}: {v.detail}" for v in self.violations),
                     read_on_notification=self.read_on_notification)

