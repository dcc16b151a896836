-- mcpsync ledger, version 19: the safety-read period of a subscribed row, for the ingress's resync.
-- mark_active writes the period the run that subscribed arms its safety reads with (NULL: a polling
-- row, or a run that does not say); the session host reads a URI before that read is due, at the
-- ingress, as if notified (workflows/resync_rules.py), so the workflow's own timer rarely fires.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS safety_read_seconds double precision
    CHECK (safety_read_seconds IS NULL OR safety_read_seconds > 0);
