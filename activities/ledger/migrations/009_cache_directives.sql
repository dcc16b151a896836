-- mcpsync ledger, version 9: MCP 2026-07-28 caching directives on receipts (issue 14 part 3).
-- `ttl_ms` / `cache_scope` are what the read result declared (`ttlMs`, `cacheScope`; the SDK fills
-- 0 / 'private' on older editions). Receipts from before this version have NULL: not declared.
-- They are metadata: mcpsync never serves a stored body across subjects whatever the scope
-- (docs/caching.md), and ttlMs only lengthens the poll period of servers without subscribe.
ALTER TABLE resource_versions ADD COLUMN IF NOT EXISTS ttl_ms bigint CHECK (ttl_ms IS NULL OR ttl_ms >= 0);
ALTER TABLE resource_versions ADD COLUMN IF NOT EXISTS cache_scope text
    CHECK (cache_scope IS NULL OR cache_scope IN ('public', 'private'));

-- The resources/list pages of a scan: the shortest ttlMs, and 'private' if any page said so.
ALTER TABLE discovery_scans ADD COLUMN IF NOT EXISTS list_ttl_ms bigint;
ALTER TABLE discovery_scans ADD COLUMN IF NOT EXISTS list_cache_scope text
    CHECK (list_cache_scope IS NULL OR list_cache_scope IN ('public', 'private'));
