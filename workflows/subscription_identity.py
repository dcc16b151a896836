"""Catalog words and identity conflicts: how a subscription run acts on them.

Contract:
- ``CatalogAndIdentity`` is one object of a ``SubscriptionProgram`` (``program.identity``) that handles a
  reconciled catalog's word (``catalog_reconciled``: confirm a tombstone, a recreated resource,
  or a verification read when the word cannot be believed) and RECONCILIATION_REQUIRED (enter it
  on an identity conflict, leave it on catalog evidence, a ``resume`` or its time bound).
- Its own fields are the words the handlers leave for the main loop (``catalog``, ``conflict``,
  ``resume_requested``); it acts through the program's fence, interpreter and plumbing (ledger calls,
  audit, waits, publishing), so its commands are part of the program's, in the same order (replay).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from mcpsync.workflows.interpreter import WaitKind
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import FenceSnapshot, SetStateRequest
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    IdentityConflict,
    ResumeRequest,
    SubscriptionState,
    TombstoneRequest,
)

if TYPE_CHECKING:
    from mcpsync.workflows.subscription_program import SubscriptionProgram

__all__ = ["CatalogAndIdentity"]

S = SubscriptionState


class CatalogAndIdentity:
    """The catalog's word and identity reconciliation of one program run (the module's contract)."""

    def __init__(self, program: SubscriptionProgram) -> None:
        self.program = program
        self.catalog: CatalogObservation | None = None  # latest catalog word, handled by the main loop
        self.conflict: IdentityConflict | None = None
        self.resume_requested: ResumeRequest | None = None

    async def apply_catalog(self) -> None:
        p, fence = self.program, self.program.fence
        obs, self.catalog = self.catalog, None
        assert obs is not None
        before = fence.s.state
        if before == S.RECONCILIATION_REQUIRED:
            if fence.identity_evidence(listed=obs.listed, measured_at=obs.measured_at):
                await self.resume("IDENTITY_RECONCILED", {
                    "scan_id": obs.scan_id, "snapshot_status": obs.snapshot_status,
                    "measured_at": str(obs.measured_at), "variants": ", ".join(obs.variants)[:500]},
                    detail=f"identity reconciled by catalog {obs.scan_id}"
                           + (f" (ambiguous listed pair: {obs.variants[0][:200]})" if obs.variants else ""))
            return
        proven = obs.snapshot_status == "SNAPSHOT_PROVEN"
        stale = fence.catalog_word_is_stale(listed=obs.listed, measured_at=obs.measured_at)
        if before == S.ACTIVE and not obs.listed and (not proven or stale):
            # An unproven catalog cannot revoke, nor can one measured before a read of ours saw
            # content: either earns a read of the exact URI, which will tell.
            fence.poll_due()
            why = "measured before our last read saw content" if stale else "unproven"
            fence.explain(f"not listed in catalog {obs.scan_id} ({why}): verifying by read")
            p._publish()
            return
        if not (before == S.TOMBSTONE_PENDING or (before == S.ACTIVE and not obs.listed)):
            return  # the catalog agrees with us: nothing to confirm, no read to spend
        if stale:
            return  # measured before our read saw not-found: it cannot say the URI came back
        word = TombstoneRequest(key=p.key, listed=obs.listed, scan_id=obs.scan_id, proven=proven)
        snap = await p._ledger(Act.CONFIRM_TOMBSTONE, word, FenceSnapshot)
        if before == S.TOMBSTONE_PENDING and snap.state == S.ACTIVE:
            fence.resumed(snap)  # deleted and recreated: read it again before trusting anything
        else:
            fence.adopt(snap)
        fence.explain(f"catalog {obs.snapshot_status} scan {obs.scan_id}: listed={obs.listed}")
        p._publish()

    async def enter_reconciliation(self) -> None:
        p, fence = self.program, self.program.fence
        conflict, self.conflict = self.conflict, None
        assert conflict is not None
        if fence.variant_already_reconciled(conflict.observed_uri):
            await p._audit("NORMALIZED_URI_MATCH_ALREADY_RECONCILED", conflict.session_generation,
                           {"observed_uri": conflict.observed_uri[:500]})
            p._publish()
            return
        if not fence.identity_conflict(f"identity conflict: {conflict.reason}", now=p.rt.now(),
                                       observed_uri=conflict.observed_uri[:2048]):
            return
        allowed = [S.ACTIVE, S.SUBSCRIBING, S.DISCOVERED, S.TOMBSTONE_PENDING]
        snap = await p._ledger(Act.SET_STATE, SetStateRequest(
            key=p.key, state=S.RECONCILIATION_REQUIRED, allowed_from=allowed), FenceSnapshot)
        fence.adopt(snap)
        await p._audit("RECONCILIATION_REQUIRED", conflict.session_generation,
                       {"observed_uri": conflict.observed_uri[:500], "reason": conflict.reason[:200]})
        p._publish()

    async def await_reconciliation(self) -> None:
        """RECONCILIATION_REQUIRED until a resume, a close or revocation, catalog evidence (handled by
        the loop's catalog step) or its time bound: then resume."""
        p, fence = self.program, self.program.fence

        def over() -> bool:
            return (self.resume_requested is not None or fence.s.close_requested
                    or p.revocation is not None or self.catalog is not None
                    or fence.s.state != S.RECONCILIATION_REQUIRED)

        due = fence.reconciliation_deadline(p.rt.now(), p.options.reconciliation_max_seconds)
        timeout = due - p.rt.now()
        if timeout > timedelta(0):
            timed_out = not await p._wait(over, timeout, WaitKind.RECONCILIATION)
        else:
            timed_out = not over()
        if timed_out:
            max_seconds = p.options.reconciliation_max_seconds
            await self.resume(
                "RECONCILIATION_TIMED_OUT",
                {"since": str(fence.s.reconciliation_since), "max_seconds": int(max_seconds)},
                detail=f"reconciliation timed out after {max_seconds:.0f} s without catalog evidence: "
                       "resumed, re-reading the exact URI")
            return
        if self.resume_requested is not None:
            await self.resume()

    async def resume(self, audit_kind: str | None = None,
                     evidence: dict[str, str | int | None] | None = None, *, detail: str = "") -> None:
        """Back to ACTIVE (a fresh read first); ``audit_kind`` records why, with its evidence."""
        p, fence = self.program, self.program.fence
        snap = await p._ledger(Act.SET_STATE, SetStateRequest(
            key=p.key, state=S.ACTIVE, allowed_from=[S.RECONCILIATION_REQUIRED]), FenceSnapshot)
        fence.resumed(snap, detail)
        self.resume_requested = None
        if audit_kind is not None:
            await p._audit(audit_kind, fence.s.session_generation, evidence or {})
        p._publish()
