-- mcpsync ledger, version 14: revocations that cover a whole subject (issue 29, item 1).
-- One row per `revoke(subject, server, uri|*)`: every subscription of the subject on that server
-- (one URI, or all when uri IS NULL), finished ones (CLOSED, UNSUBSCRIBE_UNKNOWN, TOMBSTONED)
-- included. content.released_content refuses any receipt of the subject on that server accepted
-- at or before recorded_at, whatever its subscription's state; the same transaction purges every
-- body those receipts name and writes the outbox `revoked` rows (docs/security.md).
CREATE TABLE IF NOT EXISTS subject_revocations (
    subject_revocation_id bigserial   PRIMARY KEY,
    subject               text        NOT NULL,
    server                text        NOT NULL,
    uri                   text,                       -- NULL: every URI of the subject on the server
    source                text        NOT NULL,
    reason                text        NOT NULL,
    effective_at          timestamptz NOT NULL,
    receipt_ids           bigint[]    NOT NULL DEFAULT '{}',
    workflow_ids          text[]      NOT NULL DEFAULT '{}', -- the subscriptions it covered
    purged_bodies         int         NOT NULL DEFAULT 0,
    recorded_at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS subject_revocations_subject ON subject_revocations (subject, server, recorded_at);
