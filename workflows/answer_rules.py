"""The answer freshness gate rules: HOLD or ACCEPT an answer against the observations it used.

Contract (the rules in full: docs/answer-gate.md):
- A host *binds* an answer draft to the receipts it was built from, records which receipt its next
  answering step actually *selected* per dependency (until it does, the bound receipt counts), and
  asks for a *disposition*.
- ``judge_answer`` is the gate: pure deterministic Python over an ``ObservationSnapshot`` the ledger
  took (no I/O, no clock: the snapshot carries the database time; no temporalio import). It works on
  receipt ids, digests, states and timestamps only; no resource body is ever involved.
- UPDATE_SEEN is the level rule (``coverage.dirty`` on the fence row), which the observation computes
  with ``activities/ledger/proven.py`` and carries as ``DependencyObservation.dirty``; an observation
  recorded by a build before that field (None) is judged by the timestamp rule ``_update_after``,
  as that build judged it (docs/decisions/0006-answer-gate-level-rule.md).
- HOLD, with one named ``GateReason`` per condition, when any dependency is not provably current.
  ACCEPT only when every selected receipt *is* its dependency's latest accepted receipt, or carries
  the same digest with nothing but UNCHANGED reads since, and no newer update was seen; it is
  stamped with its evidence window and claims nothing beyond it (a later update ``reopened``s it).
- Each dependency is judged from its own subscription only: a list_changed or an update of an
  unrelated URI never reopens an answer; what a catalog establishes (tombstoned, revoked) does.
- ``AnswerTracker`` holds ``AnswerWorkflow``'s whole state (``AnswerState``) and builds the gate's
  inputs and the record; the ledger activities, the worker and the tests use the rest directly.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import CLOSING_STATES, SubscriptionState

__all__ = ["AnswerDependency", "BindRequest", "SelectInputRequest", "FreshnessPolicy", "CheckRequest",
           "InputSelection", "Verdict", "GateReason", "Disposition", "AnswerBindingV1", "ReceiptObservation",
           "ReadObservation", "DependencyObservation", "ObservationSnapshot", "LatestReceipt",
           "AnswerKeyRequest", "BindLedgerRequest", "BoundAnswer", "SelectLedgerRequest", "ObserveRequest",
           "RecordDispositionRequest", "LoadedAnswer", "judge_answer", "AnswerState", "AnswerTracker",
           "AnswerStart", "iso_ms"]


# --- what the host says ----------------------------------------------------------------------


class AnswerDependency(FrozenRecord):
    """One observation an answer depends on: a receipt of (subject, server, exact URI)."""

    subject: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=200)
    uri: str = Field(min_length=1, max_length=16384)
    receipt_id: int = Field(ge=1)


class BindRequest(FrozenRecord):
    """Update ``bind``: the draft's question and the observations it used. Rebinding makes a new revision."""

    answer_id: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=4000)
    dependencies: list[AnswerDependency] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _unique_uris(self) -> BindRequest:
        uris = [d.uri for d in self.dependencies]
        if len(set(uris)) != len(uris):
            raise ValueError("each dependency URI may appear once per answer (select_input names it by URI)")
        return self


class SelectInputRequest(FrozenRecord):
    """Update ``select_input``: the observation the host's next answering step actually uses for ``uri``."""

    answer_id: str = Field(min_length=1, max_length=200)
    uri: str = Field(min_length=1, max_length=16384)
    receipt_id: int = Field(ge=1)


class FreshnessPolicy(FrozenRecord):
    """How to treat a dependency whose server sends no per-URI updates (polling, subscribe refused).

    ``None``: such a dependency always HOLDs (UNWATCHED): silence is not a check. A number: its
    latest accepted observation may be at most this old at check time (else OBSERVATION_TOO_OLD)."""

    max_unwatched_age_seconds: float | None = Field(default=None, gt=0)


class CheckRequest(FrozenRecord):
    answer_id: str = Field(min_length=1, max_length=200)
    policy: FreshnessPolicy = FreshnessPolicy()


class InputSelection(FrozenRecord):
    """Which receipt the next answering step uses for one dependency, and who said so."""

    uri: str
    receipt_id: int
    source: Literal["bound", "host"]  # bound: the draft's own observation; host: select_input
    selected_at: datetime


# --- what the gate says ----------------------------------------------------------------------


class Verdict(StrEnum):
    HOLD = "HOLD"
    ACCEPT = "ACCEPT"


class GateReason(StrEnum):
    """Named conditions. Every value but INPUTS_CURRENT holds the answer."""

    REVOKED = "REVOKED"  # the subject lost access: content purged, not usable
    TOMBSTONED = "TOMBSTONED"  # deletion confirmed by a reconciled catalog
    TOMBSTONE_PENDING = "TOMBSTONE_PENDING"  # the server said not-found, unconfirmed: basis unresolved
    REPLACED = "REPLACED"  # deleted and listed again: the recreated resource is not read yet
    SUBSCRIPTION_CLOSED = "SUBSCRIPTION_CLOSED"  # no longer watched (closing, closed, unsubscribe unknown)
    RECONCILIATION_REQUIRED = "RECONCILIATION_REQUIRED"  # identity conflict: the subscription accepts nothing
    UNKNOWN_DEPENDENCY = "UNKNOWN_DEPENDENCY"  # no subscription for (subject, server, uri)
    INPUT_IDENTITY_MISMATCH = "INPUT_IDENTITY_MISMATCH"  # the selected receipt is not one of this dependency
    READ_DENIED = "READ_DENIED"  # the latest read was denied
    READ_FAILED = "READ_FAILED"  # the latest read failed: unresolved, not an empty resource
    GUARDRAIL_REJECTED = "GUARDRAIL_REJECTED"  # the newest read is not releasable; the older is not current
    READ_PENDING = "READ_PENDING"  # a read is in flight
    UPDATE_SEEN = "UPDATE_SEEN"  # a recorded update no read observing the resource covers yet (level rule)
    CONTINUITY_UNCERTAIN = "CONTINUITY_UNCERTAIN"  # no live session / resubscribing / not re-read since
    UNWATCHED = "UNWATCHED"  # no per-URI updates and no freshness policy admits it
    OBSERVATION_TOO_OLD = "OBSERVATION_TOO_OLD"  # unwatched, and older than the policy allows
    NO_ACCEPTED_VERSION = "NO_ACCEPTED_VERSION"  # nothing was ever accepted for it
    SELECTED_NOT_LATEST = "SELECTED_NOT_LATEST"  # new read done, old copy still selected
    INPUT_NOT_RELEASABLE = "INPUT_NOT_RELEASABLE"  # the selected receipt is not an accepted version
    INPUTS_CURRENT = "INPUTS_CURRENT"  # ACCEPT


REASON_PRECEDENCE: tuple[GateReason, ...] = tuple(GateReason)
"""The disposition's ``reason_code`` is the first of its conditions in this order."""


class DependencyDisposition(FrozenRecord):
    """The gate's word on one dependency; ``conditions`` empty means it is current."""

    subject: str
    server: str
    uri: str
    conditions: list[GateReason] = Field(default_factory=list)
    explanations: list[str] = Field(default_factory=list)  # one sentence per condition, same order
    bound_receipt_id: int
    selected_receipt_id: int
    latest_receipt_id: int | None = None  # latest ACCEPTED/UNCHANGED receipt
    selected_digest: str | None = None
    latest_digest: str | None = None
    equal_by: Literal["receipt", "unchanged_digest"] | None = None  # how selected == latest was established
    equality_reasoning: str = ""
    observed_at: datetime | None = None  # when the latest accepted observation was committed
    last_update_at: datetime | None = None  # latest update naming the URI (ledger time)
    update_after_bound: bool = False  # an update arrived after the bound observation (maybe resolved since)

    @property
    def current(self) -> bool:
        return not self.conditions


class Disposition(FrozenRecord):
    """``answerDisposition.v1``: one check of one answer revision."""

    record: Literal["answerDisposition.v1"] = "answerDisposition.v1"
    answer_id: str
    revision: int
    sequence: int  # check number of this answer (all revisions)
    verdict: Verdict
    reason_code: GateReason
    reason: str
    dependencies: list[DependencyDisposition]
    receipt_ids: list[int] = Field(default_factory=list)  # ACCEPT: the selected receipts, dependency order
    evidence_from: datetime | None = None  # ACCEPT: every dependency confirmed current from here ...
    evidence_to: datetime | None = None  # ... to here (the check), no relevant update seen in between
    checked_at: datetime
    reopened: bool = False  # HOLD right after an ACCEPT of the same revision


class AnswerBindingV1(FrozenRecord):
    """``answerBinding.v1``: an answer, its bound observations, the host's selections, the latest word."""

    record: Literal["answerBinding.v1"] = "answerBinding.v1"
    answer_id: str
    question: str
    revision: int
    bound_at: datetime | None
    dependencies: list[AnswerDependency]
    selections: list[InputSelection]
    checks: int = 0
    disposition: Disposition | None = None
    last_accept: Disposition | None = None


# --- what the ledger observed (ObservationSnapshot) -------------------------------------------


class ReceiptObservation(FrozenRecord):
    """One ``resource_versions`` receipt, by id and digest only."""

    receipt_id: int
    subject: str
    server: str
    uri: str
    status: AcceptVerdict
    content_digest: str | None
    read_ordinal: int
    session_generation: int
    subscription_generation: int
    read_issued_at: datetime | None  # when the read behind it was allocated (before dispatch)
    accepted_at: datetime


class ReadObservation(FrozenRecord):
    """The latest completed ``read_requests`` row: its outcome is a verdict or a failed read's kind."""

    ordinal: int
    outcome: str | None
    issued_at: datetime
    completed_at: datetime | None
    error_code: int | None = None


class DependencyObservation(FrozenRecord):
    """Everything the gate needs about one dependency, read in one database snapshot."""

    subject: str
    server: str
    uri: str
    subscribed: bool  # a subscription (fence row) exists
    state: SubscriptionState | None = None
    session_generation: int = 0
    subscription_generation: int = 0
    live_session_generation: int | None = None  # None: no open session for (subject, server)
    updates_watched: bool = True  # per-URI updates can arrive (subscribe usable on this session)
    bound: ReceiptObservation | None = None
    selected: ReceiptObservation | None = None
    latest_accepted: ReceiptObservation | None = None
    newest_receipt: ReceiptObservation | None = None  # newest non-STALE receipt of any status
    # receipts after the selected one up to the latest accepted, not UNCHANGED
    changes_since_selected: int = 0
    notifications_seen: int = 0
    last_notification_at: datetime | None = None
    last_notification_generation: int | None = None
    reads_pending: int = 0
    latest_read: ReadObservation | None = None
    # The level rule on the fence row (``activities/ledger/proven.py``: ``coverage.dirty``): a recorded update
    # no read observing the resource covers yet. None: observed by a build before it (the gate then
    # judges UPDATE_SEEN by timestamps, as that build did).
    dirty: bool | None = None


class ObservationSnapshot(FrozenRecord):
    checked_at: datetime  # database time of the snapshot
    dependencies: list[DependencyObservation]


class LatestReceipt(FrozenRecord):
    """What a host should select for one URI: its latest accepted receipt (ledger read, no workflow)."""

    subject: str
    server: str
    uri: str
    state: SubscriptionState | None  # None: no subscription
    receipt: ReceiptObservation | None  # None: nothing accepted yet


# --- activity contracts -----------------------------------------------------------------------


class AnswerKeyRequest(FrozenRecord):
    answer_id: str


class BindLedgerRequest(FrozenRecord):
    request_id: str  # idempotency key (workflow uuid4)
    workflow_id: str
    bind: BindRequest


class BoundAnswer(FrozenRecord):
    revision: int
    bound_at: datetime
    selections: list[InputSelection]


class SelectLedgerRequest(FrozenRecord):
    request_id: str
    answer_id: str
    revision: int
    dependency: AnswerDependency  # receipt_id: the selected receipt


class ObserveRequest(FrozenRecord):
    dependencies: list[AnswerDependency]  # receipt_id: the bound receipt
    selections: dict[str, int]  # uri -> selected receipt id


class RecordDispositionRequest(FrozenRecord):
    request_id: str
    disposition: Disposition


class LoadedAnswer(FrozenRecord):
    """An answer as PostgreSQL holds it: the latest binding revision, its selections, the latest word."""

    answer_id: str
    question: str
    revision: int
    bound_at: datetime
    dependencies: list[AnswerDependency]
    selections: list[InputSelection]
    checks: int
    disposition: Disposition | None = None
    last_accept: Disposition | None = None


# --- the gate (pure) --------------------------------------------------------------------------

S = SubscriptionState
V = AcceptVerdict
_ACCEPTED = frozenset({V.ACCEPTED, V.UNCHANGED})
_ESTABLISHING = frozenset({S.DISCOVERED, S.SUBSCRIBING})
# read_requests.outcome holds the verdict when a receipt was written, else the read's kind.
_FINE_OUTCOMES = frozenset({"ACCEPTED", "UNCHANGED", "STALE", "STALE_AFTER_CLOSE"})
_RECEIPT_OUTCOMES = frozenset({"TOMBSTONE_PENDING", "TOMBSTONED", "GUARDRAIL_REJECTED"})  # judged by receipt
_DENIED_OUTCOMES = frozenset({"denied", "REVOKED"})


def _short(digest: str | None) -> str:
    return "-" if digest is None else digest[:19]


def iso_ms(at: datetime | None) -> str:
    """A time as the gate's texts and the workflow's details panel print it."""
    return "-" if at is None else at.isoformat(timespec="milliseconds")


def judge_dependency(dep: AnswerDependency, selected_receipt_id: int, obs: DependencyObservation,
                     policy: FreshnessPolicy, checked_at: datetime) -> DependencyDisposition:
    """Every condition that holds this dependency (empty: its selected input is current)."""
    found: dict[GateReason, str] = {}
    hold = found.setdefault  # the first text of a condition stands
    latest, sel, newest, bound = obs.latest_accepted, obs.selected, obs.newest_receipt, obs.bound
    state = obs.state
    if not obs.subscribed:
        hold(GateReason.UNKNOWN_DEPENDENCY,
             "no subscription watches this subject, server and URI: nothing establishes its freshness")
    elif state == S.REVOKED:
        hold(GateReason.REVOKED,
             "access was revoked for this subject: the content is purged and may not be used")
    elif state == S.TOMBSTONED:
        hold(GateReason.TOMBSTONED, "the resource was deleted (confirmed by a reconciled catalog): "
                                    "resolve the missing dependency")
    elif state == S.TOMBSTONE_PENDING:
        hold(GateReason.TOMBSTONE_PENDING, "the server answered not-found and no catalog has confirmed the "
                                           "deletion: the basis is unresolved, not an empty resource")
    elif state in CLOSING_STATES:
        hold(GateReason.SUBSCRIPTION_CLOSED,
             f"the subscription is {state.value}: updates are no longer watched and silence proves nothing")
    elif state == S.RECONCILIATION_REQUIRED:
        hold(GateReason.RECONCILIATION_REQUIRED, "an identity conflict stopped the subscription: nothing it "
                                                 "observes is accepted until it is resolved")
    elif state in _ESTABLISHING:
        hold(GateReason.CONTINUITY_UNCERTAIN,
             f"the subscription is {state.value}: it is being (re)established")

    if sel is None or (sel.subject, sel.server, sel.uri) != (dep.subject, dep.server, dep.uri):
        hold(GateReason.INPUT_IDENTITY_MISMATCH,
             f"the selected receipt {selected_receipt_id} is not a receipt of this dependency")
        sel = None

    if obs.subscribed and state == S.ACTIVE:
        lr = obs.latest_read
        if lr is not None and lr.completed_at is not None \
                and (latest is None or lr.ordinal > latest.read_ordinal):
            code = f", error {lr.error_code}" if lr.error_code is not None else ""
            if lr.outcome in _DENIED_OUTCOMES:
                hold(GateReason.READ_DENIED, f"the latest read (ordinal {lr.ordinal}) was denied{code}: "
                                             "the basis is unresolved, not an empty resource")
            elif lr.outcome not in _FINE_OUTCOMES and lr.outcome not in _RECEIPT_OUTCOMES:
                hold(GateReason.READ_FAILED, f"the latest read (ordinal {lr.ordinal}) failed "
                                             f"({lr.outcome or 'no outcome'}{code}): the current basis is "
                                             "unresolved, not an empty resource, and the older observation "
                                             "is not made current by it")
        if newest is not None and (latest is None or newest.read_ordinal > latest.read_ordinal):
            if newest.status == V.GUARDRAIL_REJECTED:
                hold(GateReason.GUARDRAIL_REJECTED,
                     f"the newest read (receipt {newest.receipt_id}) was rejected by the guardrails: the "
                     "server's current content may not be released and the older version is not current")
            elif newest.status in (V.TOMBSTONE_PENDING, V.TOMBSTONED):
                hold(GateReason.REPLACED, "the resource was missing and is listed again: the recreated "
                                          "resource has not been read yet")
        if obs.reads_pending:
            hold(GateReason.READ_PENDING, f"{obs.reads_pending} read(s) in flight: wait for the outcome")
        if latest is not None and obs.dirty:
            hold(GateReason.UPDATE_SEEN,
                 f"an update naming this URI (the newest seen at {iso_ms(obs.last_notification_at)}) is not "
                 "covered by any read that observed the resource since: it must be re-read before relying "
                 "on it")
        elif latest is not None and obs.dirty is None and _update_after(obs, latest):
            hold(GateReason.UPDATE_SEEN,
                 f"an update naming this URI was seen at {iso_ms(obs.last_notification_at)}, after the "
                 f"latest accepted observation (receipt {latest.receipt_id}, read issued "
                 f"{iso_ms(latest.read_issued_at or latest.accepted_at)}): it must be re-read before "
                 "relying on it")
        if obs.live_session_generation is None:
            hold(GateReason.CONTINUITY_UNCERTAIN, "no open MCP session for this subject and server: updates "
                                                  "cannot arrive, silence proves nothing")
        elif obs.live_session_generation != obs.session_generation:
            hold(GateReason.CONTINUITY_UNCERTAIN,
                 f"the session changed (generation {obs.session_generation} → {obs.live_session_generation}) "
                 "and the subscription has not been re-established on it")
        elif latest is not None and (latest.session_generation, latest.subscription_generation) != (
                obs.session_generation, obs.subscription_generation):
            hold(GateReason.CONTINUITY_UNCERTAIN, "the subscription was re-established and has not confirmed "
                 "the content since: updates in between may have been missed")
        if not obs.updates_watched:
            limit = policy.max_unwatched_age_seconds
            if limit is None:
                hold(GateReason.UNWATCHED, "this server sends no per-URI updates for it (polling): silence "
                     "is not a check; pass a freshness policy to accept recent reads")
            elif latest is not None and (checked_at - latest.accepted_at).total_seconds() > limit:
                age = (checked_at - latest.accepted_at).total_seconds()
                hold(GateReason.OBSERVATION_TOO_OLD, f"unwatched, and the latest accepted observation is "
                                                     f"{age:.1f} s old (policy: {limit:g} s)")

    equal_by: Literal["receipt", "unchanged_digest"] | None = None
    reasoning = ""
    if latest is None:
        if obs.subscribed:
            hold(GateReason.NO_ACCEPTED_VERSION, "no version of this dependency was ever accepted")
    elif sel is not None:
        if sel.receipt_id == latest.receipt_id:
            equal_by = "receipt"
            reasoning = f"the selected receipt {sel.receipt_id} is the latest accepted receipt"
        elif sel.status not in _ACCEPTED and sel.status != V.STALE:
            hold(GateReason.INPUT_NOT_RELEASABLE,
                 f"the selected receipt {sel.receipt_id} is {sel.status.value}, not an accepted version")
        elif (sel.content_digest is not None and sel.content_digest == latest.content_digest
              and sel.status in _ACCEPTED and sel.read_ordinal <= latest.read_ordinal
              and obs.changes_since_selected == 0):
            equal_by = "unchanged_digest"
            reasoning = (f"the selected receipt {sel.receipt_id} and the latest accepted receipt "
                         f"{latest.receipt_id} carry the same digest {_short(latest.content_digest)} and "
                         "every read since the selected one was UNCHANGED: the newer observation still "
                         "supports the selected input")
        else:
            hold(GateReason.SELECTED_NOT_LATEST,
                 f"the host's selected input is receipt {sel.receipt_id} ({_short(sel.content_digest)}) but "
                 f"the latest accepted receipt is {latest.receipt_id} ({_short(latest.content_digest)}): a "
                 "newer read is done and the old copy is still selected")

    conditions = [c for c in REASON_PRECEDENCE if c in found]
    update_after_bound = bool(
        bound is not None and obs.last_notification_at is not None
        and obs.last_notification_at >= (bound.read_issued_at or bound.accepted_at))
    if update_after_bound and not conditions and latest is not None and bound is not None \
            and latest.receipt_id != bound.receipt_id:
        reasoning += (f"; the update after the bound observation (receipt {bound.receipt_id}) was resolved "
                      f"by the read behind receipt {latest.receipt_id}")
    return DependencyDisposition(
        subject=dep.subject, server=dep.server, uri=dep.uri,
        conditions=conditions, explanations=[found[c] for c in conditions],
        bound_receipt_id=dep.receipt_id, selected_receipt_id=selected_receipt_id,
        latest_receipt_id=latest.receipt_id if latest else None,
        selected_digest=obs.selected.content_digest if obs.selected else None,
        latest_digest=latest.content_digest if latest else None,
        equal_by=equal_by if not conditions else None,
        equality_reasoning=reasoning if not conditions else "",
        observed_at=latest.accepted_at if latest else None,
        last_update_at=obs.last_notification_at, update_after_bound=update_after_bound)


def _update_after(obs: DependencyObservation, latest: ReceiptObservation) -> bool:
    """An update naming the URI arrived at or after the read behind ``latest`` was issued: the rule
    for an observation that carries no level-rule bit (``dirty`` None: recorded by a build before it).

    A notification from an older session generation than the one ``latest`` was read on
    predates that session's subscribe and its initial read: it proves nothing newer."""
    at = obs.last_notification_at
    if at is None:
        return False
    if obs.last_notification_generation is not None \
            and obs.last_notification_generation < latest.session_generation:
        return False
    return at >= (latest.read_issued_at or latest.accepted_at)


def judge_answer(*, answer_id: str, revision: int, sequence: int, dependencies: list[AnswerDependency],
                 selections: dict[str, int], snapshot: ObservationSnapshot, policy: FreshnessPolicy,
                 previous: Disposition | None = None) -> Disposition:
    """The disposition of one answer revision from one observation snapshot (deterministic)."""
    by_uri = {o.uri: o for o in snapshot.dependencies}
    judged: list[DependencyDisposition] = []
    for dep in dependencies:
        selected = selections.get(dep.uri, dep.receipt_id)
        obs = by_uri.get(dep.uri)
        if obs is None or (obs.subject, obs.server) != (dep.subject, dep.server):
            obs = DependencyObservation(subject=dep.subject, server=dep.server, uri=dep.uri, subscribed=False)
        judged.append(judge_dependency(dep, selected, obs, policy, snapshot.checked_at))
    holding = [(c, d, e) for d in judged for c, e in zip(d.conditions, d.explanations, strict=True)]
    if not holding:
        window_from = max(d.observed_at for d in judged if d.observed_at is not None)
        unchanged = [d for d in judged if d.equal_by == "unchanged_digest"]
        reason = ("every selected input is its dependency's latest accepted receipt and no newer update "
                  "was seen")
        if unchanged:
            reason += "; " + "; ".join(f"{d.uri}: {d.equality_reasoning}" for d in unchanged)
        return Disposition(
            answer_id=answer_id, revision=revision, sequence=sequence, verdict=Verdict.ACCEPT,
            reason_code=GateReason.INPUTS_CURRENT, reason=reason, dependencies=judged,
            receipt_ids=[d.selected_receipt_id for d in judged], evidence_from=window_from,
            evidence_to=snapshot.checked_at, checked_at=snapshot.checked_at)
    holding.sort(key=lambda h: REASON_PRECEDENCE.index(h[0]))
    code, first, text = holding[0]
    reopened = previous is not None and previous.verdict == Verdict.ACCEPT and previous.revision == revision
    more = f" (+{len(holding) - 1} more condition(s))" if len(holding) > 1 else ""
    reason = f"{'reopened: ' if reopened else ''}{code.value} for {first.uri}: {text}{more}"
    return Disposition(
        answer_id=answer_id, revision=revision, sequence=sequence, verdict=Verdict.HOLD, reason_code=code,
        reason=reason, dependencies=judged, checked_at=snapshot.checked_at, reopened=reopened)


# --- workflow state (pure) ------------------------------------------------------------------------


class AnswerState(BaseModel):
    """Everything AnswerWorkflow knows; carried whole through continue-as-new."""

    answer_id: str
    question: str = ""
    revision: int = 0
    bound_at: datetime | None = None
    dependencies: list[AnswerDependency] = Field(default_factory=list)
    selections: dict[str, InputSelection] = Field(default_factory=dict)  # uri -> selection
    checks: int = 0
    disposition: Disposition | None = None
    last_accept: Disposition | None = None


class AnswerTracker:
    """Applies ledger answers to ``AnswerState`` and builds the gate's inputs and the record."""

    def __init__(self, state: AnswerState) -> None:
        self.s = state

    @property
    def bound(self) -> bool:
        return self.s.revision > 0

    def adopt(self, loaded: LoadedAnswer) -> None:
        s = self.s
        if loaded.revision < s.revision:
            return
        s.question, s.revision, s.bound_at = loaded.question, loaded.revision, loaded.bound_at
        s.dependencies = list(loaded.dependencies)
        s.selections = {sel.uri: sel for sel in loaded.selections}
        s.checks = max(s.checks, loaded.checks)
        s.disposition, s.last_accept = loaded.disposition, loaded.last_accept

    def dependency(self, uri: str) -> AnswerDependency | None:
        return next((d for d in self.s.dependencies if d.uri == uri), None)

    def rebound(self, req: BindRequest, result: BoundAnswer) -> None:
        s = self.s
        s.question, s.revision, s.bound_at = req.question, result.revision, result.bound_at
        s.dependencies = list(req.dependencies)
        s.selections = {sel.uri: sel for sel in result.selections}

    def selected(self, selection: InputSelection) -> None:
        self.s.selections[selection.uri] = selection

    def observe_request(self) -> ObserveRequest:
        return ObserveRequest(dependencies=self.s.dependencies, selections=self._selection_ids())

    def _selection_ids(self) -> dict[str, int]:
        return {d.uri: self.s.selections.get(d.uri, d).receipt_id for d in self.s.dependencies}

    def judge(self, snapshot: ObservationSnapshot, policy: FreshnessPolicy) -> Disposition:
        s = self.s
        return judge_answer(answer_id=s.answer_id, revision=s.revision, sequence=s.checks + 1,
                            dependencies=s.dependencies, selections=self._selection_ids(), snapshot=snapshot,
                            policy=policy, previous=s.disposition)

    def judged(self, disposition: Disposition, stored_sequence: int) -> Disposition:
        if stored_sequence != disposition.sequence:
            disposition = disposition.model_copy(update={"sequence": stored_sequence})
        self.s.checks = max(self.s.checks, stored_sequence)
        self.s.disposition = disposition
        if disposition.verdict == Verdict.ACCEPT:
            self.s.last_accept = disposition
        return disposition

    def record(self) -> AnswerBindingV1:
        s = self.s
        return AnswerBindingV1(
            answer_id=s.answer_id, question=s.question, revision=s.revision, bound_at=s.bound_at,
            dependencies=s.dependencies,
            selections=[s.selections[d.uri] for d in s.dependencies if d.uri in s.selections],
            checks=s.checks, disposition=s.disposition, last_accept=s.last_accept)


# --- workflow input ---------------------------------------------------------------------------------


class AnswerStart(FrozenRecord):
    """Workflow input. ``carried_state`` (a dumped ``AnswerState``) is set only by continue-as-new."""

    answer_id: str = Field(min_length=1, max_length=200)
    idle_seconds: float = Field(default=86_400.0, gt=0)  # finish after this long without an update
    carried_state: dict[str, Any] | None = None
