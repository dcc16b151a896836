"""The invariant checker: what every step and the quiet end of a schedule must satisfy.

Contract:
- ``Checker`` is one object of a ``Simulation`` (``sim.checker``) with its own fields; it reads the
  world through the simulation it is given and writes nothing of it but violations and coverage.
  ``check`` runs after EVERY step against the oracle and the ledger's log of committed writes;
  ``check_covered`` at the quiet end before any timer; ``verdict`` after the drain (convergence, no
  stuck close or update). The ingress tells it what the world knows and the program does not
  (``note_change``, ``ingress_granted``).
- It judges from outside the program: the ledger's rows and writes, the oracle's committed versions,
  the timer the run armed, the record it answers (``record_one_read``); never its own bookkeeping.
- ``staleness_bound`` is strict: a wake-up armed later than one published bound after the last read
  the ledger allocated is a violation by any amount. For a row the ledger schedules (marked with a
  safety-read period, not polling) the run keeps only the watchdog: its wake-up may come one watchdog
  horizon later (a look finds an overdue row and reads it within that).
- The verification schedule is judged from the ledger's writes (a verification: a granted allocation
  of the ACTIVE row whose ``mark_active`` carried a safety-read period; a resubscribe keeps the chain
  while the row holds a version, ``verification_rules.continues_chain``): ``verification_gap``
  (strict) holds consecutive verifications to the period while the sweep ran throughout the gap on
  the row's session, reading at the ingress; ``overdue_missed`` holds every gap over the period to one
  ``overdue`` report, and an idle run (nothing of it due or in flight) to a gap no longer than the
  period plus the watchdog's horizon, whatever the sweep does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from mcpsync.workflows.coverage import dirty
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.records.subscription import CLOSING_STATES, TERMINAL_STATES, TriggerReason
from mcpsync.workflows.records.subscription import SubscriptionState as S
from mcpsync.workflows.subscription_program import WaitKind
from mcpsync.workflows.verification_rules import continues_chain
from sim.interpreter import ProgramRun, RunStage, Signal
from sim.ledger import LedgerWrite
from sim.model import INVALIDATIONS, Invariant

if TYPE_CHECKING:
    from sim.engine import Simulation

V = AcceptVerdict
# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__``
# hook (about ten times a plain attribute), and ``check`` runs after every step.
ACTIVE, IDLE, WEDGED = S.ACTIVE, WaitKind.IDLE, RunStage.WEDGED
_TOMBSTONE_PENDING, _DISCOVERED, _SUBSCRIBING = S.TOMBSTONE_PENDING, S.DISCOVERED, S.SUBSCRIBING
_VERDICT_TOMBSTONE_PENDING = V.TOMBSTONE_PENDING
VERSION_WRITES = frozenset({V.ACCEPTED, V.UNCHANGED, V.TOMBSTONE_PENDING, V.GUARDRAIL_REJECTED})
CURRENT = frozenset({V.ACCEPTED, V.UNCHANGED})
SERVED = frozenset({ReadOutcomeKind.CONTENT, ReadOutcomeKind.NOT_FOUND})  # the oracle served a version
NOTIFICATION_TRIGGERS = frozenset({TriggerReason.UPDATED, TriggerReason.FOLLOW_UP})
SETTLED_GONE = frozenset({S.TOMBSTONE_PENDING, S.TOMBSTONED})
WORK_SIGNALS = frozenset({Signal.UPDATED, Signal.READ_REPORTED})


class Checker:
    """The invariants of one schedule, judged from outside the program (the module's contract)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._log_seen = 0
        self._prev = FenceSnapshot(exists=False)
        self._row_faulty = True  # the last row judged broke a rule (``_check_row`` judges it again)
        self._clean_key: tuple[FenceSnapshot, int, int] | None = None  # what ``_check_clean`` last read
        self._converged: tuple[FenceSnapshot, int, int, bool] | None = None  # the last answer, and its inputs
        self._accepted_version = 0
        self._max_allocated = 0
        self._max_outbox_ordinal = 0
        self._close_fences: list[int] = []
        self._last_allocated_at: datetime | None = None  # when the ledger last granted a read ordinal
        self._late_timers: set[datetime | None] = set()  # wake-ups already reported as too late
        # what the checks last read: the run and its activations (``check``), the row and allocation time
        # (``_check_read_deadline``), the receipts and reopened rows (``_check_record``)
        self._run_seen: ProgramRun | None = None
        self._activations_seen = 0
        self._deadline_row: FenceSnapshot | None = None
        self._deadline_allocated_at: datetime | None = None
        self._receipts_seen = 0
        self._reopened_seen = 0
        self._noted_change: dict[int, int] = {}  # the row's notified count -> the change that note announced
        self._noted_writes = 0  # writes to ``_noted_change`` (``newest_noted`` asks again after one)
        self._newest_noted: tuple[int, int, int] = (-1, -1, 0)  # (covered, writes, answer) of the last ask
        self._ingress_ordinals: set[int] = set()  # ordinals the ingress's reads were granted
        self._swept_ordinals: set[int] = set()  # ... for the sweep's notes alone
        self._covered_unread_reported = False
        self._record_reported = False
        self._record_key: tuple[object, ...] | None = None  # what the last record check saw
        self._reopened: set[int] = set()  # last receipts of rows a new incarnation reopened (digest cleared)
        # the verification chain, from the ledger's writes
        self._chain_period: float | None = None  # its safety-read period (None: not on the schedule)
        self._chain_at: datetime | None = None  # when ``mark_active`` started it
        self._verified: datetime | None = None  # its newest verification
        self._gap_reports = 0  # ``overdue`` reports since then
        self._overdue_after: datetime | None = None  # an idle run past this has missed the open gap
        self._sweep_since: datetime | None = None  # since when the sweep has kept the row on its own
        self.converged_since: int | None = 0
        self.count_reads = True
        self.notification_reads = 0  # reads triggered by updated/follow_up that reached the judge
        self.fresh_reads = 0  # ... of which served an oracle version no earlier read had served
        self.observed: set[int] = set()

    def check(self) -> None:
        row = self.sim.ledger.row
        if row is not self._prev or self._row_faulty:
            self._check_row(row)  # most steps write nothing: the row is the one judged last step
        log = self.sim.ledger.log
        if len(log) > self._log_seen:  # most steps write nothing: no slice to make
            for w in log[self._log_seen:]:
                self._check_write(w)
            self._log_seen = len(log)
        # The run's state changes only in an activation: whether one ran since the last check.
        wf = self.sim.wf
        ran = wf is not self._run_seen or wf.activations != self._activations_seen
        if ran:
            self._run_seen, self._activations_seen = wf, wf.activations
        # What ``_check_clean`` reads (its report is made once): the row compared by identity, as
        # ``==`` on two records compares every field.
        clean = self._clean_key
        if clean is None or clean[0] is not row or clean[1] != self._noted_writes \
                or clean[2] != self._accepted_version:
            self._clean_key = (row, self._noted_writes, self._accepted_version)
            self._check_clean()
        # What the read-deadline check reads: the run, the row (by identity) and the last allocation's
        # time. With none of them changed, neither is its answer (a late wake-up is reported once).
        if ran or row is not self._deadline_row or self._last_allocated_at != self._deadline_allocated_at:
            self._deadline_row, self._deadline_allocated_at = row, self._last_allocated_at
            self._check_read_deadline()
        if self._overdue_after is not None:
            self._check_overdue()
        self._track_sweep()
        # What the record check reads: the run, the receipts (only appended) and the reopened rows.
        receipts, reopened = len(self.sim.ledger.receipts), len(self._reopened)
        if (ran or receipts != self._receipts_seen or reopened != self._reopened_seen) \
                and not self._record_reported:
            self._receipts_seen, self._reopened_seen = receipts, reopened
            self._check_record()
        if self.converged():
            if self.converged_since is None:
                self.converged_since = self.sim.step
        else:
            self.converged_since = None

    def _check_row(self, row: FenceSnapshot) -> None:
        """The row against the one judged before it and the oracle's committed digests. A row judged
        before is judged again only if it was faulty: compared with itself it cannot regress, and the
        committed digests only grow, so a sound row stays sound."""
        prev = self._prev
        before = len(self.sim.violations)
        if prev.exists:
            if row.last_accepted_ordinal < prev.last_accepted_ordinal or row.watermark < prev.watermark:
                self.sim.violate(Invariant.VERSION_REGRESSION,
                                 f"durable lastAccepted/watermark {prev.last_accepted_ordinal}/"
                                 f"{prev.watermark} -> {row.last_accepted_ordinal}/{row.watermark}")
            if row.last_issued_ordinal < prev.last_issued_ordinal:
                self.sim.violate(Invariant.ORDINAL_ORDER, f"lastIssued {prev.last_issued_ordinal} -> "
                                                           f"{row.last_issued_ordinal}")
        if row.exists and (row.last_accepted_ordinal > row.last_issued_ordinal
                           or row.watermark > row.last_issued_ordinal):
            self.sim.violate(Invariant.LEDGER_INTEGRITY, "CHECK lastAccepted/watermark <= lastIssued")
        if row.last_accepted_digest is not None and row.last_accepted_digest not in self.sim.oracle.committed:
            self.sim.violate(Invariant.UNCOMMITTED_DIGEST, f"row digest {row.last_accepted_digest[:20]}")
        self._row_faulty = len(self.sim.violations) > before
        self._prev = row

    def noted(self, notified: int, change: int) -> None:
        """The note that made the row's count ``notified`` announced oracle version ``change``."""
        self._noted_change[notified] = change
        self._noted_writes += 1

    def absorbed(self, notified: int, change: int) -> None:
        """Pulses a read absorbed brought the row's count to ``notified``; the newest of them announced
        oracle version ``change``."""
        self._noted_change[notified] = max(self._noted_change.get(notified, 0), change)
        self._noted_writes += 1

    def ingress_granted(self, ordinal: int, *, swept: bool = False) -> None:
        """The ingress's read was granted ``ordinal`` (``swept``: for the sweep's synthetic note alone, a
        safety read: not a notification's, so reads per distinct change leave it out)."""
        self._ingress_ordinals.add(ordinal)
        if swept:
            self._swept_ordinals.add(ordinal)

    def newest_noted(self, covered: int) -> int:
        """The newest oracle version announced by a note the count ``covered`` includes."""
        asked_covered, writes, answer = self._newest_noted
        if asked_covered != covered or writes != self._noted_writes:
            answer = max((c for n, c in self._noted_change.items() if n <= covered), default=0)
            self._newest_noted = (covered, self._noted_writes, answer)
        return answer

    def _check_read_deadline(self) -> None:
        """STALENESS_BOUND, for an idle ACTIVE subscription on a live session: judged from the ledger's
        allocation time and the timer the run armed, not the fence's own deadline."""
        wf = self.sim.wf
        if self._last_allocated_at is None or not self.sim.chain_running or wf.main_wait != IDLE:
            return
        s = wf.fence.s
        if s.state != ACTIVE or wf.program.session is None or s.close_requested \
                or s.pending_trigger is not None or s.in_flight or wf.program.reads_running:
            return  # a read (or resubscribe) is already on its way, or no read is possible
        bound = s.staleness_bound_seconds if s.staleness_bound_seconds is not None \
            else self.sim.profile.safety_read_seconds
        if not bound:
            return
        if s.staleness_bound_seconds is None and self.sim.ledger.safety_read_seconds is not None:
            # The ledger schedules the row: the watchdog's horizon, while the ledger holds it ACTIVE (a
            # read that left ACTIVE is on its way to the run as a report).
            if self.sim.ledger.row.state != ACTIVE:
                return
            bound += wf.start_args.options.watchdog_seconds
        promised = self._last_allocated_at + timedelta(seconds=bound)
        wake = wf.timer_at
        if (wake is None or wake > promised) and wake not in self._late_timers:
            self._late_timers.add(wake)
            late = "never" if wake is None \
                else f"at +{(wake - self._last_allocated_at).total_seconds():.3f} s"
            self.sim.violate(Invariant.STALENESS_BOUND,
                             f"last read allocated {self._last_allocated_at:%H:%M:%S}, bound {bound:.0f} s, "
                             f"next wake-up {late}")

    def _check_record(self) -> None:
        """RECORD_ONE_READ: the run's record (production's ``record``, what the query answers) names one
        read: the ledger's receipt ``last_receipt_id`` is at the record's watermark (the newest read that
        moved the version) and, when that read saw content, carries the record's digest (none only on a
        row reopened after it: no current version). A tombstone's receipt has no digest of its own.
        The record copies those three fields from the fence state, so they are judged there, and the
        record itself is made for a report and once at the quiet end (``record_names_the_fence``):
        building the 30-field record at every change of them was 4.6 % of the instructions."""
        # While none of the fields changes, the check's answer cannot change either (``check`` asks
        # after an activation or a new receipt or reopened row).
        wf = self.sim.wf
        if wf.stage == WEDGED:
            return
        s = wf.fence.s
        fields = (s.last_receipt_id, s.watermark, s.last_accepted_digest)
        key = (fields, self._receipts_seen, self._reopened_seen)
        if key == self._record_key:
            return
        self._record_key = key
        receipt_id, watermark, digest = fields
        if receipt_id is None:
            return
        receipt = next((x for x in self.sim.ledger.receipts if x.receipt_id == receipt_id), None)
        if receipt is not None and receipt.ordinal == watermark and (
                receipt.digest in (None, digest)
                or (digest is None and receipt.receipt_id in self._reopened)):
            return
        self._record_reported = True
        r = wf.program.record()
        self.sim.violate(Invariant.RECORD_ONE_READ,
                         f"record: receipt {r.last_receipt_id} digest {str(r.last_accepted_digest)[:16]} "
                         f"watermark {r.watermark}; ledger: {receipt}")

    def record_names_the_fence(self) -> None:
        """At the quiet end: the record (what the query answers) names the receipt, watermark and digest
        of the fence state that ``_check_record`` judged."""
        wf = self.sim.wf
        if wf.stage == WEDGED or self._record_reported:
            return
        s = wf.fence.s
        fields = (s.last_receipt_id, s.watermark, s.last_accepted_digest)
        r = wf.program.record()
        if (r.last_receipt_id, r.watermark, r.last_accepted_digest) != fields:
            self._record_reported = True
            self.sim.violate(Invariant.RECORD_ONE_READ,
                             f"record: receipt {r.last_receipt_id} digest {str(r.last_accepted_digest)[:16]} "
                             f"watermark {r.watermark}; fence state: {fields}")

    def sweep_held(self) -> None:
        """The sweep's look found the row's key busy (a read in flight, a key settling): the gap it is in
        is not the sweep's alone to keep."""
        self._sweep_since = None

    def _track_sweep(self) -> None:
        """Since when the sweep keeps the row on its own: it sweeps on the live session the row is
        ACTIVE on, and that session host reads at the ingress for the row (``read_reports``)."""
        sim = self.sim
        ingress = sim.ingress
        if not ingress.sweep_on:
            self._sweep_since = None
            return
        row, live = sim.ledger.row, sim.host.live
        if self._chain_period is not None and live is not None \
                and live.generation == row.session_generation and row.state == ACTIVE and row.read_reports \
                and ingress.router.read_on_notification:
            if self._sweep_since is None:
                self._sweep_since = sim.times[sim.step]
        else:
            self._sweep_since = None

    def _verification(self, w: LedgerWrite) -> None:
        """A granted allocation of the ACTIVE row: a verification of a scheduled chain closes the gap since
        the previous one (VERIFICATION_GAP: longer than the period while the sweep ran throughout;
        OVERDUE_MISSED: longer than the period and not reported exactly once)."""
        period = self._chain_period
        if period is None:
            return
        now = self.sim.times[self.sim.step]
        reports = self._gap_reports + (w.outbox is not None)
        prev = self._verified
        self._verified, self._gap_reports = now, 0
        self._open_gap(now)
        if prev is None or (gap := (now - prev).total_seconds()) <= period:
            return
        self.sim.cover("verification.overdue_gap")
        if reports != 1:
            self.sim.violate(Invariant.OVERDUE_MISSED,
                             f"a verification gap of {gap:.1f} s (period {period:.0f} s) closed with "
                             f"{reports} overdue reports (one is owed)")
        if self._sweep_since is not None and self._sweep_since <= prev:
            self.sim.violate(Invariant.VERIFICATION_GAP,
                             f"verifications {gap:.1f} s apart (period {period:.0f} s), the sweep running "
                             f"since {self._sweep_since:%H:%M:%S}")

    def _open_gap(self, since: datetime) -> None:
        """A gap of the scheduled chain opens at ``since`` (its start, or a verification): an idle run
        past its period plus the watchdog's horizon has missed it."""
        assert self._chain_period is not None
        horizon = self.sim.wf.start_args.options.watchdog_seconds
        self._overdue_after = since + timedelta(seconds=self._chain_period + horizon)

    def _check_overdue(self) -> None:
        """OVERDUE_MISSED, for an idle run (nothing due or in flight, its next wake-up ahead) of a scheduled
        ACTIVE row: the open gap since the chain's newest verification (or its start) is no longer than
        the period plus the run's watchdog horizon, whatever the sweep does: the watchdog looked within its
        horizon of the gap going overdue and read."""
        sim = self.sim
        now = sim.times[sim.step]
        if self._overdue_after is None or now <= self._overdue_after or not sim.chain_running \
                or sim.ledger.row.state != ACTIVE:
            return
        wf = sim.wf
        s = wf.fence.s
        if wf.main_wait != IDLE or s.state != ACTIVE or wf.program.session is None or s.close_requested \
                or s.pending_trigger is not None or s.in_flight or wf.program.reads_running:
            return
        wake = wf.timer_at
        if wake is not None and wake <= now:
            return  # its wake-up is due: the timer fires at the generator's pick (the dispatch modelled)
        since = self._verified or self._chain_at
        self._overdue_after = None  # reported once per gap
        self.sim.violate(Invariant.OVERDUE_MISSED,
                         f"no verification since {since:%d %H:%M:%S} (period {self._chain_period:.0f} s, "
                         f"watchdog {wf.start_args.options.watchdog_seconds:.0f} s), the run idle with its "
                         f"next wake-up {'never' if wake is None else f'at {wake:%d %H:%M:%S}'}")

    def _check_write(self, w: LedgerWrite) -> None:
        if w.kind == "allocate":
            self._last_allocated_at = self.sim.times[self.sim.step]
            if w.ordinal <= self._max_allocated:
                self.sim.violate(Invariant.ORDINAL_ORDER,
                                 f"allocated {w.ordinal} after {self._max_allocated}")
            self._max_allocated = max(self._max_allocated, w.ordinal)
            if w.before.state == ACTIVE:
                self._verification(w)
            return
        if w.kind == "watch":
            self._gap_reports += w.outbox is not None
            return
        if w.kind == "close":
            self._close_fences.append(w.ordinal)
            self.sim.cover("close_fenced")
            return
        if w.kind == "tombstone":
            if w.before.state != _TOMBSTONE_PENDING:
                self.sim.violate(Invariant.NOT_ACTIVE_WRITE, f"tombstone confirmed from {w.before.state}")
            return
        if w.kind == "revoke":
            self.sim.cover(f"revoked_from.{w.before.state}")
            if w.before.state in TERMINAL_STATES:
                self.sim.violate(Invariant.NOT_ACTIVE_WRITE, f"revocation outbox row from {w.before.state}")
            return
        if w.kind == "state" and w.before.state in TERMINAL_STATES and w.after.state == _DISCOVERED \
                and w.after.last_receipt_id is not None:
            self._reopened.add(w.after.last_receipt_id)
        if w.kind == "state" and w.before.state == _SUBSCRIBING and w.after.state == ACTIVE:
            # ``mark_active``: the row's verification chain goes on while it holds a version (the
            # ledger's rule of what one chain is), else a new one starts; scheduled with a period
            self._chain_period = self.sim.ledger.safety_read_seconds
            if self._chain_at is None or not continues_chain(w.before.last_accepted_digest):
                self._chain_at, self._verified, self._gap_reports = self.sim.times[self.sim.step], None, 0
            self._overdue_after = None
            if self._chain_period is not None:
                self._open_gap(self._verified or self._chain_at)
        if w.kind != "accept":
            return
        o, j, before = w.outcome, w.judgement, w.before
        assert o is not None and j is not None
        if o.kind in SERVED and o.server_version.startswith("v"):
            served_version = int(o.server_version[1:])
            if self.count_reads and o.trigger in NOTIFICATION_TRIGGERS \
                    and o.ordinal not in self._swept_ordinals:
                self.notification_reads += 1
                self.fresh_reads += served_version not in self.observed
            self.observed.add(served_version)
        status = w.receipt.status if w.receipt else None
        invalidation = w.outbox if w.outbox is not None and w.outbox.event_type in INVALIDATIONS else None
        version_write = status in VERSION_WRITES or w.outbox is not None
        fence = max(self._close_fences, default=0)
        fenced = bool(self._close_fences) and o.ordinal <= fence
        if version_write:
            issued = w.issued
            if (before.state != ACTIVE or o.session_generation != before.session_generation
                    or o.subscription_generation != before.subscription_generation or issued is None
                    or issued.session_generation != o.session_generation
                    or issued.subscription_generation != o.subscription_generation):
                self.sim.violate(Invariant.NOT_ACTIVE_WRITE,
                                 f"{status} ordinal {o.ordinal} while row {before.state} gen "
                                 f"{before.session_generation}/{before.subscription_generation}, read gen "
                                 f"{o.session_generation}/{o.subscription_generation}")
        if status == _VERDICT_TOMBSTONE_PENDING and fenced:
            self.sim.violate(Invariant.LATE_TOMBSTONE, f"ordinal {o.ordinal} <= close ordinal {fence}")
        if invalidation is not None:
            if before.state in CLOSING_STATES or before.state in TERMINAL_STATES or fenced:
                self.sim.violate(Invariant.OUTBOX_AFTER_CLOSE,
                                 f"outbox ordinal {o.ordinal} (row {before.state}, close ordinal {fence})")
            if invalidation.ordinal <= self._max_outbox_ordinal:
                self.sim.violate(Invariant.ORDINAL_ORDER, f"outbox ordinal {invalidation.ordinal} after "
                                                           f"{self._max_outbox_ordinal}")
            self._max_outbox_ordinal = max(self._max_outbox_ordinal, invalidation.ordinal)
        if status in CURRENT and (o.content_digest is None
                                                    or o.content_digest not in self.sim.oracle.committed):
            self.sim.violate(Invariant.UNCOMMITTED_DIGEST,
                             f"{status} digest {o.content_digest} never committed")
        if w.after.last_accepted_ordinal != before.last_accepted_ordinal \
                or status in CURRENT:
            served = int(o.server_version[1:]) if o.server_version.startswith("v") else 0
            if served < self._accepted_version:
                self.sim.violate(Invariant.VERSION_REGRESSION,
                                 f"{status} ordinal {o.ordinal} serves oracle v{served} over accepted "
                                 f"v{self._accepted_version}")
            self._accepted_version = max(self._accepted_version, served)

    def converged(self) -> bool:
        """The row holds what the oracle holds (or both are gone). Asked every step: the answer is
        kept while the row, the oracle's version and the newest accepted version are the same."""
        row, oracle, accepted = self.sim.ledger.row, self.sim.oracle, self._accepted_version
        last = self._converged
        if last is not None and last[0] is row and last[1] == oracle.version and last[2] == accepted:
            return last[3]
        answer = self._converged_now(row, accepted)
        self._converged = (row, oracle.version, accepted, answer)
        return answer

    def _converged_now(self, row: FenceSnapshot, accepted: int) -> bool:
        oracle = self.sim.oracle
        if not row.exists:
            return False
        if oracle.exists:
            if row.state != ACTIVE:
                return False
            if oracle.version in oracle.unsafe:  # not releasable: the fence must have read it
                return accepted == oracle.version
            return row.last_accepted_digest == oracle.digest
        return row.state in SETTLED_GONE

    def work_owned(self) -> bool:
        """Someone will read KEY without a new notification: the workflow has a read pending or in
        flight, or a signal or report is on its way to it, or the ingress is processing the key."""
        s = self.sim.wf.fence.s
        return bool(s.pending_trigger is not None or s.in_flight or self.sim.ingress.router.owes()
                    or any(m.kind in WORK_SIGNALS for m in self.sim.queue))

    def _check_clean(self) -> None:
        """Every step: a clean ACTIVE row (``notified == covered``) says the read that set ``covered`` was
        allocated after every note it counts was recorded, so an accepted read served the newest change
        any of them announced (``COVERED_UNREAD`` otherwise)."""
        row = self.sim.ledger.row
        if not row.exists or row.state != ACTIVE or dirty(row) or self._covered_unread_reported:
            return
        noted = self.newest_noted(row.covered)
        if noted > self._accepted_version:
            self._covered_unread_reported = True
            self.sim.violate(Invariant.COVERED_UNREAD,
                             f"the row is clean (notified = covered = {row.covered}) but a note announced"
                             f" oracle v{noted} and the newest read accepted served "
                             f"v{self._accepted_version}")

    def check_covered(self) -> None:
        """At the quiet end, the subscription ACTIVE and idle, a dirty row's work must be owned
        (``workflows/coverage.py``) when notes came after the newest allocation or that allocation was the
        ingress's. A workflow read that observed nothing, with no later note, is not retried by contract."""
        wf, row = self.sim.wf, self.sim.ledger.row
        s = wf.fence.s
        if (not self.sim.chain_running or wf.main_wait != WaitKind.IDLE or row.state != S.ACTIVE
                or s.state != S.ACTIVE or self.work_owned()):
            return
        handed_over = row.last_issued_ordinal in self._ingress_ordinals
        if dirty(row) and (row.notifications_seen > row.allocated_sequence or handed_over) \
                and not self.sim.signals_erased:
            self.sim.violate(Invariant.COVERED_UNREAD,
                             f"the row is dirty (notified {row.notifications_seen} > covered {row.covered},"
                             f" newest allocation at {row.allocated_sequence}) and nobody owns the work")

    def verdict(self) -> None:
        wf, row = self.sim.wf, self.sim.ledger.row
        if wf.stage == RunStage.WEDGED:
            return  # already reported as a livelock or workflow error
        self.record_names_the_fence()
        if row.state in TERMINAL_STATES or wf.fence.finished:
            if wf.stage != RunStage.DONE:
                self.sim.violate(Invariant.NO_CONVERGENCE,
                                 f"row {row.state}, workflow stuck waiting for {wf.main_wait} (read tasks "
                                 f"{wf.program.reads_running}, close updates "
                                 f"{wf.handlers[Signal.CLOSE]}, resume updates "
                                 f"{wf.handlers[Signal.RESUME]})")
            return
        if wf.fence.s.close_requested or wf.handlers[Signal.CLOSE]:
            # A close the run took (or an update still waiting) must finish the chain by the quiet end,
            # whatever the content: a close stuck behind a wait leaves an ACTIVE, converged row.
            self.sim.violate(Invariant.NO_CONVERGENCE,
                             f"close requested, row {row.state}, workflow {wf.stage.value} "
                             f"waiting for {wf.main_wait}")
            return
        if not self.converged():
            self.sim.violate(Invariant.NO_CONVERGENCE,
                             f"row {row.state} digest {str(row.last_accepted_digest)[:16]} vs oracle "
                             f"v{self.sim.oracle.version} {str(self.sim.oracle.digest)[:16]}; "
                                 f"workflow {wf.stage.value} "
                             f"waiting for {wf.main_wait} "
                             f"state {wf.fence.s.state} in_flight {wf.fence.s.in_flight}")
            return
        if wf.fence.s.state != row.state:
            self.sim.violate(Invariant.NO_CONVERGENCE,
                             f"workflow believes {wf.fence.s.state}, ledger says {row.state}")
            return
        if wf.handlers[Signal.FIRST_READ]:
            # Converged means a read was judged (or none will come): the update must have answered.
            self.sim.violate(Invariant.NO_CONVERGENCE,
                             f"first_read update still waiting in {wf.fence.s.state}")
