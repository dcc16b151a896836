-- mcpsync ledger, version 1: the durable truth behind every workflow.
-- Fence rows live here so that a workflow reset, a worker rollback or a
-- continue-as-new can never let an older read overwrite a newer version.

CREATE TABLE IF NOT EXISTS mcp_sessions (
    subject          text        NOT NULL,
    server           text        NOT NULL,
    generation       bigint      NOT NULL,
    edition          text        NOT NULL,
    subscribe        boolean     NOT NULL,
    list_changed     boolean     NOT NULL,
    server_name      text        NOT NULL DEFAULT '',
    server_version   text        NOT NULL DEFAULT '',
    task_queue       text        NOT NULL,
    host_id          text        NOT NULL,
    opened_at        timestamptz NOT NULL DEFAULT now(),
    closed_at        timestamptz,
    PRIMARY KEY (subject, server)
);

CREATE TABLE IF NOT EXISTS mcp_session_history (
    subject          text        NOT NULL,
    server           text        NOT NULL,
    generation       bigint      NOT NULL,
    edition          text        NOT NULL,
    capabilities     jsonb       NOT NULL,
    server_name      text        NOT NULL DEFAULT '',
    server_version   text        NOT NULL DEFAULT '',
    host_id          text        NOT NULL,
    opened_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, server, generation)
);

CREATE TABLE IF NOT EXISTS subscriptions (
    workflow_id             text        PRIMARY KEY,
    subject                 text        NOT NULL,
    server                  text        NOT NULL,
    uri                     text        NOT NULL,
    state                   text        NOT NULL,
    incarnation             text        NOT NULL DEFAULT '',
    session_generation      bigint      NOT NULL DEFAULT 0,
    subscription_generation bigint      NOT NULL DEFAULT 0,
    last_issued_ordinal     bigint      NOT NULL DEFAULT 0,
    last_accepted_ordinal   bigint      NOT NULL DEFAULT 0,
    watermark               bigint      NOT NULL DEFAULT 0,
    close_epoch             bigint      NOT NULL DEFAULT 0,
    close_ordinal           bigint,
    last_accepted_digest    text,
    last_receipt_id         bigint,
    notifications_seen      bigint      NOT NULL DEFAULT 0,
    last_notification_at    timestamptz,
    last_notification_generation bigint,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    UNIQUE (subject, server, uri),
    CHECK (last_accepted_ordinal <= last_issued_ordinal),
    CHECK (watermark <= last_issued_ordinal)
);

CREATE TABLE IF NOT EXISTS read_requests (
    workflow_id             text        NOT NULL REFERENCES subscriptions (workflow_id),
    ordinal                 bigint      NOT NULL,
    request_id              text        NOT NULL UNIQUE,
    session_generation      bigint      NOT NULL,
    subscription_generation bigint      NOT NULL,
    trigger_reason          text        NOT NULL,
    issued_at               timestamptz NOT NULL DEFAULT now(),
    completed_at            timestamptz,
    outcome                 text,
    PRIMARY KEY (workflow_id, ordinal)
);

CREATE TABLE IF NOT EXISTS resource_versions (
    receipt_id              bigserial   PRIMARY KEY,
    workflow_id             text        NOT NULL REFERENCES subscriptions (workflow_id),
    subject                 text        NOT NULL,
    server                  text        NOT NULL,
    uri                     text        NOT NULL,
    mime_type               text,
    content_digest          text,
    size                    bigint      NOT NULL DEFAULT 0,
    read_ordinal            bigint      NOT NULL,
    server_name             text        NOT NULL DEFAULT '',
    server_version          text        NOT NULL DEFAULT '',
    edition                 text        NOT NULL DEFAULT '',
    session_generation      bigint      NOT NULL,
    subscription_generation bigint      NOT NULL,
    request_id              text        NOT NULL,
    trigger_reason          text        NOT NULL,
    status                  text        NOT NULL,
    accepted_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS resource_versions_wf ON resource_versions (workflow_id, receipt_id);
-- One read receipt per ordinal: a retried accept cannot write twice. (A tombstone confirmation
-- is a receipt of its own, bound to the ordinal of the read that saw not-found.)
CREATE UNIQUE INDEX IF NOT EXISTS resource_versions_once ON resource_versions (workflow_id, read_ordinal)
    WHERE status <> 'TOMBSTONED';

CREATE TABLE IF NOT EXISTS outbox (
    outbox_id      bigserial   PRIMARY KEY,
    event_type     text        NOT NULL,
    workflow_id    text        NOT NULL,
    subject        text        NOT NULL,
    server         text        NOT NULL,
    uri            text        NOT NULL,
    receipt_id     bigint      REFERENCES resource_versions (receipt_id),
    content_digest text,
    read_ordinal   bigint,
    detail         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS audit (
    audit_id           bigserial   PRIMARY KEY,
    kind               text        NOT NULL,
    subject            text,
    server             text,
    uri                text,
    workflow_id        text,
    session_generation bigint,
    detail             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS audit_kind ON audit (kind, audit_id);

CREATE TABLE IF NOT EXISTS content_store (
    subject        text        NOT NULL,
    content_digest text        NOT NULL,
    mime_type      text,
    size           bigint      NOT NULL,
    body           bytea       NOT NULL,
    stored_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, content_digest)
);

-- Every revocation: where it came from, when access ended, and when the outbox said so.
CREATE TABLE IF NOT EXISTS revocations (
    revocation_id  bigserial   PRIMARY KEY,
    workflow_id    text        NOT NULL,
    subject        text        NOT NULL,
    server         text        NOT NULL,
    uri            text        NOT NULL,
    source         text        NOT NULL,
    reason         text        NOT NULL,
    effective_at   timestamptz NOT NULL,
    outbox_id      bigint      REFERENCES outbox (outbox_id),
    purged_bodies  int         NOT NULL DEFAULT 0,
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Exactly one ingress owns the MCP session of a (subject, server) at a time.
CREATE TABLE IF NOT EXISTS session_leases (
    subject      text        NOT NULL,
    server       text        NOT NULL,
    holder       text        NOT NULL,
    lease_until  timestamptz NOT NULL,
    epoch        bigint      NOT NULL DEFAULT 1,
    PRIMARY KEY (subject, server)
);
