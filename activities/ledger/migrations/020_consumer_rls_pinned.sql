-- mcpsync ledger, version 20: the consumer role's row-level security, closed against name shadowing.
--
-- PostgreSQL resolves an unqualified name through search_path, and searches pg_temp first unless
-- the path lists it; "$user" puts a schema of the role's own name before public. A check that reads
-- consumer_subjects unqualified lets a consumer that creates a temp table of that name map itself
-- to any subject. So:
-- - the check names every relation and function with its schema and pins its search_path to
--   pg_catalog, the ledger's schema, pg_temp (temp last): no role's own table or schema shadows it;
-- - it runs with the caller's rights (SECURITY INVOKER) and asks only about the calling role: a
--   consumer cannot ask whether another role is mapped to a subject. For that every role may select
--   consumer_subjects, and its own policy shows each role only its own mapping;
-- - TEMPORARY on the ledger's database is revoked from PUBLIC where this role may (the database's
--   owner or a superuser); else an operator runs that REVOKE (docs/security.md). The pinned names
--   hold either way.
-- Every other role is unaffected, as in version 16: the tables' owner and superusers bypass
-- row-level security, and a role that is not a member of mcpsync_consumer sees every row.

DO $$
DECLARE
    ledger_schema name := (SELECT n.nspname FROM pg_catalog.pg_class c
                           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                           WHERE c.oid = 'consumer_subjects'::regclass);
    t text;
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %1$I.mcpsync_subject_visible(s text) RETURNS boolean
            LANGUAGE sql STABLE SECURITY INVOKER SET search_path = pg_catalog, %1$I, pg_temp AS $b$
            SELECT CASE
                WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mcpsync_consumer') THEN true
                WHEN NOT pg_catalog.pg_has_role(current_user, 'mcpsync_consumer', 'MEMBER') THEN true
                ELSE EXISTS (SELECT 1 FROM %1$I.consumer_subjects c
                             WHERE c.role_name = current_user AND c.subject = s)
            END
        $b$ $f$, ledger_schema);

    EXECUTE format('ALTER TABLE %I.consumer_subjects ENABLE ROW LEVEL SECURITY', ledger_schema);
    EXECUTE format('DROP POLICY IF EXISTS own_mapping ON %I.consumer_subjects', ledger_schema);
    EXECUTE format('CREATE POLICY own_mapping ON %I.consumer_subjects FOR SELECT USING (role_name = current_user)',
                   ledger_schema);
    EXECUTE format('GRANT SELECT ON %I.consumer_subjects TO PUBLIC', ledger_schema);

    FOREACH t IN ARRAY ARRAY['subscriptions', 'resource_versions', 'outbox', 'content_store', 'content_pending',
                             'revocations', 'subject_revocations', 'audit']
    LOOP
        EXECUTE format('DROP POLICY IF EXISTS subject_scope ON %I.%I', ledger_schema, t);
        EXECUTE format('CREATE POLICY subject_scope ON %1$I.%2$I USING (%1$I.mcpsync_subject_visible(subject))'
                       ' WITH CHECK (%1$I.mcpsync_subject_visible(subject))', ledger_schema, t);
    END LOOP;
    EXECUTE format('DROP FUNCTION IF EXISTS %I.mcpsync_subject_visible(text, name)', ledger_schema);

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
               AND pg_catalog.pg_has_role(current_user, d.datdba, 'USAGE'))
       OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', pg_catalog.current_database());
    ELSE
        RAISE NOTICE 'mcpsync: cannot revoke TEMPORARY on database % from PUBLIC (not its owner): see docs/security.md',
            pg_catalog.current_database();
    END IF;
END $$;
