-- mcpsync ledger, version 24: the indexes retention forgets superseded verification receipts by
-- (activities/ledger/retention.py, docs/decisions/0008-receipt-retention.md).
-- Candidates are old UNCHANGED receipts, found by age; every row that points at a receipt is looked
-- up by the receipt's id, and a subscription's withdrawing outbox rows by its id. The two receipt_id
-- indexes also serve the foreign-key checks a DELETE on resource_versions makes: without them each
-- deleted receipt cost a scan of outbox and of answer_selections.
CREATE INDEX IF NOT EXISTS resource_versions_unchanged_age ON resource_versions (accepted_at)
    WHERE status = 'UNCHANGED';
CREATE INDEX IF NOT EXISTS outbox_receipt ON outbox (receipt_id) WHERE receipt_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_withdrawing ON outbox (workflow_id)
    WHERE event_type IN ('tombstoned', 'revoked', 'closed');
CREATE INDEX IF NOT EXISTS answer_selections_receipt ON answer_selections (receipt_id);
