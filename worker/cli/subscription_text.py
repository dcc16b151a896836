"""How the subscription commands show a subscription: status text, kubectl-style tables,
freshness lines, history lines and the JSON record.

Contract: pure functions of a ``ResourceSubscriptionV1`` record or a ledger row and ``now``;
times print as UTC ISO stamps with a relative age, absent values as ``-``. ``status_view`` takes
what ``activities/ledger/proven.py`` proves about the version too: its freshness fields (dirty, fresh, last
accepted, last verified, next verification due) are the ledger's, the record's other fields stay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter

from mcpsync.activities.ledger.proven import Proven
from mcpsync.worker.cli.common import terminal_safe
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["age_of", "dash", "first_read_text", "freshness_lines", "history_line", "record_doc",
           "staleness_bound", "staleness_bound_text", "status_text", "status_view", "subscription_table",
           "when"]


_JSON_TIME = TypeAdapter(datetime | None)  # a time as the record's JSON writes it


def when(value: datetime | str | None, now: datetime) -> str:
    """``2026-12-03T12:00:05Z (12s ago)`` / ``(in 4m 48s)``; ``-`` for None."""
    if value is None:
        return "-"
    at = datetime.fromisoformat(value) if isinstance(value, str) else value
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    delta = (now - at).total_seconds()
    stamp_text = at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
    return f"{stamp_text} ({age(abs(delta))} {'ago' if delta >= 0 else 'from now'})"


def age(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def staleness_bound_text(record: ResourceSubscriptionV1) -> str:
    """The staleness bound the record publishes, and what it rests on."""
    if record.staleness_bound_seconds is not None:
        why = {"ttl": "the server's ttlMs", "backoff": "backoff after failed reads"}.get(
            record.staleness_bound_source or "", "poll_interval_seconds")
        return f"{record.staleness_bound_seconds:g} s (polling: no usable subscribe; set by {why})"
    if record.safety_read_seconds:
        return f"{record.safety_read_seconds:g} s (safety read period; a notification is read sooner)"
    return "-"


def staleness_bound(record: ResourceSubscriptionV1) -> float | None:
    """The bound a verification must be younger than: the published one, else the safety read period."""
    return record.staleness_bound_seconds or record.safety_read_seconds or None


def record_doc(record: ResourceSubscriptionV1) -> dict[str, Any]:
    """The record as JSON, with the staleness bound the text shows: with subscribe the record leaves
    ``staleness_bound_seconds`` null (the safety read period bounds it), and the JSON says so
    (``staleness_bound_source``: ``safety_read``) instead of a null the text contradicts."""
    doc = record.model_dump(mode="json")
    bound = staleness_bound(record)
    if record.staleness_bound_seconds is None and bound is not None:
        doc["staleness_bound_seconds"] = bound
        doc["staleness_bound_source"] = "safety_read"
    return doc


def freshness_lines(record: ResourceSubscriptionV1, now: datetime) -> list[tuple[str, str]]:
    return [
        ("last accepted at", when(record.last_accepted_at, now)),
        ("last verified at", when(record.last_verified_at, now)),
        ("next read due", when(record.next_read_due_at, now)),
        ("staleness bound", staleness_bound_text(record)),
    ]


def dash(value: Any) -> str:
    """One field of a line: ``-`` when absent, else its text with every control character escaped
    (newlines too: a value from upstream cannot start a line of its own)."""
    return "-" if value is None or value == "" else terminal_safe(str(value), keep="")


def status_text(record: ResourceSubscriptionV1, now: datetime,
                freshness: Sequence[tuple[str, str]] = ()) -> str:
    """The record as aligned ``name: value`` lines; ``freshness``: more lines after its freshness lines."""
    caps = ", ".join(f"{k}={v}" for k, v in sorted(record.capabilities.items())) or "-"
    edition = dash(record.edition)  # negotiated; a mismatch with the config is an EDITION_MISMATCH audit row
    rows = [
        ("subscription", f"{record.subject}/{record.server} {record.uri}"),
        ("state", record.state.value),
        ("edition", edition),
        ("capabilities", caps),
        ("session / subscription gen", f"{record.session_generation} / {record.subscription_generation}"),
        ("issued / accepted ordinal", f"{record.last_issued_ordinal} / {record.last_accepted_ordinal}"),
        ("watermark", str(record.watermark)),
        ("last receipt", f"{dash(record.last_receipt_id)} {dash(record.last_accepted_digest)}"),
        ("notifications seen", str(record.last_notification_seq)),
        ("reads issued", str(record.reads_issued)),
        ("close epoch / ordinal", f"{record.close_epoch} / {dash(record.close_ordinal)}"),
        ("started / ended", f"{when(record.started_at, now)} / {when(record.ended_at, now)}"),
        *freshness_lines(record, now),
        *freshness,
        ("safety read period", f"{record.safety_read_seconds:g} s" if record.safety_read_seconds else "-"),
        ("detail", dash(record.detail)),
    ]
    return "\n".join(f"{k:>26}: {v}" for k, v in rows)


def status_view(record: ResourceSubscriptionV1, proven: Proven | None,
                now: datetime) -> tuple[dict[str, Any], str]:
    """``mcpsync status``'s JSON and text. With the ledger's word (``proven``), last accepted and last
    verified are the ledger's, and dirty, fresh (why not) and the next verification due under the
    record's staleness bound are added; without a database only the record speaks."""
    if proven is None:
        return record_doc(record), status_text(record, now)
    record = record.model_copy(update={"last_accepted_at": proven.accepted_at,
                                       "last_verified_at": proven.verified_at})
    bound = staleness_bound(record)
    fresh, why = proven.fresh(bound, now)
    due = proven.due_at(bound)
    doc = record_doc(record) | {"dirty": proven.dirty, "fresh": fresh, "not_fresh_because": why or None,
                                "next_verification_due_at": _JSON_TIME.dump_python(due, mode="json")}
    lines = [("dirty", "yes: an update no observing read covers yet" if proven.dirty else "no"),
             ("fresh", "yes" if fresh else f"no: {why}"),
             ("next verification due", when(due, now))]
    return doc, status_text(record, now, lines)


_COLUMNS = [("SERVER", "server"), ("SUBJECT", "subject"), ("URI", "uri"), ("STATE", "state"),
            ("WATERMARK", "watermark"), ("RECEIPT", "last_receipt_id")]
_WIDE = [("SESSION_GEN", "session_generation"), ("SUB_GEN", "subscription_generation"),
         ("ACCEPTED_ORDINAL", "last_accepted_ordinal"), ("NOTIFICATIONS", "notifications_seen"),
         ("DIGEST", "last_accepted_digest"), ("WORKFLOW_ID", "workflow_id")]


CELL_MAX = 60  # characters of a cell in the narrow table; longer ones end in "…"


def subscription_table(rows: Sequence[dict[str, Any]], *, wide: bool, now: datetime,
                       records: dict[str, ResourceSubscriptionV1] | None = None) -> str:
    """kubectl-style table of ledger rows; ``wide`` adds ledger detail and, for the rows in
    ``records`` (workflow id -> the workflow's record), the freshness columns. Without ``wide`` a
    cell longer than ``CELL_MAX`` characters (a long URI, say) is cut and ends in "…"."""
    headers = [h for h, _ in _COLUMNS] + ["UPDATED"]
    if wide:
        headers += [h for h, _ in _WIDE]
        headers += ["LAST_ACCEPTED", "LAST_VERIFIED", "NEXT_READ_DUE", "STALENESS_BOUND"]
    table = [headers]
    for r in rows:
        line = [dash(r.get(k)) for _, k in _COLUMNS]
        line.append(age_of(r.get("updated_at"), now))
        if wide:
            line += [dash(r.get(k))[:23] if k == "last_accepted_digest" else dash(r.get(k)) for _, k in _WIDE]
            rec = (records or {}).get(r["workflow_id"])
            line.append(age_of((rec and rec.last_accepted_at) or r.get("last_accepted_at"), now))
            line.append(age_of(rec.last_verified_at, now) if rec else "-")
            # The ledger's schedule where it holds the row's next verification, else the run's deadline.
            line.append(age_of(r.get("verify_due_at") or (rec.next_read_due_at if rec else None), now))
            bound = rec and staleness_bound(rec)
            line.append(f"{bound:g}s" if bound else "-")
        table.append(line)
    if not wide:  # -o wide shows every cell whole
        table = [[cell if len(cell) <= CELL_MAX else cell[:CELL_MAX - 1] + "…" for cell in row]
                 for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in table)


def age_of(value: datetime | str | None, now: datetime) -> str:
    """Relative time for table cells: ``12s ago`` / ``in 4m48s``; ``-`` for None."""
    if value is None:
        return "-"
    at = datetime.fromisoformat(value) if isinstance(value, str) else value
    delta = (now - at).total_seconds()
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def stamp(value: str) -> str:
    """``2026-12-03T12:12:50.858Z``: UTC, milliseconds."""
    return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def history_line(e: dict[str, Any]) -> str:
    if e["kind"] == "receipt":
        return (f"{stamp(e['at'])} receipt #{e['receipt_id']} {e['status']} ordinal={e['read_ordinal']} "
                f"trigger={e['trigger_reason']} gen={e['session_generation']}/{e['subscription_generation']} "
                f"{dash(e['content_digest'])[:23]} {dash(e['mime_type'])} {e['size']}B")
    detail = json.dumps(e["detail"], sort_keys=True, default=str) if e["detail"] else ""
    return (f"{stamp(e['at'])} audit   #{e['audit_id']} {e['audit_kind']} "
            f"gen={dash(e['session_generation'])} {detail}").rstrip()


def first_read_text(record: ResourceSubscriptionV1) -> str:
    """``subscribe --wait``'s line for one URI: the first receipt's verdict and digest, or why no
    read came."""
    if record.last_verdict is None:
        detail = f" ({record.detail})" if record.detail else ""
        return f"{record.uri}: {record.state.value}, no receipt{detail}"
    return (f"{record.uri}: {record.last_verdict.value} receipt {dash(record.last_receipt_id)} "
            f"digest {dash(record.last_accepted_digest)} state {record.state.value}")
