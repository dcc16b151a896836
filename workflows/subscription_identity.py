"""Catalog words and identity conflicts: how a subscription run acts on them.

Contract:
- ``CatalogAndIdentity`` is the part of ``SubscriptionProgram`` (its base class) that handles a
  reconciled catalog's word (``catalog_reconciled``: confirm a tombstone, a recreated resource,
  or a verification read when the word cannot be believed) and RECONCILIATION_REQUIRED (enter it
  on an identity conflict, leave it on catalog evidence, a ``resume`` or its time bound).
- It uses the program's state and plumbing (declared below for the type checker); its commands
  are part of the program's, in the same order (replay).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from mcpsync.workflows.names import Act
from mcpsync.workflows.program_runtime import Runtime, WaitKind
from mcpsync.workflows.records.ledger import FenceSnapshot, SetStateRequest
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    IdentityConflict,
    ResumeRequest,
    RevokeRequest,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
    TombstoneRequest,
)
from mcpsync.workflows.subscription_state import SubscriptionFence

__all__ = ["CatalogAndIdentity"]

T = TypeVar("T")

S = SubscriptionState


class CatalogAndIdentity:
    rt: Runtime
    fence: SubscriptionFence
    key: SubscriptionKey
    options: SubscriptionOptions
    catalog: CatalogObservation | None
    conflict: IdentityConflict | None
    resume_requested: ResumeRequest | None
    revocation: RevokeRequest | None

    if TYPE_CHECKING:  # the program's plumbing
        async def _ledger(self, name: str, arg: Any, result_type: type[T]) -> T: ...
        async def _audit(self, kind: str, session_generation: int | None,
                         detail: dict[str, str | int | None]) -> None: ...
        async def _wait(self, condition: Any, timeout: timedelta | None, kind: WaitKind) -> bool: ...
        def _publish(self) -> None: ...

    async def _apply_catalog(self) -> None:
        obs, self.catalog = self.catalog, None
        assert obs is not None
        before = self.fence.s.state
        if before == S.RECONCILIATION_REQUIRED:
            if self.fence.identity_evidence(listed=obs.listed, measured_at=obs.measured_at):
                await self._resume("IDENTITY_RECONCILED", {
                    "scan_id": obs.scan_id, "snapshot_status": obs.snapshot_status,
                    "measured_at": str(obs.measured_at), "variants": ", ".join(obs.variants)[:500]},
                    detail=f"identity reconciled by catalog {obs.scan_id}"
                           + (f" (ambiguous listed pair: {obs.variants[0][:200]})" if obs.variants else ""))
            return
        proven = obs.snapshot_status == "SNAPSHOT_PROVEN"
        stale = self.fence.catalog_word_is_stale(listed=obs.listed, measured_at=obs.measured_at)
        if before == S.ACTIVE and not obs.listed and (not proven or stale):
            # An unproven catalog cannot revoke, nor can one measured before a read of ours saw
            # content: either earns a read of the exact URI, which will tell.
            self.fence.poll_due()
            why = "measured before our last read saw content" if stale else "unproven"
            self.fence.explain(f"not listed in catalog {obs.scan_id} ({why}): verifying by read")
            self._publish()
            return
        if not (before == S.TOMBSTONE_PENDING or (before == S.ACTIVE and not obs.listed)):
            return  # the catalog agrees with us: nothing to confirm, no read to spend
        if stale:
            return  # measured before our read saw not-found: it cannot say the URI came back
        snap = await self._ledger(Act.CONFIRM_TOMBSTONE,
                                  TombstoneRequest(key=self.key, listed=obs.listed, scan_id=obs.scan_id,
                                                   proven=proven),
                                  FenceSnapshot)
        if before == S.TOMBSTONE_PENDING and snap.state == S.ACTIVE:
            self.fence.resumed(snap)  # deleted and recreated: read it again before trusting anything
        else:
            self.fence.adopt(snap)
        self.fence.explain(f"catalog {obs.snapshot_status} scan {obs.scan_id}: listed={obs.listed}")
        self._publish()

    async def _enter_reconciliation(self) -> None:
        conflict, self.conflict = self.conflict, None
        assert conflict is not None
        if self.fence.variant_already_reconciled(conflict.observed_uri):
            await self._audit("NORMALIZED_URI_MATCH_ALREADY_RECONCILED", conflict.session_generation,
                              {"observed_uri": conflict.observed_uri[:500]})
            self._publish()
            return
        if not self.fence.identity_conflict(f"identity conflict: {conflict.reason}", now=self.rt.now(),
                                            observed_uri=conflict.observed_uri[:2048]):
            return
        allowed = [S.ACTIVE, S.SUBSCRIBING, S.DISCOVERED, S.TOMBSTONE_PENDING]
        snap = await self._ledger(Act.SET_STATE, SetStateRequest(
            key=self.key, state=S.RECONCILIATION_REQUIRED, allowed_from=allowed), FenceSnapshot)
        self.fence.adopt(snap)
        await self._audit("RECONCILIATION_REQUIRED", conflict.session_generation,
                          {"observed_uri": conflict.observed_uri[:500], "reason": conflict.reason[:200]})
        self._publish()

    async def _await_reconciliation(self) -> None:
        """RECONCILIATION_REQUIRED until a resume, a close or revocation, catalog evidence (handled by
        the loop's catalog step) or its time bound: then resume."""
        def over() -> bool:
            return (self.resume_requested is not None or self.fence.s.close_requested
                    or self.revocation is not None or self.catalog is not None
                    or self.fence.s.state != S.RECONCILIATION_REQUIRED)

        due = self.fence.reconciliation_deadline(self.rt.now(), self.options.reconciliation_max_seconds)
        timeout = due - self.rt.now()
        if timeout > timedelta(0):
            timed_out = not await self._wait(over, timeout, WaitKind.RECONCILIATION)
        else:
            timed_out = not over()
        if timed_out:
            max_seconds = self.options.reconciliation_max_seconds
            await self._resume(
                "RECONCILIATION_TIMED_OUT",
                {"since": str(self.fence.s.reconciliation_since), "max_seconds": int(max_seconds)},
                detail=f"reconciliation timed out after {max_seconds:.0f} s without catalog evidence: "
                       "resumed, re-reading the exact URI")
            return
        if self.resume_requested is not None:
            await self._resume()

    async def _resume(self, audit_kind: str | None = None,
                      evidence: dict[str, str | int | None] | None = None, *, detail: str = "") -> None:
        """Back to ACTIVE (a fresh read first); ``audit_kind`` records why, with its evidence."""
        snap = await self._ledger(Act.SET_STATE, SetStateRequest(
            key=self.key, state=S.ACTIVE, allowed_from=[S.RECONCILIATION_REQUIRED]), FenceSnapshot)
        self.fence.resumed(snap, detail)
        self.resume_requested = None
        if audit_kind is not None:
            await self._audit(audit_kind, self.fence.s.session_generation, evidence or {})
        self._publish()
