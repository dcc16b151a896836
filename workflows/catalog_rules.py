"""Catalog reconciliation rules: A/B full scans, snapshot proofs, staged rollout (pure).

Contract:
- Plain deterministic Python (no I/O, no clock, no randomness, no temporalio import): the scan
  activity feeds pages into ``ScanAccumulator``, the workflow and the ledger judge scan pairs
  with ``judge_pair``, and ``CatalogReconciler`` holds the whole workflow state in one
  serializable ``CatalogState``; ``mcpsync.workflows.catalog`` only executes its decisions.
- One scan never yields a catalog. A catalog is published only from two consecutive
  COMPLETE scans (A then B) of the same session generation whose URI, descriptor and
  template digests are equal and during which the session received no list_changed.
  Anything else restarts the reconciliation (immediately a few times, then with backoff).
- Matching scans give ``SNAPSHOT_UNPROVEN``; ``SNAPSHOT_PROVEN`` needs the negotiated
  ``SNAPSHOT_EXTENSION`` with both scans bound to one and the same snapshot id.
- URIs are kept exactly as listed. Cursors are opaque: the accumulator keeps only a keyed digest of
  each, to detect loops.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.catalog import (
    CatalogKey,
    CatalogPolicy,
    CatalogSnapshot,
    ListChanged,
    ResourceDiscoveryScanV1,
    RolloutMode,
    RolloutPolicy,
    ScanStatus,
    SnapshotEvidence,
    SnapshotStatus,
)
from mcpsync.workflows.records.subscription import SessionInfo

__all__ = ["SNAPSHOT_EXTENSION", "SNAPSHOT_EXTENSION_VERSION", "AutoSubscribeRequest", "ListKind",
           "MAX_CURSOR_DIGESTS_IN_HISTORY", "CatalogPhase", "CatalogReconciler", "CatalogState",
           "CatalogView", "NotifyRequest", "NotifyResult", "PublishOutcome", "PublishRequest",
           "ScanAccumulator", "ScanRequest", "canonical_descriptor", "cursor_digest", "descriptor_digest",
           "judge_pair", "refresh_enabled", "rollout_bucket", "set_digest", "snapshot_negotiated"]

SNAPSHOT_EXTENSION = "io.mcpsync/snapshot"
"""The snapshot-id extension, version 1 (spec: docs/catalog.md, "Snapshot-id extension"): a page's
``_meta`` stamp ``{"id", "setDigest", "count"}`` names the snapshot it was cut from and that whole listing."""
SNAPSHOT_EXTENSION_VERSION = 1

MAX_PROBLEMS = 20
MAX_CURSOR_DIGESTS_IN_HISTORY = 64
ListKind = Literal["resources", "templates"]
_ID_FIELD: dict[str, str] = {"resources": "uri", "templates": "uriTemplate"}


# --- canonical forms and digests ------------------------------------------------------


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_descriptor(wire: Mapping[str, Any]) -> dict[str, Any]:
    """A resource or template descriptor (``wire``: the JSON form as listed, camelCase keys) as it
    counts for catalog identity. Dropped: ``_meta`` (transport and server bookkeeping), ``size`` and
    ``annotations.lastModified`` (they move with content edits, the subscription's business)."""
    out = {k: v for k, v in wire.items() if k not in ("_meta", "size")}
    if isinstance(out.get("annotations"), Mapping):
        kept = {k: v for k, v in out.pop("annotations").items() if k != "lastModified"}
        if kept:
            out["annotations"] = kept
    return json.loads(canonical_json(out))  # type: ignore[no-any-return]


def descriptor_digest(canonical: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(canonical).encode()).hexdigest()


def _netstring(text: str) -> bytes:
    raw = text.encode("utf-8")
    return f"{len(raw)}:".encode() + raw + b","


def set_digest(identifiers: Iterable[str]) -> str:
    """Digest of a set of URIs (or URI templates): netstrings of the distinct UTF-8 strings,
    sorted by code point. Part of the snapshot extension, so servers compute it too."""
    return "sha256:" + hashlib.sha256(b"".join(map(_netstring, sorted(set(identifiers))))).hexdigest()


def descriptor_set_digest(descriptors: Mapping[str, str]) -> str:
    """Digest of identifier -> descriptor digest, order independent."""
    pairs = (_netstring(ident) + descriptors[ident].encode() + b";" for ident in sorted(descriptors))
    return "sha256:" + hashlib.sha256(b"".join(pairs)).hexdigest()


def cursor_digest(cursor: str | None, key: bytes) -> str:
    """Keyed digest of an opaque cursor: comparable within one key's lifetime, never reversible."""
    if cursor is None:
        return "start"  # a list's first page, requested without a cursor
    return "hmac-sha256:" + hmac.new(key, cursor.encode("utf-8"), hashlib.sha256).hexdigest()[:32]


def snapshot_negotiated(experimental: Mapping[str, Any] | None) -> bool:
    entry = (experimental or {}).get(SNAPSHOT_EXTENSION)
    return isinstance(entry, Mapping) and entry.get("version") == SNAPSHOT_EXTENSION_VERSION


class _Stamp(FrozenRecord):
    id: str
    set_digest: str | None = None
    count: int | None = None


def snapshot_stamp(meta: Mapping[str, Any] | None) -> _Stamp | None:
    """The extension's stamp in a page's ``_meta``; None when absent or malformed."""
    raw = (meta or {}).get(SNAPSHOT_EXTENSION)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str) or not raw["id"]:
        return None
    digest = raw.get("setDigest")
    count = raw.get("count")
    return _Stamp(id=raw["id"], set_digest=digest if isinstance(digest, str) else None,
                  count=count if isinstance(count, int) and not isinstance(count, bool) else None)


# --- one scan -------------------------------------------------------------------------


class ScanAccumulator:
    """Collects the pages of one full scan and decides what the scan proves.

    Drive it list by list: ``next_cursor = acc.page(kind, cursor, items, next_cursor, meta)``
    until it returns None, then check ``acc.stopped`` (a verdict other than COMPLETE) before
    moving on. ``fail`` records an error the caller met (invalid cursor, lost session)."""

    def __init__(self, *, edition: str, page_cap: int, snapshot_negotiated: bool, cursor_key: bytes) -> None:
        self.modern = edition == "2026-07-28"
        self.page_cap = page_cap
        self.negotiated = snapshot_negotiated
        self.cursor_key = cursor_key
        self.status: ScanStatus | None = None
        self.problems: list[str] = []
        self.page_cursor_digests: list[str] = []
        self.descriptors: dict[str, dict[str, dict[str, Any]]] = {"resources": {}, "templates": {}}
        self.stamps: list[tuple[str, _Stamp | None]] = []
        self._seen: dict[str, set[str]] = {"resources": set(), "templates": set()}

    @property
    def stopped(self) -> bool:
        return self.status is not None

    @property
    def pages(self) -> int:
        return len(self.page_cursor_digests)

    def fail(self, status: ScanStatus, problem: str) -> None:
        if self.status is None:
            self.status = status
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem[:300])

    def page(self, kind: ListKind, cursor: str | None, items: Iterable[Mapping[str, Any]],
             next_cursor: str | None, meta: Mapping[str, Any] | None) -> str | None:
        """Feed one page; returns the cursor to request next for this list, or None."""
        number = self.pages + 1
        self.page_cursor_digests.append(f"{kind[0]}:{cursor_digest(cursor, self.cursor_key)}")
        self.stamps.append((kind, snapshot_stamp(meta)))
        field = _ID_FIELD[kind]
        seen = self.descriptors[kind]
        for wire in items:
            ident = wire.get(field)
            if not isinstance(ident, str):
                self.fail(ScanStatus.FAILED, f"page {number}: a {kind} descriptor without {field}")
                continue
            canonical = canonical_descriptor(wire)
            prior = seen.get(ident)
            if prior is not None:
                # A URI on two pages means the listing shifted under us: the pages come from
                # different catalog generations, whatever the descriptor says.
                what = "duplicate" if prior == canonical else "descriptor changed between pages"
                self.fail(ScanStatus.INCONSISTENT, f"page {number}: {what}: {ident[:200]}")
            seen[ident] = canonical
        if self.stopped:
            return None
        if next_cursor is None or (next_cursor == "" and not self.modern):
            return None  # end of this list (on 2026-07-28 "" is a real cursor)
        digest = cursor_digest(next_cursor, self.cursor_key)
        if digest in self._seen[kind]:
            self.fail(ScanStatus.CURSOR_LOOP, f"page {number}: {kind} cursor seen before in this scan")
            return None
        self._seen[kind].add(digest)
        if self.pages >= self.page_cap:
            self.fail(ScanStatus.PAGE_CAP, f"page cap of {self.page_cap} pages reached with more to list")
            return None
        return next_cursor

    # -- results -------------------------------------------------------------------
    def final_status(self) -> ScanStatus:
        return self.status or ScanStatus.COMPLETE

    def digests(self) -> tuple[str, str, str] | None:
        """(uri set, descriptor set, template set) digests of a COMPLETE scan, else None."""
        if self.final_status() != ScanStatus.COMPLETE:
            return None
        resources = self.descriptors["resources"]
        templates = self.descriptors["templates"]
        merged = {f"r {u}": descriptor_digest(d) for u, d in resources.items()}
        merged.update({f"t {t}": descriptor_digest(d) for t, d in templates.items()})
        return set_digest(resources), descriptor_set_digest(merged), set_digest(templates)

    def snapshot_evidence(self) -> SnapshotEvidence:
        pages = len(self.stamps)
        with_id = [s for _, s in self.stamps if s is not None]
        ids = {s.id for s in with_id}

        def evidence(reason: str, snapshot_id: str | None = None) -> SnapshotEvidence:
            return SnapshotEvidence(negotiated=self.negotiated, pages=pages, pages_with_id=len(with_id),
                                    distinct_ids=len(ids), snapshot_id=snapshot_id,
                                    bound=snapshot_id is not None, reason=reason)

        if self.final_status() != ScanStatus.COMPLETE:
            return evidence("scan not complete")
        if not self.negotiated:
            ignored = " (pages carry ids anyway: ignored)" if with_id else ""
            return evidence(f"server did not negotiate {SNAPSHOT_EXTENSION}{ignored}")
        if len(with_id) < pages:
            return evidence(f"{pages - len(with_id)} of {pages} pages carry no snapshot id")
        if len(ids) != 1:
            return evidence(f"pages carry {len(ids)} different snapshot ids")
        for kind in ("resources", "templates"):
            stamps = [s for k, s in self.stamps if k == kind and s is not None]
            assembled = self.descriptors[kind]
            whole = {(set_digest(assembled), len(assembled))}
            if stamps and {(s.set_digest, s.count) for s in stamps} != whole:
                return evidence(f"the snapshot id claims a {kind} set its pages do not hold (forged or torn)")
        return evidence("every page bound to one snapshot id", snapshot_id=next(iter(ids)))


# --- two scans ------------------------------------------------------------------------


class PairVerdict(FrozenRecord):
    match: bool
    status: SnapshotStatus | None = None
    snapshot_id: str | None = None
    reason: str


def judge_pair(a: ResourceDiscoveryScanV1, b: ResourceDiscoveryScanV1) -> PairVerdict:
    """Whether scans A and B reconcile into a catalog, and what it may claim.

    The same function runs in the workflow (to decide) and in the ledger (to refuse a
    publish that does not hold up), so a catalog can only exist if this says ``match``."""

    def restart(reason: str) -> PairVerdict:
        return PairVerdict(match=False, reason=reason)

    if a.label != "A" or b.label != "B" or a.scan_id == b.scan_id:
        return restart("not an A/B pair")
    if (a.subject, a.server, a.reconciliation_id) != (b.subject, b.server, b.reconciliation_id):
        return restart("scans belong to different reconciliations")
    for scan in (a, b):
        if scan.status != ScanStatus.COMPLETE:
            return restart(f"scan {scan.label} {scan.status.value}")
        if scan.notifications_observed or scan.list_changed_after != scan.list_changed_before:
            return restart(f"list_changed during scan {scan.label}")
    if a.session_generation != b.session_generation:
        return restart("session changed between the scans")
    if b.list_changed_before != a.list_changed_after:
        return restart("list_changed between the scans")
    if a.completed_at is None or b.first_request_at is None or b.first_request_at < a.completed_at:
        return restart("scan B did not start after scan A completed")
    if (a.uri_set_digest, a.descriptor_set_digest, a.template_set_digest) != (
            b.uri_set_digest, b.descriptor_set_digest, b.template_set_digest) or a.uri_set_digest is None:
        return restart("scan digests differ")
    if a.snapshot.bound and b.snapshot.bound and a.snapshot.snapshot_id == b.snapshot.snapshot_id:
        return PairVerdict(match=True, status=SnapshotStatus.SNAPSHOT_PROVEN,
                           snapshot_id=a.snapshot.snapshot_id, reason="both scans bound to one snapshot id")
    if a.snapshot.bound and b.snapshot.bound:
        reason = "scans bound to different snapshot ids"
    else:
        reason = (a.snapshot.reason if not a.snapshot.bound else b.snapshot.reason) or "no snapshot proof"
    return PairVerdict(match=True, status=SnapshotStatus.SNAPSHOT_UNPROVEN, reason=reason)


# --- staged rollout -------------------------------------------------------------------


def rollout_bucket(subject: str, server: str, uri: str) -> float:
    """A stable point in [0, 100) per (subject, server, URI): raising the percentage only adds URIs."""
    h = hashlib.sha256(f"{subject}\0{server}\0{uri}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 * 100.0


def refresh_enabled(policy: RolloutPolicy, subject: str, server: str, uri: str) -> bool:
    """Whether the rollout lets mcpsync act (publish, confirm, subscribe) for this URI."""
    if policy.mode == RolloutMode.SHADOW:
        return False
    if policy.mode == RolloutMode.ALL:
        return True
    return rollout_bucket(subject, server, uri) < policy.percent


# --- activity contracts ---------------------------------------------------------------


class ScanRequest(FrozenRecord):
    key: CatalogKey
    reconciliation_id: str
    scan_id: str
    label: Literal["A", "B"]
    session_generation: int
    page_cap: int


class PublishRequest(FrozenRecord):
    key: CatalogKey
    reconciliation_id: str
    scan_a: str
    scan_b: str
    next_review_at: datetime
    staleness_bound_seconds: float
    rollout_mode: RolloutMode


class PublishOutcome(FrozenRecord):
    published: bool
    catalog: CatalogSnapshot | None = None
    reason: str = ""


class NotifyRequest(FrozenRecord):
    catalog: CatalogSnapshot
    rollout: RolloutPolicy


class NotifyResult(FrozenRecord):
    signalled: int = 0
    unlisted: int = 0  # of those signalled: URIs the catalog no longer lists
    held_by_rollout: int = 0  # would have been signalled, but the rollout mode holds them back
    no_workflow: int = 0
    too_new: int = 0  # subscriptions created after the catalog's window began: not told


class AutoSubscribeRequest(FrozenRecord):
    catalog: CatalogSnapshot
    rollout: RolloutPolicy
    prefixes: tuple[str, ...]


# --- the reconciler (the workflow's whole state) ---------------------------------------


class CatalogPhase(StrEnum):
    STARTING = "STARTING"
    NO_SESSION = "NO_SESSION"
    SCANNING_A = "SCANNING_A"
    SCANNING_B = "SCANNING_B"
    PUBLISHING = "PUBLISHING"
    BACKOFF = "BACKOFF"
    IDLE = "IDLE"


class CatalogState(BaseModel):
    """Everything the CatalogWorkflow knows; carried whole through continue-as-new."""

    key: CatalogKey
    policy: CatalogPolicy = CatalogPolicy()
    phase: CatalogPhase = CatalogPhase.STARTING
    wanted: bool = True
    want_reason: str = "initial"
    reconciliation_id: str | None = None
    reconciliation_reason: str = ""
    published_reason: str = ""  # what started the reconciliation behind the last catalog
    reconciliations_started: int = 0
    published_from: int = 0  # reconciliations_started value of the last published catalog
    settled_from: int = 0  # ... once its signals and auto-subscriptions went out too
    catalogs_published: int = 0
    restarts_total: int = 0
    consecutive_restarts: int = 0
    restart_reasons: list[str] = Field(default_factory=list)  # newest last, capped
    session_generation: int = 0
    list_changed_capable: bool = False
    list_changed_signals: int = 0
    list_changed_seen: dict[int, int] = Field(default_factory=dict)  # generation -> highest count signalled
    covered: tuple[int, int] = (0, 0)  # (generation, list_changed count) the last catalog already reflects
    last_catalog: CatalogSnapshot | None = None
    recent_scans: list[ResourceDiscoveryScanV1] = Field(default_factory=list)
    rollout: RolloutPolicy | None = None
    last_notify: NotifyResult | None = None
    auto_subscribed: int = 0
    detail: str = ""


class CatalogView(FrozenRecord):
    """Query ``catalog``: the workflow's status for operators and tests."""

    key: CatalogKey
    phase: CatalogPhase
    status: str  # the McpState value: last catalog status while idle, else the phase
    last_catalog: CatalogSnapshot | None
    published_reason: str  # initial | list_changed | periodic | requested ... | restart
    reconciliations_started: int
    catalogs_published: int
    restarts_total: int
    restart_reasons: list[str]
    list_changed_signals: int
    session_generation: int
    list_changed_capable: bool
    rollout: RolloutPolicy | None
    last_notify: NotifyResult | None
    auto_subscribed: int
    detail: str


MAX_REASONS = 12
MAX_RECENT_SCANS = 8


class CatalogReconciler:
    """Decisions of one CatalogWorkflow. Times come in as arguments; nothing here waits."""

    def __init__(self, state: CatalogState) -> None:
        self.s = state

    # -- triggers ------------------------------------------------------------------
    def request(self, reason: str) -> None:
        if not self.s.wanted:
            self.s.wanted, self.s.want_reason = True, reason

    def note_list_changed(self, sig: ListChanged) -> None:
        """A list_changed signal asks for a new reconciliation (coalesced) unless the catalog reflects it."""
        s = self.s
        s.list_changed_signals += 1
        s.list_changed_seen[sig.session_generation] = max(s.list_changed_seen.get(sig.session_generation, 0),
                                                          sig.count)
        if (sig.session_generation, sig.count) > s.covered:  # else a late, delayed signal
            self.request("list_changed")

    # -- one reconciliation ---------------------------------------------------------
    def bind_session(self, session: SessionInfo) -> None:
        self.s.session_generation = session.generation
        self.s.list_changed_capable = session.list_changed

    def begin(self, reconciliation_id: str) -> None:
        s = self.s
        s.reconciliation_reason = s.want_reason if s.wanted else "restart"
        s.wanted, s.want_reason = False, ""
        s.reconciliation_id = reconciliation_id
        s.reconciliations_started += 1
        s.phase = CatalogPhase.SCANNING_A

    def scan_finished(self, scan: ResourceDiscoveryScanV1) -> str | None:
        """Record a scan; a reason to restart, or None to go on."""
        s = self.s
        kept = scan.page_cursor_digests[:MAX_CURSOR_DIGESTS_IN_HISTORY]
        slim = scan.model_copy(update={"page_cursor_digests": kept})
        s.recent_scans = (s.recent_scans + [slim])[-MAX_RECENT_SCANS:]
        if scan.status != ScanStatus.COMPLETE:
            problem = f": {scan.problems[0]}" if scan.problems else ""
            return f"scan {scan.label} {scan.status.value}{problem}"
        if scan.notifications_observed:
            return f"list_changed during scan {scan.label}"
        s.phase = CatalogPhase.SCANNING_B if scan.label == "A" else CatalogPhase.PUBLISHING
        return None

    def restart(self, reason: str) -> None:
        s = self.s
        s.restarts_total += 1
        s.consecutive_restarts += 1
        s.restart_reasons = (s.restart_reasons + [reason[:300]])[-MAX_REASONS:]
        s.wanted, s.want_reason = True, s.reconciliation_reason or "restart"  # keep the original trigger
        s.phase = CatalogPhase.BACKOFF
        s.detail = f"restarting: {reason[:200]}"

    def backoff_seconds(self) -> float:
        """No delay for the first few restarts in a row, then exponential up to the cap."""
        p = self.s.policy
        over = self.s.consecutive_restarts - p.immediate_restarts
        if over <= 0:
            return 0.0
        return float(min(p.restart_backoff_max_seconds, p.restart_backoff_seconds * 2 ** min(over - 1, 30)))

    def schedule(self, now: datetime, a: ResourceDiscoveryScanV1, b: ResourceDiscoveryScanV1,
                 random_fraction: float) -> tuple[datetime, float]:
        """(next_review_at, staleness bound in seconds) for a catalog measured by ``a`` and ``b``.

        Jitter only shortens the interval, so the next review never comes later than the published
        bound promises. The bound runs from scan A's first request (the oldest information in the
        catalog) to the next review, plus the time the next reconciliation may take (twice this window,
        at least the policy's allowance): by then a newer catalog replaces this one, lost notifications
        or not."""
        p = self.s.policy
        interval = p.rescan_seconds_with_list_changed if self.s.list_changed_capable else p.rescan_seconds
        delay = interval * (1.0 - p.jitter_fraction * random_fraction)
        next_review = now + timedelta(seconds=delay)
        started = a.first_request_at or now
        window = max(0.0, ((b.completed_at or now) - started).total_seconds())
        allowance = max(2 * window, p.reconcile_allowance_seconds)
        bound = (next_review - started).total_seconds() + allowance
        return next_review, round(bound, 3)

    def published(self, catalog: CatalogSnapshot, b: ResourceDiscoveryScanV1) -> None:
        s = self.s
        s.last_catalog = catalog
        s.catalogs_published += 1
        s.published_from = s.reconciliations_started
        s.published_reason = s.reconciliation_reason
        s.consecutive_restarts = 0
        s.covered = max(s.covered, (b.session_generation, b.list_changed_after))
        s.phase = CatalogPhase.IDLE
        s.detail = ""
        if s.list_changed_seen.get(b.session_generation, 0) > b.list_changed_after:
            self.request("list_changed")  # arrived after scan B: coalesce into one follow-up

    def seconds_until_review(self, now: datetime) -> float:
        c = self.s.last_catalog
        if c is None:
            return 0.0
        return max(0.0, (c.next_review_at - now).total_seconds())

    # -- views -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        s = self.s
        if s.phase == CatalogPhase.IDLE and s.last_catalog is not None:
            return s.last_catalog.status.value
        return s.phase.value

    def view(self) -> CatalogView:
        fields = {name: getattr(self.s, name) for name in CatalogView.model_fields if name != "status"}
        return CatalogView(status=self.status, **fields)
