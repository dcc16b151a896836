-- mcpsync ledger, version 13: reads at the ingress (issue 12).
-- read_reports: the run that made this subscription ACTIVE mirrors reads the ingress makes itself
-- (signal resource_read). mark_active sets it from runs that took PATCH_READ_CYCLE and clears it from
-- any other, so a run from before that patch is always signalled resource_updated and reads itself
-- (docs/architecture.md "Reads at the ingress"; docs/upgrades.md before rolling a worker back).
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS read_reports boolean NOT NULL DEFAULT false;
