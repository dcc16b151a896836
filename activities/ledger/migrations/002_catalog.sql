-- mcpsync ledger, version 2: catalog reconciliation.
-- resourceDiscoveryScan.v1 rows (never a cursor: keyed digests only), reconciled catalogs
-- (two matching scans, each row re-verifiable against them), the known set per
-- (subject, server) and its changes, completeness consumption receipts, staged rollout.

CREATE TABLE IF NOT EXISTS discovery_scans (
    scan_id                text        PRIMARY KEY,
    reconciliation_id      text        NOT NULL,
    label                  text        NOT NULL CHECK (label IN ('A', 'B')),
    subject                text        NOT NULL,
    server                 text        NOT NULL,
    session_generation     bigint      NOT NULL,
    edition                text        NOT NULL DEFAULT '',
    status                 text        NOT NULL,
    first_request_at       timestamptz,
    completed_at           timestamptz,
    page_count             integer     NOT NULL DEFAULT 0,
    resource_count         integer     NOT NULL DEFAULT 0,
    template_count         integer     NOT NULL DEFAULT 0,
    page_cursor_digests    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    uri_set_digest         text,
    descriptor_set_digest  text,
    template_set_digest    text,
    list_changed_before    bigint      NOT NULL DEFAULT 0,
    list_changed_after     bigint      NOT NULL DEFAULT 0,
    notifications_observed bigint      NOT NULL DEFAULT 0,
    snapshot               jsonb       NOT NULL DEFAULT '{}'::jsonb,
    problems               jsonb       NOT NULL DEFAULT '[]'::jsonb,
    recorded_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS discovery_scans_view ON discovery_scans (subject, server, recorded_at);

-- The descriptors one scan listed; kept only until the next catalog of the view is published.
CREATE TABLE IF NOT EXISTS discovery_scan_items (
    scan_id            text  NOT NULL REFERENCES discovery_scans (scan_id) ON DELETE CASCADE,
    kind               text  NOT NULL CHECK (kind IN ('resource', 'template')),
    ident              text  NOT NULL,  -- URI or URI template, exactly as listed
    descriptor         jsonb NOT NULL,
    descriptor_digest  text  NOT NULL,
    PRIMARY KEY (scan_id, kind, ident)
);

CREATE TABLE IF NOT EXISTS resource_catalogs (
    catalog_id              bigserial        PRIMARY KEY,
    subject                 text             NOT NULL,
    server                  text             NOT NULL,
    reconciliation_id       text             NOT NULL UNIQUE,
    scan_a                  text             NOT NULL REFERENCES discovery_scans (scan_id),
    scan_b                  text             NOT NULL REFERENCES discovery_scans (scan_id),
    status                  text             NOT NULL CHECK (status IN ('SNAPSHOT_UNPROVEN', 'SNAPSHOT_PROVEN')),
    status_reason           text             NOT NULL DEFAULT '',
    session_generation      bigint           NOT NULL,
    snapshot_id             text,
    window_started_at       timestamptz      NOT NULL,
    measured_at             timestamptz      NOT NULL,
    staleness_bound_seconds double precision NOT NULL,
    next_review_at          timestamptz      NOT NULL,
    uri_set_digest          text             NOT NULL,
    descriptor_set_digest   text             NOT NULL,
    template_set_digest     text             NOT NULL,
    resource_count          integer          NOT NULL,
    template_count          integer          NOT NULL,
    added                   integer          NOT NULL DEFAULT 0,
    removed                 integer          NOT NULL DEFAULT 0,
    changed                 integer          NOT NULL DEFAULT 0,
    initial                 boolean          NOT NULL DEFAULT false,
    rollout_mode            text             NOT NULL DEFAULT 'all',
    published_at            timestamptz      NOT NULL DEFAULT now(),
    CHECK (scan_a <> scan_b)
);
CREATE INDEX IF NOT EXISTS resource_catalogs_view ON resource_catalogs (subject, server, catalog_id);

-- The known set (an informer's store): one row per URI a view ever listed.
CREATE TABLE IF NOT EXISTS catalog_known (
    subject            text        NOT NULL,
    server             text        NOT NULL,
    uri                text        NOT NULL,
    descriptor         jsonb       NOT NULL,
    descriptor_digest  text        NOT NULL,
    first_catalog_id   bigint      NOT NULL,
    last_catalog_id    bigint      NOT NULL,
    gone_catalog_id    bigint,
    gone_at            timestamptz,
    PRIMARY KEY (subject, server, uri)
);

-- What each catalog changed in the known set: for platform teams (new URIs) and sweeps.
CREATE TABLE IF NOT EXISTS catalog_changes (
    change_id          bigserial   PRIMARY KEY,
    catalog_id         bigint      NOT NULL REFERENCES resource_catalogs (catalog_id),
    subject            text        NOT NULL,
    server             text        NOT NULL,
    uri                text        NOT NULL,
    change             text        NOT NULL CHECK (change IN ('added', 'removed', 'changed')),
    descriptor_digest  text,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS catalog_changes_view ON catalog_changes (subject, server, change_id);
CREATE INDEX IF NOT EXISTS catalog_changes_catalog ON catalog_changes (catalog_id, change);

-- Every completeness task's request, granted or refused, with the catalog it got.
CREATE TABLE IF NOT EXISTS completeness_consumptions (
    consumption_id  bigserial   PRIMARY KEY,
    task            text        NOT NULL,
    subject         text        NOT NULL,
    server          text        NOT NULL,
    catalog_id      bigint      REFERENCES resource_catalogs (catalog_id),
    catalog_status  text,
    granted         boolean     NOT NULL,
    reason          text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS catalog_counters (
    name   text   PRIMARY KEY,
    value  bigint NOT NULL DEFAULT 0
);
INSERT INTO catalog_counters (name) VALUES ('catalog_publish_refused'), ('completeness_refused')
    ON CONFLICT (name) DO NOTHING;

-- Staged rollout per server (absent: 'all'). Switching only writes here: fences, watermarks
-- and close receipts live in `subscriptions` and are never touched by a mode change.
CREATE TABLE IF NOT EXISTS rollout_policies (
    server      text             PRIMARY KEY,
    mode        text             NOT NULL CHECK (mode IN ('shadow', 'percent', 'all')),
    percent     double precision NOT NULL DEFAULT 100 CHECK (percent >= 0 AND percent <= 100),
    updated_at  timestamptz      NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS rollout_history (
    change_id   bigserial        PRIMARY KEY,
    server      text             NOT NULL,
    mode        text             NOT NULL,
    percent     double precision NOT NULL,
    changed_at  timestamptz      NOT NULL DEFAULT now()
);

-- Release gates, recomputed from the truth rather than trusted counters: a catalog row that
-- does not hold up against its two scans, and a granted completeness task whose catalog is
-- not SNAPSHOT_PROVEN. Both must stay 0.
CREATE OR REPLACE VIEW catalog_release_gates AS
SELECT
    (SELECT count(*) FROM resource_catalogs c
        LEFT JOIN discovery_scans a ON a.scan_id = c.scan_a
        LEFT JOIN discovery_scans b ON b.scan_id = c.scan_b
      WHERE NOT COALESCE((
            a.label = 'A' AND b.label = 'B'
        AND a.status = 'COMPLETE' AND b.status = 'COMPLETE'
        AND a.reconciliation_id = c.reconciliation_id AND b.reconciliation_id = c.reconciliation_id
        AND a.subject = c.subject AND b.subject = c.subject AND a.server = c.server AND b.server = c.server
        AND a.session_generation = c.session_generation AND b.session_generation = c.session_generation
        AND a.notifications_observed = 0 AND b.notifications_observed = 0
        AND a.list_changed_before = a.list_changed_after
        AND a.list_changed_after = b.list_changed_before
        AND b.list_changed_before = b.list_changed_after
        AND a.completed_at <= b.first_request_at
        AND a.uri_set_digest = c.uri_set_digest AND b.uri_set_digest = c.uri_set_digest
        AND a.descriptor_set_digest = c.descriptor_set_digest AND b.descriptor_set_digest = c.descriptor_set_digest
        AND a.template_set_digest = c.template_set_digest AND b.template_set_digest = c.template_set_digest
        AND (c.status <> 'SNAPSHOT_PROVEN' OR (
                (a.snapshot ->> 'bound')::boolean AND (b.snapshot ->> 'bound')::boolean
            AND a.snapshot ->> 'snapshot_id' = c.snapshot_id AND b.snapshot ->> 'snapshot_id' = c.snapshot_id))
        ), false)
    ) AS unreconciled_catalogs_accepted,
    (SELECT count(*) FROM completeness_consumptions k
        LEFT JOIN resource_catalogs c ON c.catalog_id = k.catalog_id
      WHERE k.granted AND c.status IS DISTINCT FROM 'SNAPSHOT_PROVEN'
    ) AS completeness_consumed_unproven,
    (SELECT value FROM catalog_counters WHERE name = 'catalog_publish_refused') AS catalog_publish_refused,
    (SELECT value FROM catalog_counters WHERE name = 'completeness_refused') AS completeness_refused;
