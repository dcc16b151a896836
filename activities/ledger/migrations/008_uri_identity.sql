-- mcpsync ledger, version 8: URI identity (issue 14).
-- `uri_normalized` is `workflows.uris.normalize_uri(uri)` (RFC 3986 §6.2.2). It never routes: it
-- only finds the other subscriptions of a (subject, server) whose URI may name the same resource
-- (`Ledger.normalized_siblings`, one indexed query on the ingress hot path). SQL cannot call the
-- Python normalizer, so the ledger writes it where subscription rows are created and
-- `activities.db.migrate` backfills rows that lack it (rows from before this version) in batches.
-- (Numbered 8: 6 and 7 are taken by work on other branches.)
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS uri_normalized text;
CREATE INDEX IF NOT EXISTS subscriptions_uri_normalized ON subscriptions (subject, server, uri_normalized);
-- The backfill finds its work without scanning the table once every row is filled.
CREATE INDEX IF NOT EXISTS subscriptions_uri_unnormalized ON subscriptions (workflow_id)
    WHERE uri_normalized IS NULL;

-- Listed URI pairs of a (subject, server) that normalize alike, flagged once each (the audit row
-- AMBIGUOUS_URI_LISTED is written only when the pair is first seen, not for every catalog).
CREATE TABLE IF NOT EXISTS ambiguous_uri_pairs (
    subject            text        NOT NULL,
    server             text        NOT NULL,
    uri_a              text        NOT NULL,
    uri_b              text        NOT NULL,
    uri_normalized     text        NOT NULL,
    first_catalog_id   bigint      NOT NULL,
    first_scan_id      text        NOT NULL,
    flagged_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, server, uri_a, uri_b),
    CHECK (uri_a < uri_b)
);
