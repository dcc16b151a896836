"""Completeness gate: the only way a task that needs complete enumeration gets a catalog.

Contract:
- Cleanup jobs, revocation sweeps and anything else that acts on "every resource of this
  subject on this server" call ``require_complete_catalog``. It returns the URIs of the
  latest reconciled catalog only when that catalog is ``SNAPSHOT_PROVEN`` and still inside
  its published staleness bound; anything else (no catalog yet, ``SNAPSHOT_UNPROVEN``,
  overdue) raises ``CompletenessRefused`` with the reason. There is no override: an
  unproven catalog is fine for display and diffing, never for deciding what is absent.
- Every request is recorded in PostgreSQL (``completeness_consumptions``), granted or not,
  so the release gate ``completeness_consumed_unproven`` is recomputed from the truth.
- ``describe_catalog`` is the read-only view (status, staleness, URIs) for humans and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcpsync.activities.ledger.catalog import CatalogLedger
from mcpsync.workflows.records.catalog import CatalogSnapshot, SnapshotStatus

__all__ = ["CompleteCatalog", "CompletenessRefused", "describe_catalog", "require_complete_catalog"]


class CompletenessRefused(RuntimeError):
    """The catalog cannot serve a completeness task; the message says why and what would fix it."""

    def __init__(self, message: str, catalog: CatalogSnapshot | None) -> None:
        super().__init__(message)
        self.catalog = catalog


@dataclass(frozen=True, slots=True)
class CompleteCatalog:
    """A SNAPSHOT_PROVEN catalog granted to one task (``consumption_id`` is its receipt)."""

    catalog: CatalogSnapshot
    uris: tuple[str, ...]
    consumption_id: int


def _hint(catalog: CatalogSnapshot | None) -> str:
    if catalog is None:
        return "start the CatalogWorkflow ('mcpsync catalog start') and wait for its first reconciliation"
    if catalog.status == SnapshotStatus.SNAPSHOT_UNPROVEN:
        return ("two matching scans are not a snapshot; SNAPSHOT_PROVEN needs a server that negotiates the "
                "io.mcpsync/snapshot extension and binds every page to one snapshot id")
    return "wait for the next reconciliation"


async def require_complete_catalog(catalog_ledger: CatalogLedger, subject: str, server: str, *, task: str,
                                   now: datetime | None = None) -> CompleteCatalog:
    """The complete URI set of (subject, server) for ``task``, or ``CompletenessRefused``."""
    decision = await catalog_ledger.consume_for_completeness(subject, server, task, now=now)
    if not decision.granted:
        raise CompletenessRefused(
            f"completeness task {task!r} refused for {subject}/{server}: {decision.reason}. "
            f"Cleanup and revocation sweeps accept only SNAPSHOT_PROVEN; {_hint(decision.catalog)}.",
            decision.catalog,
        )
    assert decision.catalog is not None and decision.consumption_id is not None
    return CompleteCatalog(decision.catalog, decision.uris, decision.consumption_id)


async def describe_catalog(catalog_ledger: CatalogLedger, subject: str, server: str, *,
                           scans: int = 2) -> dict[str, Any]:
    """Latest catalog, its URIs and the newest scans, as JSON-ready data (never a completeness grant)."""
    catalog = await catalog_ledger.latest_catalog(subject, server)
    return {
        "subject": subject,
        "server": server,
        "catalog": catalog.model_dump(mode="json") if catalog else None,
        "complete": bool(catalog and catalog.status == SnapshotStatus.SNAPSHOT_PROVEN),
        "uris": await catalog_ledger.known_uris(subject, server) if catalog else [],
        "scans": [s.model_dump(mode="json") for s in await catalog_ledger.scans_for(subject, server, scans)],
        "release_gates": await catalog_ledger.release_gates(),
    }
