-- mcpsync ledger, version 15: a read's body waits here for its accept (issue 29, item 2).
-- A body used to enter content_store when it was read, before the accept judged it, so a read in
-- flight across a revocation stored it again after the purge. Now the accept stores it, in its own
-- transaction and only for a verdict that releases it (ACCEPTED, UNCHANGED). The read cycle hands
-- the body to its accept in memory; only the standalone mcp_read activity (runs from before the
-- read cycle) parks it here, keyed by the read, and the accept takes it out whatever its verdict.
-- Nothing here is ever released; a revocation deletes the rows of what it covers, retention the
-- rows an accept never came for.
CREATE TABLE IF NOT EXISTS content_pending (
    subject        text        NOT NULL,
    server         text        NOT NULL,
    uri            text        NOT NULL,
    read_ordinal   bigint      NOT NULL,
    content_digest text        NOT NULL,
    mime_type      text,
    kind           text,
    body           bytea       NOT NULL,
    staged_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, server, uri, read_ordinal)
);
CREATE INDEX IF NOT EXISTS content_pending_staged ON content_pending (staged_at);
