-- mcpsync ledger, version 10: one round trip per read (issue 12).
-- The read cycle (allocate + resources/read + accept in one activity on the session host's queue)
-- names the scheduled activity it runs for (workflow run id / activity id). A retry of that activity
-- is answered with the ticket it already holds, so a retry after a committed accept replays the
-- verdict instead of allocating a second read. NULL for reads allocated on their own.
ALTER TABLE read_requests ADD COLUMN IF NOT EXISTS cycle_id text;
CREATE UNIQUE INDEX IF NOT EXISTS read_requests_cycle_id ON read_requests (cycle_id) WHERE cycle_id IS NOT NULL;
