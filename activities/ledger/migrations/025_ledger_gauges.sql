-- mcpsync ledger, version 25: the counts and the time the Prometheus gauges show live on the fence row
-- (activities/ledger/metrics.py, docs/metrics.md), so that a refresh reads ``subscriptions`` and never
-- the history tables. The transactions that already write the row keep them:
--   reads_granted    the read allocations granted (read_requests rows ever inserted); the allocation
--                    batch writes it (activities/ledger/read_batches.py);
--   receipt_counts   the receipts written, by status ({"ACCEPTED": n, ...}); the plan statement that
--                    inserts a receipt writes it (activities/ledger/plan_writes.py, store.row_updates);
--   content_read_at  the allocation time of the read of the newest receipt that saw content (ACCEPTED
--                    or UNCHANGED); the same statement writes it.
-- They are totals since the subscription began: retention (``mcpsync prune``) deletes rows, never
-- counts. The rows written before this version are counted here, from the history still present.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS reads_granted bigint NOT NULL DEFAULT 0;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS receipt_counts jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS content_read_at timestamptz;
UPDATE subscriptions s SET reads_granted = r.n
  FROM (SELECT workflow_id, count(*) AS n FROM read_requests GROUP BY workflow_id) r
 WHERE r.workflow_id = s.workflow_id;
UPDATE subscriptions s SET receipt_counts = c.counts
  FROM (SELECT workflow_id, jsonb_object_agg(status, n) AS counts
          FROM (SELECT workflow_id, status, count(*) AS n FROM resource_versions
                 GROUP BY workflow_id, status) per_status
         GROUP BY workflow_id) c
 WHERE c.workflow_id = s.workflow_id;
-- The receipt's own time where retention already deleted its read.
UPDATE subscriptions s SET content_read_at = v.at
  FROM (SELECT DISTINCT ON (rv.workflow_id) rv.workflow_id, coalesce(r.issued_at, rv.accepted_at) AS at
          FROM resource_versions rv
          LEFT JOIN read_requests r ON r.workflow_id = rv.workflow_id AND r.ordinal = rv.read_ordinal
         WHERE rv.status IN ('ACCEPTED', 'UNCHANGED')
         ORDER BY rv.workflow_id, rv.receipt_id DESC) v
 WHERE v.workflow_id = s.workflow_id;
