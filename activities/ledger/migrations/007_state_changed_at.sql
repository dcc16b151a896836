-- mcpsync ledger, version 7: when each subscription entered its current state.
-- The metrics endpoint reports how long the oldest subscription has waited in an unresolved
-- state (RECONCILIATION_REQUIRED, TOMBSTONE_PENDING, UNSUBSCRIBE_UNKNOWN, ...). A trigger sets
-- the time on every UPDATE that changes `state`, so no code path of the ledger can forget it and
-- the ledger's SQL stays as it is. Rows from before this version take their `updated_at`.
-- (Numbered 7: 6 is left to the outbox consumer work happening in parallel.)
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS state_changed_at timestamptz;
UPDATE subscriptions SET state_changed_at = updated_at WHERE state_changed_at IS NULL;
ALTER TABLE subscriptions ALTER COLUMN state_changed_at SET DEFAULT now();
ALTER TABLE subscriptions ALTER COLUMN state_changed_at SET NOT NULL;

CREATE OR REPLACE FUNCTION mcpsync_state_changed_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.state_changed_at := now();
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_state_changed_at ON subscriptions;
CREATE TRIGGER subscriptions_state_changed_at
    BEFORE UPDATE OF state ON subscriptions
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION mcpsync_state_changed_at();
