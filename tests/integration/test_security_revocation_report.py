"""What a revocation reports it purged is what it deleted: ``subject_revocations.purged_bodies``
and the ``SubjectRevocation`` that ``mcpsync revoke`` prints count every body removed from the
subject's store, by whichever path (a live row's own revocation, or the sweep over the covered
receipts) deleted it."""

from __future__ import annotations

from datetime import UTC, datetime

from mcpsync.activities.ledger import Ledger
from tests.conftest import ledger_rows
from tests.integration.test_security_rls import _accepted


async def test_revoke_reports_the_bodies_the_per_row_path_purged(ledger: Ledger) -> None:
    key, _, _ = await _accepted(ledger, "first body")
    await _accepted(ledger, "second body", key.subject)
    stored = await ledger_rows(ledger, "SELECT count(*) FROM content_store WHERE subject = %s", key.subject)
    assert stored == [(2,)]

    rec = await ledger.fence.revoke_subject(key.subject, key.server, None, reason="test",
                                            effective_at=datetime.now(UTC))

    assert len(rec.revoked) == 2, "both rows were live: each revoked by the per-row path"
    assert await ledger_rows(ledger, "SELECT count(*) FROM content_store WHERE subject = %s",
                             key.subject) == [(0,)]
    assert rec.purged_bodies == 2
    assert await ledger_rows(ledger, "SELECT purged_bodies FROM subject_revocations"
                             " WHERE subject_revocation_id = %s", rec.subject_revocation_id) == [(2,)]
