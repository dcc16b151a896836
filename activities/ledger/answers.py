"""The answer gate's half of the PostgreSQL ledger, and its Temporal activities (main task queue).

Contract:
- Read-only on the subscription ledger (``subscriptions``, ``read_requests``,
  ``resource_versions``, ``mcp_sessions``, ``audit``): ``observe`` takes one REPEATABLE READ
  snapshot of every dependency of an answer (fence row, live session, latest accepted and
  newest receipts, the selected and bound receipts, the latest completed read, reads in
  flight, the latest update naming the URI) and returns ids, digests, states and times only.
  Its ``dirty`` is what ``activities/ledger/proven.py`` proves about the row (the level rule, the same
  SQL fragments every reader of freshness uses): the gate's UPDATE_SEEN.
- Writes only ``answer_bindings``, ``answer_selections`` and ``answer_dispositions``
  (migration 004). Each write is idempotent by the workflow's request id, so an activity
  retry never writes twice. Revisions and check sequences only grow (``GREATEST``).
- A bind or a selection naming a receipt that does not exist, or that belongs to another
  (subject, server, URI), is refused with a non-retryable ``InvalidBinding`` /
  ``InvalidSelection`` error; the workflow turns it into a failed update.
- ``latest_receipts`` is the host's direct read: which receipt to select for each URI.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from mcpsync.activities.ledger.proven import PROVEN_COLUMNS, PROVEN_JOIN, proven_from_row
from mcpsync.workflows.answer_rules import (
    AnswerDependency,
    AnswerKeyRequest,
    BindLedgerRequest,
    BoundAnswer,
    DependencyObservation,
    Disposition,
    InputSelection,
    LatestReceipt,
    LoadedAnswer,
    ObservationSnapshot,
    ObserveRequest,
    ReadObservation,
    ReceiptObservation,
    RecordDispositionRequest,
    SelectLedgerRequest,
)
from mcpsync.workflows.names import AnswerAct
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionState

__all__ = ["AnswerLedger", "AnswerLedgerActivities"]

_RECEIPT_SQL = """
    SELECT rv.receipt_id, rv.subject, rv.server, rv.uri, rv.status, rv.content_digest, rv.read_ordinal,
           rv.session_generation, rv.subscription_generation, rv.accepted_at, rr.issued_at AS read_issued_at
    FROM resource_versions rv
    LEFT JOIN read_requests rr ON rr.workflow_id = rv.workflow_id AND rr.ordinal = rv.read_ordinal
                              AND rv.status <> 'TOMBSTONED'
"""
_SUBSCRIPTION_SQL = f"""
SELECT s.workflow_id, s.state, s.session_generation, s.subscription_generation,
       s.notifications_seen, s.last_notification_at, s.last_notification_generation,
       {PROVEN_COLUMNS},
       m.generation AS live_generation, m.subscribe AS live_subscribe,
       EXISTS (SELECT 1 FROM audit a WHERE a.kind = 'SUBSCRIBE_REJECTED'
           AND a.workflow_id = s.workflow_id
               AND a.session_generation = s.session_generation) AS subscribe_rejected,
       (SELECT count(*) FROM read_requests r WHERE r.workflow_id = s.workflow_id
          AND r.completed_at IS NULL AND r.ordinal > s.last_accepted_ordinal
          AND r.session_generation = s.session_generation
          AND r.subscription_generation = s.subscription_generation) AS reads_pending
FROM subscriptions s
LEFT JOIN mcp_sessions m ON m.subject = s.subject AND m.server = s.server AND m.closed_at IS NULL
{PROVEN_JOIN}
WHERE s.subject = %s AND s.server = %s AND s.uri = %s
"""

log = logging.getLogger("mcpsync.answer")

_ACCEPTED = [AcceptVerdict.ACCEPTED.value, AcceptVerdict.UNCHANGED.value]


def _receipt(row: dict[str, Any] | None) -> ReceiptObservation | None:
    if row is None:
        return None
    return ReceiptObservation(
        receipt_id=row["receipt_id"], subject=row["subject"], server=row["server"], uri=row["uri"],
        status=AcceptVerdict(row["status"]), content_digest=row["content_digest"],
        read_ordinal=row["read_ordinal"], session_generation=row["session_generation"],
        subscription_generation=row["subscription_generation"], read_issued_at=row["read_issued_at"],
        accepted_at=row["accepted_at"],
    )


def _rejected(message: str, error_type: str) -> ApplicationError:
    """A caller's mistake (an unknown receipt, another URI's receipt): one log line here, and a
    BENIGN non-retryable error, which the SDK logs without a traceback (at DEBUG); the update that
    asked fails with ``message``."""
    log.info("answer gate: %s rejected: %s", error_type, message)
    return ApplicationError(message, type=error_type, non_retryable=True,
                            category=ApplicationErrorCategory.BENIGN)


class AnswerLedger:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    # --- observations (read-only on the subscription ledger) --------------------------------

    async def observe(self, req: ObserveRequest) -> ObservationSnapshot:
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            await cur.execute("SELECT now() AS checked_at")
            head = await cur.fetchone()
            assert head is not None
            observed = [await self._observe_one(cur, dep, req.selections.get(dep.uri, dep.receipt_id))
                        for dep in req.dependencies]
        return ObservationSnapshot(checked_at=head["checked_at"], dependencies=observed)

    @staticmethod
    async def _observe_one(cur: Any, dep: AnswerDependency, selected_id: int) -> DependencyObservation:
        await cur.execute(_RECEIPT_SQL + " WHERE rv.receipt_id = ANY(%s)", ([selected_id, dep.receipt_id],))
        by_id = {r["receipt_id"]: _receipt(r) for r in await cur.fetchall()}
        selected, bound = by_id.get(selected_id), by_id.get(dep.receipt_id)
        await cur.execute(_SUBSCRIPTION_SQL, (dep.subject, dep.server, dep.uri))
        sub = await cur.fetchone()
        if sub is None:
            return DependencyObservation(subject=dep.subject, server=dep.server, uri=dep.uri,
                                         subscribed=False, selected=selected, bound=bound)
        wf = sub["workflow_id"]
        await cur.execute(_RECEIPT_SQL + " WHERE rv.workflow_id = %s AND rv.status = ANY(%s)"
                          " ORDER BY rv.read_ordinal DESC, rv.receipt_id DESC LIMIT 1", (wf, _ACCEPTED))
        latest = _receipt(await cur.fetchone())
        await cur.execute(_RECEIPT_SQL + " WHERE rv.workflow_id = %s AND rv.status <> 'STALE'"
                          " ORDER BY rv.read_ordinal DESC, rv.receipt_id DESC LIMIT 1", (wf,))
        newest = _receipt(await cur.fetchone())
        changes = 0
        if selected is not None and latest is not None and selected.uri == dep.uri:
            await cur.execute(
                "SELECT count(*) AS n FROM resource_versions WHERE workflow_id = %s AND read_ordinal > %s"
                " AND read_ordinal <= %s AND status NOT IN ('UNCHANGED', 'STALE')",
                (wf, selected.read_ordinal, latest.read_ordinal))
            row = await cur.fetchone()
            changes = int(row["n"]) if row else 0
        await cur.execute(
            "SELECT ordinal, request_id, outcome, issued_at, completed_at FROM read_requests"
            " WHERE workflow_id = %s AND completed_at IS NOT NULL ORDER BY ordinal DESC LIMIT 1", (wf,))
        lr = await cur.fetchone()
        latest_read = None
        if lr is not None:
            error_code = None
            if lr["outcome"] not in ("ACCEPTED", "UNCHANGED", "STALE", "STALE_AFTER_CLOSE"):
                await cur.execute(
                    "SELECT detail FROM audit WHERE kind IN ('READ_FAILED', 'READ_DENIED')"
                    " AND workflow_id = %s AND detail->>'request_id' = %s ORDER BY audit_id DESC LIMIT 1",
                    (wf, lr["request_id"]))
                audit = await cur.fetchone()
                code = audit["detail"].get("error_code") if audit else None
                error_code = int(code) if isinstance(code, int) else None
            latest_read = ReadObservation(ordinal=lr["ordinal"], outcome=lr["outcome"],
                                          issued_at=lr["issued_at"], completed_at=lr["completed_at"],
                                          error_code=error_code)
        return DependencyObservation(
            subject=dep.subject, server=dep.server, uri=dep.uri, subscribed=True,
            state=SubscriptionState(sub["state"]), session_generation=sub["session_generation"],
            subscription_generation=sub["subscription_generation"],
            live_session_generation=sub["live_generation"],
            updates_watched=bool(sub["live_subscribe"]) and not sub["subscribe_rejected"],
            bound=bound, selected=selected, latest_accepted=latest, newest_receipt=newest,
            changes_since_selected=changes, notifications_seen=sub["notifications_seen"],
            last_notification_at=sub["last_notification_at"],
            last_notification_generation=sub["last_notification_generation"],
            reads_pending=int(sub["reads_pending"]), latest_read=latest_read,
            dirty=proven_from_row(sub).dirty,
        )

    async def latest_receipts(self, subject: str, server: str,
                              uris: Sequence[str]) -> dict[str, LatestReceipt]:
        """Per URI: the subscription state and the latest ACCEPTED/UNCHANGED receipt (what to select)."""
        out: dict[str, LatestReceipt] = {}
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            for uri in uris:
                await cur.execute(
                    "SELECT workflow_id, state FROM subscriptions WHERE subject=%s AND server=%s AND uri=%s",
                    (subject, server, uri))
                sub = await cur.fetchone()
                receipt = None
                if sub is not None:
                    await cur.execute(_RECEIPT_SQL + " WHERE rv.workflow_id = %s AND rv.status = ANY(%s)"
                                      " ORDER BY rv.read_ordinal DESC, rv.receipt_id DESC LIMIT 1",
                                      (sub["workflow_id"], _ACCEPTED))
                    receipt = _receipt(await cur.fetchone())
                out[uri] = LatestReceipt(subject=subject, server=server, uri=uri,
                                         state=SubscriptionState(sub["state"]) if sub else None,
                                         receipt=receipt)
        return out

    # --- bindings, selections, dispositions ---------------------------------------------------

    @staticmethod
    async def _check_receipt(cur: Any, dep: AnswerDependency, error_type: str) -> None:
        await cur.execute("SELECT subject, server, uri FROM resource_versions WHERE receipt_id=%s",
                          (dep.receipt_id,))
        row = await cur.fetchone()
        if row is None:
            raise _rejected(f"receipt {dep.receipt_id} does not exist", error_type)
        if (row["subject"], row["server"], row["uri"]) != (dep.subject, dep.server, dep.uri):
            raise _rejected(f"receipt {dep.receipt_id} is not a receipt of {dep.subject}/{dep.server} "
                            f"{dep.uri!r}", error_type)

    async def bind(self, req: BindLedgerRequest) -> BoundAnswer:
        b = req.bind
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 4))", (b.answer_id,))
            await cur.execute("SELECT revision, bound_at FROM answer_bindings WHERE request_id=%s",
                              (req.request_id,))
            row = await cur.fetchone()
            if row is None:
                for dep in b.dependencies:
                    await self._check_receipt(cur, dep, "InvalidBinding")
                await cur.execute(
                    """
                    INSERT INTO answer_bindings (answer_id, revision, request_id, workflow_id, question,
                        dependencies)
                    SELECT %s, COALESCE(MAX(revision), 0) + 1, %s, %s, %s, %s FROM answer_bindings
                           WHERE answer_id=%s
                    RETURNING revision, bound_at
                    """,
                    (b.answer_id, req.request_id, req.workflow_id, b.question,
                     json.dumps([d.model_dump(mode="json") for d in b.dependencies]), b.answer_id),
                )
                row = await cur.fetchone()
                assert row is not None
                for dep in b.dependencies:
                    await cur.execute(
                        "INSERT INTO answer_selections (answer_id, revision, request_id,"
                        " subject, server, uri, receipt_id, source, selected_at)"
                        " VALUES (%s,%s,%s,%s,%s,%s,%s,'bound',%s)",
                        (b.answer_id, row["revision"], req.request_id, dep.subject, dep.server, dep.uri,
                         dep.receipt_id, row["bound_at"]))
            selections = [InputSelection(uri=d.uri, receipt_id=d.receipt_id, source="bound",
                                         selected_at=row["bound_at"])
                          for d in b.dependencies]
        return BoundAnswer(revision=row["revision"], bound_at=row["bound_at"], selections=selections)

    async def select(self, req: SelectLedgerRequest) -> InputSelection:
        dep = req.dependency
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT receipt_id, selected_at FROM answer_selections WHERE request_id=%s"
                              " AND uri=%s",
                              (req.request_id, dep.uri))
            row = await cur.fetchone()
            if row is None:
                await self._check_receipt(cur, dep, "InvalidSelection")
                await cur.execute(
                    "INSERT INTO answer_selections (answer_id, revision, request_id, subject,"
                    " server, uri, receipt_id, source) VALUES (%s,%s,%s,%s,%s,%s,%s,'host')"
                    " RETURNING receipt_id, selected_at",
                    (req.answer_id, req.revision, req.request_id, dep.subject, dep.server, dep.uri,
                     dep.receipt_id))
                row = await cur.fetchone()
                assert row is not None
        return InputSelection(uri=dep.uri, receipt_id=row["receipt_id"], source="host",
                              selected_at=row["selected_at"])

    async def record_disposition(self, req: RecordDispositionRequest) -> int:
        """Persist one disposition; returns its sequence (the next free one if the workflow's was taken)."""
        d = req.disposition
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 4))", (d.answer_id,))
            await cur.execute("SELECT sequence FROM answer_dispositions WHERE request_id=%s",
                              (req.request_id,))
            row = await cur.fetchone()
            if row is not None:
                return int(row["sequence"])
            await cur.execute("SELECT COALESCE(MAX(sequence), 0) + 1 AS next FROM answer_dispositions"
                              " WHERE answer_id=%s", (d.answer_id,))
            nxt = await cur.fetchone()
            sequence = max(d.sequence, int(nxt["next"]) if nxt else 1)
            d = d.model_copy(update={"sequence": sequence})
            await cur.execute(
                """
                INSERT INTO answer_dispositions (answer_id, revision, sequence, request_id, verdict,
                    reason_code, reason, reopened, receipt_ids, evidence_from, evidence_to, checked_at,
                    disposition)
                VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)
                """,
                (d.answer_id, d.revision, sequence, req.request_id, d.verdict.value, d.reason_code.value,
                 d.reason, d.reopened, d.receipt_ids, d.evidence_from, d.evidence_to, d.checked_at,
                 d.model_dump_json()),
            )
        return sequence

    async def load(self, answer_id: str) -> LoadedAnswer | None:
        """The latest binding revision with its current selections and the latest dispositions."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM answer_bindings WHERE answer_id=%s"
                              " ORDER BY revision DESC LIMIT 1",
                              (answer_id,))
            b = await cur.fetchone()
            if b is None:
                return None
            await cur.execute(
                "SELECT DISTINCT ON (uri) uri, receipt_id, source, selected_at FROM answer_selections"
                " WHERE answer_id=%s AND revision=%s ORDER BY uri, selection_id DESC",
                (answer_id, b["revision"]))
            selections = [InputSelection(**r) for r in await cur.fetchall()]
            await cur.execute("SELECT COALESCE(MAX(sequence), 0) AS n FROM answer_dispositions"
                              " WHERE answer_id=%s",
                              (answer_id,))
            checks = await cur.fetchone()
            await cur.execute("SELECT disposition FROM answer_dispositions WHERE answer_id=%s"
                              " ORDER BY sequence DESC LIMIT 1", (answer_id,))
            last = await cur.fetchone()
            await cur.execute("SELECT disposition FROM answer_dispositions WHERE answer_id=%s"
                              " AND verdict='ACCEPT' ORDER BY sequence DESC LIMIT 1", (answer_id,))
            accept = await cur.fetchone()
        return LoadedAnswer(
            answer_id=answer_id, question=b["question"], revision=b["revision"], bound_at=b["bound_at"],
            dependencies=[AnswerDependency.model_validate(d) for d in b["dependencies"]],
            selections=selections, checks=int(checks["n"]) if checks else 0,
            disposition=Disposition.model_validate(last["disposition"]) if last else None,
            last_accept=Disposition.model_validate(accept["disposition"]) if accept else None,
        )

    async def dispositions(self, answer_id: str) -> list[Disposition]:
        """Every disposition of an answer, oldest first (the audit trail)."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT disposition FROM answer_dispositions WHERE answer_id=%s"
                              " ORDER BY sequence",
                              (answer_id,))
            return [Disposition.model_validate(r["disposition"]) for r in await cur.fetchall()]


class AnswerLedgerActivities:
    def __init__(self, ledger: AnswerLedger) -> None:
        self.ledger = ledger

    def all(self) -> list[Callable[..., Any]]:
        return [self.load, self.bind, self.select, self.observe, self.record_disposition]

    @activity.defn(name=AnswerAct.LOAD)
    async def load(self, req: AnswerKeyRequest) -> LoadedAnswer | None:
        return await self.ledger.load(req.answer_id)

    @activity.defn(name=AnswerAct.BIND)
    async def bind(self, req: BindLedgerRequest) -> BoundAnswer:
        return await self.ledger.bind(req)

    @activity.defn(name=AnswerAct.SELECT)
    async def select(self, req: SelectLedgerRequest) -> InputSelection:
        return await self.ledger.select(req)

    @activity.defn(name=AnswerAct.OBSERVE)
    async def observe(self, req: ObserveRequest) -> ObservationSnapshot:
        return await self.ledger.observe(req)

    @activity.defn(name=AnswerAct.RECORD)
    async def record_disposition(self, req: RecordDispositionRequest) -> int:
        return await self.ledger.record_disposition(req)
