-- mcpsync ledger, version 6: a gap-free outbox with durable consumers (docs/outbox.md).
--
-- outbox_id is a bigserial: taken at INSERT, not at COMMIT, so two transactions can commit
-- out of id order and a reader paging by "outbox_id > last" can skip a row for good.
-- Consumers therefore page by "position", a dense number stamped lazily and only on rows
-- whose inserting transaction has finished (txid below the xmin of a fresh snapshot):
-- such a row can never newly appear, so once a position is stamped nothing can appear
-- below it. Stamping is serialized by the lock on the outbox_state row.

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS position bigint UNIQUE;
CREATE INDEX IF NOT EXISTS outbox_unstamped ON outbox (txid, outbox_id) WHERE position IS NULL;
CREATE INDEX IF NOT EXISTS outbox_created ON outbox (created_at);

-- One row: the last stamped position (positions never repeat, even after every row is pruned)
-- and the highest position retention has deleted (a consumer below it has a gap).
CREATE TABLE IF NOT EXISTS outbox_state (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_position   bigint  NOT NULL DEFAULT 0,
    pruned_through  bigint  NOT NULL DEFAULT 0
);
INSERT INTO outbox_state (singleton) VALUES (true) ON CONFLICT DO NOTHING;

-- Named durable consumers (activities/outbox.py).
CREATE TABLE IF NOT EXISTS outbox_consumers (
    name             text        PRIMARY KEY,
    subjects         text[],                       -- NULL: every subject
    position         bigint      NOT NULL DEFAULT 0, -- acknowledged: everything at or below is done
    delivered_up_to  bigint      NOT NULL DEFAULT 0, -- highest batch position handed out
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_poll_at     timestamptz,
    last_ack_at      timestamptz,
    last_resync_at   timestamptz,
    CHECK (position <= delivered_up_to)
);

-- Stamp positions on every finished, unstamped row; returns the last stamped position.
-- Must run in READ COMMITTED: after waiting for the state row lock, each statement must see
-- the stamps and rows the previous stamper committed.
CREATE OR REPLACE FUNCTION outbox_stamp() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    top bigint;
    horizon xid8;
    stamped bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox_stamp() needs READ COMMITTED isolation';
    END IF;
    SELECT last_position INTO top FROM outbox_state WHERE singleton FOR UPDATE;
    -- Every transaction below the horizon has finished: its rows are visible now or never.
    horizon := pg_snapshot_xmin(pg_current_snapshot());
    WITH ready AS (
        SELECT outbox_id, row_number() OVER (ORDER BY txid, outbox_id) AS rn
        FROM outbox WHERE position IS NULL AND txid < horizon
    )
    UPDATE outbox o SET position = top + ready.rn FROM ready WHERE o.outbox_id = ready.outbox_id;
    GET DIAGNOSTICS stamped = ROW_COUNT;
    IF stamped > 0 THEN
        top := top + stamped;
        UPDATE outbox_state SET last_position = top WHERE singleton;
    END IF;
    RETURN top;
END $$;

-- LISTEN mcpsync_outbox: one notification per committed inserting statement, from any writer.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mcpsync_outbox', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Bodies of content_store: how they were read (text / blob / multipart), for content access.
ALTER TABLE content_store ADD COLUMN IF NOT EXISTS kind text;
