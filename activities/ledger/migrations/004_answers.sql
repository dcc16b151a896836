-- mcpsync ledger, version 4: the answer freshness gate (seed 004).
-- Which observations an answer draft was bound to, which one the host's answering step
-- selected per dependency, and every disposition (HOLD / ACCEPT) the gate gave, in order.
-- Receipt ids and digests only: no resource body is ever stored here.

CREATE TABLE IF NOT EXISTS answer_bindings (
    answer_id     text        NOT NULL,
    revision      integer     NOT NULL CHECK (revision > 0),
    request_id    text        NOT NULL UNIQUE,      -- idempotency key of the bind
    workflow_id   text        NOT NULL,
    question      text        NOT NULL,
    dependencies  jsonb       NOT NULL,             -- [{subject, server, uri, receipt_id}]
    bound_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (answer_id, revision)
);

CREATE TABLE IF NOT EXISTS answer_selections (
    selection_id  bigserial   PRIMARY KEY,
    answer_id     text        NOT NULL,
    revision      integer     NOT NULL,
    request_id    text        NOT NULL,             -- idempotency key (a bind writes one row per dependency)
    subject       text        NOT NULL,
    server        text        NOT NULL,
    uri           text        NOT NULL,
    receipt_id    bigint      NOT NULL REFERENCES resource_versions (receipt_id),
    source        text        NOT NULL CHECK (source IN ('bound', 'host')),
    selected_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (request_id, uri),
    FOREIGN KEY (answer_id, revision) REFERENCES answer_bindings (answer_id, revision)
);
CREATE INDEX IF NOT EXISTS answer_selections_latest ON answer_selections (answer_id, revision, uri, selection_id);

CREATE TABLE IF NOT EXISTS answer_dispositions (
    disposition_id bigserial   PRIMARY KEY,
    answer_id      text        NOT NULL,
    revision       integer     NOT NULL,
    sequence       integer     NOT NULL,
    request_id     text        NOT NULL UNIQUE,
    verdict        text        NOT NULL CHECK (verdict IN ('HOLD', 'ACCEPT')),
    reason_code    text        NOT NULL,
    reason         text        NOT NULL,
    reopened       boolean     NOT NULL DEFAULT false,
    receipt_ids    bigint[]    NOT NULL DEFAULT '{}',
    evidence_from  timestamptz,
    evidence_to    timestamptz,
    checked_at     timestamptz NOT NULL,
    disposition    jsonb       NOT NULL,            -- the whole answerDisposition.v1 record
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (answer_id, sequence),
    FOREIGN KEY (answer_id, revision) REFERENCES answer_bindings (answer_id, revision),
    CHECK (verdict = 'HOLD' OR (evidence_from IS NOT NULL AND evidence_to IS NOT NULL))
);
