-- mcpsync ledger, version 23: the verification schedule lives on the fence row
-- (workflows/verification_rules.py). A scheduled row (ACTIVE with a safety-read period) records its
-- newest verification (a granted read allocation), when the next is due, and when the workflow's
-- watchdog last looked (a gap over the period is reported once, by whoever finds it). The ingress
-- holding the (subject, server) lease sweeps due rows through ``subscriptions_verify_due``; a read that finds
-- nothing new stays here and wakes no workflow.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS verified_at timestamptz;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS verify_due_at timestamptz;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS watched_at timestamptz;
-- Rows scheduled before this version are due at once: the first sweep reads them and arms them.
UPDATE subscriptions SET verify_due_at = now()
 WHERE state = 'ACTIVE' AND safety_read_seconds IS NOT NULL AND verify_due_at IS NULL;
CREATE INDEX IF NOT EXISTS subscriptions_verify_due ON subscriptions (subject, server, verify_due_at)
    WHERE state = 'ACTIVE' AND safety_read_seconds IS NOT NULL;
