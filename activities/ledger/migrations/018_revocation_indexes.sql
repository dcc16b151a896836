-- mcpsync ledger, version 18: indexes a revocation's purge looks its rows up by.
-- A revocation deletes a body only when no receipt of another live subscription of the subject
-- names it: that check looks receipts up by (subject, content_digest), and "withdrawn since" looks
-- revocations up by workflow_id. Without these indexes each check read every receipt of the
-- subject, so purging a subject's bodies cost receipts x bodies (3.4 s at 5,000 subscriptions).
CREATE INDEX IF NOT EXISTS resource_versions_digest ON resource_versions (subject, content_digest);
CREATE INDEX IF NOT EXISTS revocations_workflow ON revocations (workflow_id, recorded_at);
