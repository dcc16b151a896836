"""The ledger's fence: subscription rows, issued reads, version receipts; the sole acceptance point.

Contract:
- The fence row in ``subscriptions`` is the durable copy of each workflow's ordinals,
  generations and close epoch. Every allocation and every acceptance is a compare-and-set
  against it, so a workflow whose history was reset or rolled back can ask, but never move
  the fence backwards. Generations and ordinals only grow: ``GREATEST(ledger+1, asked)``.
- Every write locks the row (``FOR UPDATE``) and asks a pure rule what to write: the simple
  transitions are ``mcpsync.workflows.ledger_flow``'s, allocation ``mcpsync.workflows.allocation``'s
  and ``coverage``'s; accept / close / tombstone / revoke ask ``mcpsync.workflows.ledger_rules``
  and the planner ``mcpsync.workflows.write_plan``, and ``_apply`` that plan in the same transaction: receipt,
  outbox row (``mcpsync.activities.ledger.journal``), fence update, audit row, ``read_requests``
  completion, revocation (with the purge of ``mcpsync.activities.ledger.content``). ``_apply`` is
  ``_apply_all`` of one plan: the writes every plan makes (``read_requests`` completion, receipt,
  fence update, the accepted body) go out as one set-based statement for all the plans of a
  transaction (``mcpsync.activities.ledger.plan_writes``), the rest per plan after it. The
  simulator's in-memory ledger applies the same rules and plans.
- ``accept`` is the only code that makes a version current; a retried accept answers the
  verdict already committed and writes nothing twice.
- The read path's two calls, ``allocate_read`` and ``accept_judged``, are group-committed: the
  calls of one process that arrive while a batch of their kind is in flight run as the next batch,
  one transaction (``mcpsync.activities.ledger.coalescer``; the batch itself, with the same rules per
  request, is ``mcpsync.activities.ledger.read_batches``). A batch locks its rows in one statement, in
  ``workflow_id`` order, holds no two calls of one subscription, and a batch that fails runs each of
  its calls again alone: each caller gets what it would have got alone. An accept batch's plans are
  written by one ``_apply_all``: a batch of unchanged verifications is four statements (BEGIN,
  lock, write, COMMIT) however many reads, and resends no stored body.
- Rows are found by key (``store.fence_row``), never by ``key.workflow_id``: the row
  records, when it is created, the id of the workflow that created it (the ENSURE activity passes
  ``activity.info().workflow_id``, local activities included) and never changes it; a second
  workflow for one key is audited ``WORKFLOW_ID_MISMATCH``. Reads, receipts, outbox, audit and
  revocation rows carry that recorded id, and ``workflow_id_of`` / ``note_notification`` hand
  it to everything that routes to the workflow.
- Activities (names in ``mcpsync.workflows.names.Act``, listed by ``activities()``) are these methods
  themselves, each taking one request model of ``mcpsync.workflows.records``. ``allocate_read`` and
  ``accept`` take one too but are no activities: the read cycle calls them in-process (its activity
  reports the verdict through ``Meters``).
- It shares the ledger's one ``Journal``, ``ContentLedger`` and ``SessionLedger`` (passed in by ``Ledger``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any, NamedTuple

from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict
from temporalio import activity

from mcpsync.activities.ledger.coalescer import Coalescer
from mcpsync.activities.ledger.content import ContentLedger, ReadBody
from mcpsync.activities.ledger.journal import Journal
from mcpsync.activities.ledger.plan_writes import Planned, write_plans
from mcpsync.activities.ledger.read_batches import Accept, accept_batch, allocate_batch
from mcpsync.activities.ledger.sessions import SessionLedger, session_in
from mcpsync.activities.ledger.store import (
    BY_KEY,
    LedgerStore,
    fence_row,
    looked_note,
    recorded_workflow_id,
    snapshot,
    update_row,
)
from mcpsync.activities.ledger.verification import mark_chain
from mcpsync.workflows.coverage import plan_note
from mcpsync.workflows.ledger_flow import (
    begin_writes,
    begins_at_start,
    ensure_writes,
    finish_unsubscribe_writes,
    mark_active_writes,
    set_state_writes,
)
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AllocateRequest,
    BeginSubscriptionRequest,
    EnsureRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    KeyRequest,
    MarkActiveRequest,
    NotedNotification,
    OutboxEventType,
    ReadTicket,
    SessionQuery,
    SetStateRequest,
    StartSubscriptionRequest,
    SubscriptionStarted,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome
from mcpsync.workflows.records.subscription import (
    TERMINAL_STATES,
    CloseReceipt,
    RevokeLedgerRequest,
    SubscriptionKey,
    SubscriptionState,
    TombstoneRequest,
)
from mcpsync.workflows.uris import normalize_uri
from mcpsync.workflows.write_plan import (
    RevokeSource,
    WritePlan,
    close_receipt,
    plan_close,
    plan_revoke,
    plan_tombstone,
)

__all__ = ["NORMALIZED_SIBLINGS_SQL", "FenceLedger", "SubjectRevocation"]

S = SubscriptionState
# ``records.TERMINAL_STATES`` as SQL parameters (sorted: one statement text, one plan).
TERMINAL_STATE_VALUES = sorted(state.value for state in TERMINAL_STATES)
# The other live subscriptions of (subject, server) whose URI normalizes alike. It names the
# expression of index subscriptions_identity (migration 012) and no bare subject/server column, so
# no planner, with or without statistics, reads it through the (subject, server, uri) key.
NORMALIZED_SIBLINGS_SQL = """
SELECT workflow_id, uri FROM subscriptions
WHERE ARRAY[subject, server, uri_normalized] = ARRAY[%s, %s, %s]::text[] AND uri <> %s
AND NOT (state = ANY(%s))
ORDER BY uri
"""


class SubjectRevocation(BaseModel):
    """What one ``revoke_subject`` committed (``subject_revocations``, migration 014)."""

    model_config = ConfigDict(frozen=True)

    subject_revocation_id: int
    subject: str
    server: str
    uri: str | None  # None: every URI of the subject on the server
    revoked: list[str]  # workflow ids this call moved to REVOKED (their workflows are signalled)
    covered: list[str]  # every subscription it covers, finished ones included
    receipt_ids: list[int]  # every receipt of those subscriptions: none is released again
    purged_bodies: int  # bodies it deleted from the subject's content_store, by either path
    outbox_ids: list[int]  # the ``revoked`` rows it wrote


class Applied(NamedTuple):
    """What ``FenceLedger._apply`` wrote: the receipt and outbox row ids (None: none), and how many
    bodies its revocation deleted from the subject's store."""

    receipt_id: int | None
    outbox_id: int | None
    purged_bodies: int = 0


class FenceLedger:
    def __init__(self, store: LedgerStore, *, journal: Journal, content: ContentLedger,
                 sessions: SessionLedger) -> None:
        self.store = store
        self.journal = journal
        self.content = content
        self.sessions = sessions
        # Group commit of the read path (module contract): one batch per kind in flight, keyed by
        # subscription so one key's two calls never share a transaction.
        self._allocations: Coalescer[AllocateRequest, ReadTicket] = Coalescer(
            lambda reqs: allocate_batch(self, reqs), key=lambda req: req.key, name="allocate")
        self._accepts: Coalescer[Accept, tuple[AcceptResult, str | None]] = Coalescer(
            lambda calls: accept_batch(self, calls), key=lambda call: call[0].outcome.key, name="accept")

    def activities(self) -> list[Callable[..., Any]]:
        """The fence's activities the workflows schedule. ``allocate_read`` and ``accept`` are called
        in-process by the read cycle (``mcp_read_cycle``) and are no activities: no workflow schedules
        them, and no released (0.2.0) history holds one (tests/histories/0.2.0)."""
        return [self.ensure_subscription, self.start_subscription, self.load_fence, self.begin_subscription,
                self.mark_active, self.begin_unsubscribe, self.finish_unsubscribe, self.set_state,
                self.confirm_tombstone, self.revoke]

    # --- rows ----------------------------------------------------------------------------------

    @activity.defn(name=Act.ENSURE)
    async def ensure_subscription(self, req: EnsureRequest) -> FenceSnapshot:
        """``ensure_row`` for the calling workflow: the row records the id that workflow really runs
        under (whatever scheme or starter chose it), so every router finds it without recomputing it
        from the key. ``activity.info()`` names the workflow for a local activity too; called
        outside an activity (or by a standalone one), the key's computed id stands in."""
        return await self.ensure_row(req.key, req.incarnation, workflow_id=_asking_workflow_id(req.key))

    @activity.defn(name=Act.START_SUBSCRIPTION)
    async def start_subscription(self, req: StartSubscriptionRequest) -> SubscriptionStarted:
        """A new run's first three ledger calls in one transaction, each written as its own activity
        writes it: ``ensure_subscription``, ``current_session`` and, when ``req.begin`` and the row
        ``begins_at_start``, ``begin_subscription`` on that session's generation."""
        key = req.ensure.key
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            fence = await self._ensure_row(cur, key, req.ensure.incarnation,
                                           workflow_id=_asking_workflow_id(key))
            session = await session_in(cur, SessionQuery(subject=key.subject, server=key.server))
            if not (req.begin and session is not None and begins_at_start(fence)):
                return SubscriptionStarted(fence=fence, session=session)
            begin = BeginSubscriptionRequest(key=key, session_generation=session.generation)
            begun = await self._transition_in(cur, key, lambda row: begin_writes(row, begin))
        return SubscriptionStarted(fence=fence, session=session, begun=begun)

    async def ensure_row(self, key: SubscriptionKey, incarnation: str, *, workflow_id: str) -> FenceSnapshot:
        """Create the fence row in DISCOVERED if absent, then apply ``ledger_flow.ensure_writes`` (the
        reopen of a finished row for a new incarnation) to it; return it as stored.

        ``workflow_id`` is the id of the workflow asking. The row records it when it is created and
        never changes it: a row that already names another id keeps it (audited as
        ``WORKFLOW_ID_MISMATCH``: a second workflow for one key, started by something that did not
        ask ``workflow_id_of``).
        """
        async with self.store.pool.connection() as conn, conn.transaction():
            return await self._ensure_row(conn.cursor(row_factory=dict_row), key, incarnation,
                                          workflow_id=workflow_id)

    async def _ensure_row(self, cur: Any, key: SubscriptionKey, incarnation: str, *,
                          workflow_id: str) -> FenceSnapshot:
        """``ensure_row`` in the caller's transaction."""
        await cur.execute(
            """
            INSERT INTO subscriptions AS s (workflow_id, subject, server, uri, uri_normalized, state,
                incarnation)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (subject, server, uri) DO UPDATE SET uri_normalized = EXCLUDED.uri_normalized
                WHERE s.uri_normalized IS NULL
            """,  # a row from before migration 008 that the backfill has not reached yet
            (workflow_id, key.subject, key.server, key.uri, normalize_uri(key.uri),
             S.DISCOVERED.value, incarnation),
        )
        row = await fence_row(cur, key, lock=True)
        assert row is not None  # inserted, or there already
        writes = ensure_writes(snapshot(row), held=row["incarnation"], incarnation=incarnation)
        if writes:
            # A reopen updates the row; a new incarnation alone does not count as an update.
            row = await update_row(cur, row["workflow_id"], writes, touch="state" in writes)
        if row["workflow_id"] != workflow_id:
            await self.journal.insert_audit(cur, "WORKFLOW_ID_MISMATCH", subject=key.subject,
                                            server=key.server, uri=key.uri,
                                            workflow_id=row["workflow_id"],
                                            detail={"running_as": workflow_id})
        return snapshot(row)

    async def workflow_id_of(self, key: SubscriptionKey) -> str:
        """The id the subscription of ``key`` runs under: the one its row recorded, whatever scheme
        made it; ``key.workflow_id`` (the readable scheme) only for a key with no row yet."""
        async with self.store.pool.connection() as conn:
            return await recorded_workflow_id(conn.cursor(row_factory=dict_row), key)

    @activity.defn(name=Act.LOAD_FENCE)
    async def load_fence(self, req: KeyRequest) -> FenceSnapshot:
        async with self.store.pool.connection() as conn:
            return snapshot(await fence_row(conn.cursor(row_factory=dict_row), req.key))

    async def find_subscription(self, subject: str, server: str, uri: str) -> FenceSnapshot | None:
        """The fence row for the exact (subject, server, uri), or None."""
        async with self.store.pool.connection() as conn:
            row = await fence_row(conn.cursor(row_factory=dict_row),
                                  SubscriptionKey(subject=subject, server=server, uri=uri))
        return None if row is None else snapshot(row)

    async def subscriptions_for(self, subject: str, server: str) -> list[tuple[str, str, str]]:
        """(workflow_id, uri, state) of every subscription of one (subject, server)."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT workflow_id, uri, state FROM subscriptions WHERE subject=%s AND server=%s",
                (subject, server),
            )
            return [(r[0], r[1], r[2]) for r in await cur.fetchall()]

    async def normalized_siblings(self, subject: str, server: str, uri: str) -> list[tuple[str, str]]:
        """(workflow_id, uri) of the non-terminal subscriptions of (subject, server) whose URI differs
        from ``uri`` but normalizes alike (``mcpsync.workflows.uris.normalize_uri``): one indexed query.
        Never a route: a caller may only invalidate or flag them."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(NORMALIZED_SIBLINGS_SQL,
                                     (subject, server, normalize_uri(uri), uri, TERMINAL_STATE_VALUES))
            return [(r[0], r[1]) for r in await cur.fetchall()]

    async def note_notification(self, subject: str, server: str, uri: str, generation: int, *,
                                count: bool = True) -> NotedNotification | None:
        """Record that an update naming (subject, server, uri) arrived; None if nobody subscribed to it.
        The answer names the workflow id the row recorded: the ingress signals that, never a computed one.
        ``count`` False (the sweep's synthetic note, no notification): the row as it stands and
        ``plan_note``'s work, one read that writes nothing (``workflows/ingress.py``: the sweep's keys)."""
        async with self.store.pool.connection() as conn, conn.transaction() if count else nullcontext():
            cur = conn.cursor(row_factory=dict_row)
            # By the raw triple: a notification's URI is whatever the server sent (no key validation).
            lock = " FOR UPDATE" if count else ""
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}{lock}", (subject, server, uri))
            before = await cur.fetchone()
            if before is None:
                return None
            if not count:
                return looked_note(before, generation)
            plan = plan_note(snapshot(before), generation=generation)
            await cur.execute(
                """
                UPDATE subscriptions SET notifications_seen = %s, last_notification_at = now(),
                    last_notification_generation = %s
                WHERE workflow_id=%s RETURNING *
                """,
                (plan.notified, generation, before["workflow_id"]),
            )
            row = await cur.fetchone()
            assert row is not None
        return NotedNotification(workflow_id=row["workflow_id"], fence=snapshot(row), work=plan.work)

    # --- state ---------------------------------------------------------------------------------

    @activity.defn(name=Act.BEGIN_SUBSCRIPTION)
    async def begin_subscription(self, req: BeginSubscriptionRequest) -> FenceSnapshot:
        return await self._transition(req.key, lambda row: begin_writes(row, req))

    @activity.defn(name=Act.MARK_ACTIVE)
    async def mark_active(self, req: MarkActiveRequest) -> FenceSnapshot:
        """ACTIVE (``mark_active_writes``); a row it marks keeps or starts its verification chain
        (``mark_chain``)."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            row = await fence_row(cur, req.key, lock=True)
            if row is not None and (columns := mark_active_writes(snapshot(row), req)):
                row = await update_row(cur, row["workflow_id"], columns)
                await mark_chain(cur, row)
            return snapshot(row)

    @activity.defn(name=Act.SET_STATE)
    async def set_state(self, req: SetStateRequest) -> FenceSnapshot:
        return await self._transition(req.key, lambda row: set_state_writes(row, req))

    @activity.defn(name=Act.FINISH_UNSUBSCRIBE)
    async def finish_unsubscribe(self, req: FinishUnsubscribeRequest) -> FenceSnapshot:
        return await self._transition(req.key, lambda row: finish_unsubscribe_writes(row, req))

    async def _transition(self, key: SubscriptionKey,
                          writes: Callable[[FenceSnapshot], dict[str, Any]]) -> FenceSnapshot:
        """Lock the row, ask ``writes`` (a ``ledger_flow`` rule) and write what it answers; the row as
        stored whether it changed or not."""
        async with self.store.pool.connection() as conn, conn.transaction():
            return await self._transition_in(conn.cursor(row_factory=dict_row), key, writes)

    @staticmethod
    async def _transition_in(cur: Any, key: SubscriptionKey,
                             writes: Callable[[FenceSnapshot], dict[str, Any]]) -> FenceSnapshot:
        """``_transition`` in the caller's transaction."""
        row = await fence_row(cur, key, lock=True)
        if row is not None and (columns := writes(snapshot(row))):
            row = await update_row(cur, row["workflow_id"], columns)
        return snapshot(row)

    # --- reads ---------------------------------------------------------------------------------

    async def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        """CAS the next ordinal (``mcpsync.workflows.coverage.plan_allocate`` on the locked row), in a
        batch with the allocations that arrive meanwhile (``read_batches.allocate_batch``)."""
        return await self._allocations.submit(req)

    async def accept(self, req: AcceptRequest) -> AcceptResult:
        """The sole acceptance point: ``judge_read`` on the locked row, then its plan's writes. The
        read's body is the one ``mcp_read`` staged (``ContentLedger.stage``)."""
        return (await self.accept_judged(req))[0]

    async def accept_judged(self, req: AcceptRequest,
                            body: ReadBody | None = None) -> tuple[AcceptResult, str | None]:
        """``accept`` with the read's body in hand (the read cycle's; None: take the staged one), and
        the digest of the read it judged: a replay's is the stored receipt's, not the retry's read.
        The body enters the subject's store in this transaction, only when the verdict releases it
        (ACCEPTED / UNCHANGED with no guardrail rejection): a row revoked, closed or fenced off
        meanwhile judges the read otherwise, and its body is dropped. A staged body leaves
        ``content_pending`` here whatever the verdict. In a batch with the accepts that arrive
        meanwhile (``read_batches.accept_batch``)."""
        return await self._accepts.submit((req, body))

    # --- close, tombstone, revocation ------------------------------------------------------------

    @activity.defn(name=Act.BEGIN_UNSUBSCRIBE)
    async def begin_unsubscribe(self, req: KeyRequest) -> CloseReceipt:
        """beginUnsubscribe (``close_rule``): freezes closeOrdinal and a new close epoch.

        Idempotent: a row already closing answers its frozen receipt.
        """
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            row = await fence_row(cur, req.key, lock=True)
            if row is None:
                raise LookupError(f"no subscription {req.key.subject}/{req.key.server} {req.key.uri}")
            await self._apply(cur, req.key, row["workflow_id"], snapshot(row), plan_close(snapshot(row)))
            return close_receipt(snapshot(await fence_row(cur, req.key)))

    @activity.defn(name=Act.CONFIRM_TOMBSTONE)
    async def confirm_tombstone(self, req: TombstoneRequest) -> FenceSnapshot:
        """A reconciled catalog's word (``tombstone_rule``) applied to the locked row."""
        return await self._planned(req.key, lambda fence: plan_tombstone(
            fence, listed=req.listed, proven=req.proven, scan_id=req.scan_id), effective_at=datetime.now(UTC))

    @activity.defn(name=Act.REVOKE)
    async def revoke(self, req: RevokeLedgerRequest) -> FenceSnapshot:
        """Revoke one subscription (idempotent): state REVOKED, the subject's cached bodies purged,
        one outbox ``revoked`` row naming every receipt derived from it, latency recorded."""
        return await self._planned(req.key, lambda fence: plan_revoke(
            fence, source=RevokeSource(req.source), reason=req.reason), effective_at=req.effective_at)

    async def revoke_subject(self, subject: str, server: str, uri: str | None, *, reason: str,
                             effective_at: datetime,
                             source: str = RevokeSource.PLATFORM.value) -> SubjectRevocation:
        """revoke(subject, server, uri|*) in one transaction, before any workflow hears of it.

        Every subscription of ``subject`` on ``server`` (``uri``: that one; None: all), whatever
        its state, is covered: a live one is revoked as the ``revoke`` activity would (REVOKED,
        ``revocations`` row, outbox ``revoked``); a finished one (CLOSED, UNSUBSCRIBE_UNKNOWN,
        TOMBSTONED) keeps its state but gets a ``revocations`` row and an outbox ``revoked`` row
        naming its receipts, when it has receipts no earlier revocation withdrew. Then every body
        those receipts name is purged from the subject's store (and every body still pending an
        accept), except one a receipt outside this revocation still releases, and one
        ``subject_revocations`` row records it all: ``released_content`` refuses every receipt of
        the scope accepted at or before it. The rows are locked in workflow id order, so an accept
        in flight either commits first (and its body is purged here) or sees REVOKED."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            # Two statements, not one with "uri IS NULL OR": a generic plan of that would read every
            # row of the subject for a one-URI revocation.
            if uri is None:
                await cur.execute("SELECT * FROM subscriptions WHERE subject=%s AND server=%s"
                                  " ORDER BY workflow_id FOR UPDATE", (subject, server))
            else:
                await cur.execute("SELECT * FROM subscriptions WHERE subject=%s AND server=%s AND uri=%s"
                                  " ORDER BY workflow_id FOR UPDATE", (subject, server, uri))
            rows = await cur.fetchall()
            revoked: list[str] = []
            outbox_ids: list[int] = []
            purged = 0  # every body deleted below: by a row's own revocation, then by the sweep
            for row in rows:
                key = SubscriptionKey(subject=subject, server=server, uri=row["uri"])
                fence, wf = snapshot(row), row["workflow_id"]
                plan = plan_revoke(fence, source=RevokeSource(source), reason=reason)
                if plan.writes:
                    revoked.append(wf)
                elif row["state"] != S.REVOKED.value and await self._unwithdrawn_receipts(cur, wf):
                    # Finished: the state stays (it never reopens), the revocation is recorded for it.
                    plan = plan_revoke(fence, source=RevokeSource(source), reason=reason,
                                       unchecked=True).model_copy(update={"fence": None})
                else:
                    continue
                applied = await self._apply(cur, key, wf, fence, plan, effective_at=effective_at)
                purged += applied.purged_bodies
                if applied.outbox_id is not None:
                    outbox_ids.append(applied.outbox_id)
            covered = [r["workflow_id"] for r in rows]
            await cur.execute("SELECT receipt_id FROM resource_versions WHERE workflow_id = ANY(%s)"
                              " ORDER BY receipt_id", (covered,))
            receipt_ids = [int(r["receipt_id"]) for r in await cur.fetchall()]
            purged += await self.content.purge_subject(cur, subject=subject, workflow_ids=covered)
            await self.content.purge_staged(cur, subject=subject, server=server, uri=uri)
            await cur.execute(
                """
                INSERT INTO subject_revocations (subject, server, uri, source, reason, effective_at,
                    receipt_ids, workflow_ids, purged_bodies)
                VALUES (%s, %s, %s, %s, %s, LEAST(%s, clock_timestamp()), %s, %s, %s)
                RETURNING subject_revocation_id
                """,
                (subject, server, uri, source, reason[:300], effective_at, receipt_ids, covered, purged))
            got = await cur.fetchone()
            assert got is not None
            rid = int(got["subject_revocation_id"])
            if outbox_ids:
                await cur.execute("UPDATE outbox SET detail = detail || "
                                  "jsonb_build_object('subject_revocation_id', %s) WHERE outbox_id = ANY(%s)",
                                  (rid, outbox_ids))
        return SubjectRevocation(subject_revocation_id=rid, subject=subject, server=server, uri=uri,
                                 revoked=revoked, covered=covered, receipt_ids=receipt_ids,
                                 purged_bodies=purged, outbox_ids=outbox_ids)

    @staticmethod
    async def _unwithdrawn_receipts(cur: Any, workflow_id: str) -> int:
        """How many receipts of the subscription no revocation recorded since has withdrawn."""
        await cur.execute(
            """
            SELECT count(*) AS n FROM resource_versions rv WHERE rv.workflow_id=%s AND NOT EXISTS (
                SELECT 1 FROM revocations r WHERE r.workflow_id = rv.workflow_id
                AND r.recorded_at >= rv.accepted_at)
            """, (workflow_id,))
        row = await cur.fetchone()
        return int(row["n"]) if row else 0

    async def _planned(self, key: SubscriptionKey, plan: Callable[[FenceSnapshot], WritePlan], *,
                       effective_at: datetime) -> FenceSnapshot:
        """Lock the row, plan on it, apply the plan; the row as it stands after."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            row = await fence_row(cur, key, lock=True)
            fence = snapshot(row)
            if row is not None:
                await self._apply(cur, key, row["workflow_id"], fence, plan(fence), effective_at=effective_at)
            return snapshot(await fence_row(cur, key))

    # --- the plan, in SQL ------------------------------------------------------------------------

    async def _apply(self, cur: Any, key: SubscriptionKey, wf: str | None, fence: FenceSnapshot,
                     plan: WritePlan, *, outcome: ReadOutcome | None = None,
                     effective_at: datetime | None = None) -> Applied:
        """``_apply_all`` of one plan (``wf`` the id the locked row of ``key`` recorded; None for no
        row, where a plan can only audit)."""
        return (await self._apply_all(cur, [Planned(key, wf, fence, plan, outcome, effective_at)]))[0]

    async def _apply_all(self, cur: Any, items: Sequence[Planned]) -> list[Applied]:
        """Write each item's plan in the caller's transaction (every row locked, no two of one
        subscription). The writes ``plan_writes.set_based`` names (``read_requests`` completion,
        receipt, fence row update, the accepted body) go out as one statement for all items
        (``plan_writes.write_plans``); then, per item, what only some plans have, each after the
        receipt it reads: audit, withdrawn receipts, outbox row (or the rollout's hold), revocation.
        An unchanged verification's plan is all set-based."""
        written = await write_plans(cur, items)
        return [await self._apply_rest(cur, item, w.receipt_id, w.accepted_at)
                for item, w in zip(items, written, strict=True)]

    async def _apply_rest(self, cur: Any, item: Planned, receipt_id: int | None,
                          accepted_at: datetime | None) -> Applied:
        """The per-plan writes of ``item`` (``_apply_all``), its receipt already written."""
        key, wf, plan, outcome = item.key, item.wf, item.plan, item.outcome
        session_generation = outcome.session_generation if outcome is not None else None
        if plan.audit is not None:
            await self.journal.insert_audit(cur, plan.audit.kind, subject=key.subject, server=key.server,
                                            uri=key.uri, workflow_id=wf,
                                            session_generation=session_generation, detail=plan.audit.detail)
        if wf is None:
            return Applied(None, None)
        # What a tombstone or a revocation withdraws: every receipt so far, the new one included.
        receipt_ids, digests = await self.journal.withdrawn(cur, wf) if (
            plan.revocation is not None or (plan.outbox is not None and plan.outbox.withdraws)) else ([], [])
        outbox_id = None
        if plan.outbox is not None:
            ob = plan.outbox
            if ob.rollout_gated and not await self.journal.rollout_allows(cur, key):
                if ob.event == OutboxEventType.VERSION_ACCEPTED:
                    # Shadow / not yet in the rollout percentage: fences and receipts as usual, nothing
                    # published.
                    await self.journal.insert_audit(
                        cur, "OUTBOX_HELD_BY_ROLLOUT", subject=key.subject, server=key.server, uri=key.uri,
                        workflow_id=wf, session_generation=session_generation,
                        detail={"receipt_id": receipt_id, "digest": ob.content_digest})
            else:
                outbox_id = await self.journal.insert_outbox(
                    cur, ob.event, key, workflow_id=wf,
                    receipt_id=receipt_id if ob.of_receipt else item.fence.last_receipt_id,
                    content_digest=ob.content_digest, ordinal=ob.ordinal,
                    detail=_outbox_detail(plan, outcome, accepted_at, receipt_ids, digests))
        purged = 0
        if plan.revocation is not None:
            purged = await self.content.purge_withdrawn(cur, subject=key.subject, workflow_id=wf,
                                                        digests=digests)
            await self.content.purge_staged(cur, subject=key.subject, server=key.server, uri=key.uri)
            await cur.execute(
                """
                INSERT INTO revocations (workflow_id, subject, server, uri, source, reason, effective_at,
                    outbox_id, purged_bodies)
                VALUES (%s, %s, %s, %s, %s, %s, LEAST(%s, clock_timestamp()), %s, %s)
                """,
                (wf, key.subject, key.server, key.uri, plan.revocation.source.value, plan.revocation.reason,
                 item.effective_at or datetime.now(UTC), outbox_id, purged),
            )
        return Applied(receipt_id, outbox_id, purged)


def _asking_workflow_id(key: SubscriptionKey) -> str:
    """The id of the workflow whose activity (local ones included) is running; outside an activity, or in
    a standalone one, the key's computed id stands in."""
    return (activity.info().workflow_id if activity.in_activity() else None) or key.workflow_id


def _outbox_detail(plan: WritePlan, outcome: ReadOutcome | None, accepted_at: datetime | None,
                   receipt_ids: list[int], digests: list[str]) -> dict[str, Any]:
    """The ``outboxEvent.v1`` fields an outbox row keeps in ``detail`` (activities/ledger/outbox.py)."""
    ob = plan.outbox
    assert ob is not None
    detail: dict[str, Any] = {"previous_digest": ob.previous_digest}
    if ob.withdraws:
        detail |= {"receipt_ids": receipt_ids, "digests": digests}
    if plan.receipt is not None and accepted_at is not None:
        detail |= {"accepted_at": accepted_at.isoformat(), "trigger": plan.receipt.trigger.value}
    if ob.event == OutboxEventType.VERSION_ACCEPTED and outcome is not None:
        o = outcome
        detail |= {"mime_type": o.mime_type, "size": o.size, "edition": o.edition,
                   "server_name": o.server_name, "server_version": o.server_version, "ttl_ms": o.ttl_ms,
                   "cache_scope": o.cache_scope.value if o.cache_scope is not None else None}
    if ob.reason:
        detail["reason"] = ob.reason
    if plan.revocation is not None:
        detail["source"] = plan.revocation.source.value
    return detail
