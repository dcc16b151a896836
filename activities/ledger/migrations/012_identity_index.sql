-- mcpsync ledger, version 12: a key lookup reads one row, whatever the planner's statistics.
-- Version 8's index on (subject, server, uri_normalized) shares its leading columns with the
-- UNIQUE (subject, server, uri) key. On a table without statistics (autovacuum off, or a ledger
-- that grew faster than autoanalyze) the planner rated both equally for `WHERE subject AND server
-- AND uri` and could pick the wrong one: every row of the (subject, server) was read and filtered,
-- about 5 ms per lookup at 5,000 subscriptions, on every notification, allocation and accept.
-- The siblings query now matches an expression index that no column predicate can choose, and the
-- key lookups have only the unique index to use (tests/test_ledger_plans.py).
DROP INDEX IF EXISTS subscriptions_uri_normalized;
CREATE INDEX IF NOT EXISTS subscriptions_identity ON subscriptions ((ARRAY[subject, server, uri_normalized]));
