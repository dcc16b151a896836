-- mcpsync ledger, version 22: the index what is proven about a version is read by (activities/proven.py).
-- The accepted version is the subscription's newest ACCEPTED receipt. Without this index finding it
-- walks back over every receipt since, and a resource re-read without change for weeks has tens of
-- thousands of UNCHANGED ones (measured with 20,000: a served read took 10.5 ms; 1.1 ms with this index and
-- ``verified_at`` read from the row's last receipt).
CREATE INDEX IF NOT EXISTS resource_versions_accepted ON resource_versions (workflow_id, receipt_id)
    WHERE status = 'ACCEPTED';
