-- mcpsync ledger, version 11: the ingress coalesces updates it already signalled (issue 12).
-- signalled_*: the newest update whose resource_updated signal Temporal accepted (its update
-- counter, session generation and when). allocated_sequence: the update counter at the newest read
-- allocation. An update recorded while the signalled one is newer than the newest allocation needs
-- no signal of its own: the read the workflow owes is allocated later and covers it
-- (workflows/fence.update_already_signalled; docs/architecture.md "Coalescing at the ingress").
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS signalled_sequence bigint NOT NULL DEFAULT 0;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS signalled_generation bigint NOT NULL DEFAULT 0;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS signalled_at timestamptz;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS allocated_sequence bigint NOT NULL DEFAULT 0;
-- Coalescing applies only while the newest allocation was a read cycle's (runs from before the
-- read cycle drop a follow-up set while their allocation was on its way: they get every signal).
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS allocated_in_cycle boolean NOT NULL DEFAULT false;
