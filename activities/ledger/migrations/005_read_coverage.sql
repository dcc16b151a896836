-- mcpsync ledger, version 5: the ingress update counter a read's allocation saw.
-- A retried allocation (same request id, not yet judged) must answer the counter of the
-- ORIGINAL allocation: updates recorded since were not necessarily observed by that read
-- (simulator finding F11). Rows from before this version answer 0: they cover nothing.
ALTER TABLE read_requests ADD COLUMN IF NOT EXISTS notifications_seen bigint NOT NULL DEFAULT 0;
