-- mcpsync ledger, version 17: level-based coverage owned by the row (docs/decisions/0002).
-- notifications_seen is the row's notification count (notified); covered is the notified value at
-- the allocation of the newest judged read that observed the resource, written by the accept under
-- the row lock and never moved back. The row is dirty while notifications_seen > covered
-- (workflows/coverage.py). Existing rows start at 0: dirty until their next observing read, which
-- can only cost a read, never skip one.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS covered bigint NOT NULL DEFAULT 0;
-- The signal marks (version 11) are replaced by the level: a note creates work only when it makes
-- the row dirty or a read allocated before it is not confirmed (workflows/coverage.plan_note).
-- Nothing reads or writes these columns since this version; 0.2.0 is the first release, so no
-- released ingress writes them.
ALTER TABLE subscriptions DROP COLUMN IF EXISTS signalled_sequence;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS signalled_generation;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS signalled_at;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS allocated_in_cycle;
