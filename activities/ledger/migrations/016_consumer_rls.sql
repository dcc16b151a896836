-- mcpsync ledger, version 16: a consumer role with row-level security by subject (issue 29 item 8).
--
-- Without it the trust boundary for content is the ledger URL: whoever connects can read every
-- subject's receipts, outbox rows and bodies. For a consumer that must see one subject only, an
-- operator creates a login role, makes it a member of mcpsync_consumer and maps it to its
-- subjects (docs/security.md):
--     CREATE ROLE indexer_team_a LOGIN PASSWORD '...';
--     GRANT mcpsync_consumer TO indexer_team_a;
--     INSERT INTO consumer_subjects (role_name, subject) VALUES ('indexer_team_a', 'team-a');
-- Members of mcpsync_consumer see only rows of their mapped subjects, in every table below.
-- Every other role is unaffected: the tables' owner and superusers bypass row-level security,
-- and the policies let any role that is not a member of mcpsync_consumer see and write every
-- row (a deployment whose worker role does not own the tables keeps working).

CREATE TABLE IF NOT EXISTS consumer_subjects (
    role_name text NOT NULL,
    subject   text NOT NULL,
    PRIMARY KEY (role_name, subject)
);

-- The role, where this migration may create it (CREATEROLE); else an operator creates it and
-- re-runs the GRANT below (the policies work either way).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mcpsync_consumer') THEN
        BEGIN
            CREATE ROLE mcpsync_consumer NOLOGIN;
        EXCEPTION
            WHEN duplicate_object THEN NULL;  -- another database's migration created it meanwhile
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'mcpsync: cannot create role mcpsync_consumer (needs CREATEROLE): see docs/security.md';
                RETURN;
        END;
    END IF;
    GRANT SELECT ON subscriptions, resource_versions, outbox, content_store, revocations, subject_revocations
        TO mcpsync_consumer;
END $$;

-- Is ``who`` (the policy passes current_user) allowed to see rows of subject ``s``? Every role but a
-- member of mcpsync_consumer: yes; a member: only its mapped subjects. Definer's rights, so no
-- role needs a grant on consumer_subjects (consumers cannot read the mapping); the search path is
-- the migration's. CASE: pg_has_role fails for a role that does not exist.
CREATE OR REPLACE FUNCTION mcpsync_subject_visible(s text, who name) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mcpsync_consumer') THEN true
        WHEN NOT pg_catalog.pg_has_role(who, 'mcpsync_consumer', 'MEMBER') THEN true
        ELSE EXISTS (SELECT 1 FROM consumer_subjects c WHERE c.role_name = who AND c.subject = s)
    END
$$;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['subscriptions', 'resource_versions', 'outbox', 'content_store', 'content_pending',
                             'revocations', 'subject_revocations', 'audit']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS subject_scope ON %I', t);
        EXECUTE format('CREATE POLICY subject_scope ON %I USING (mcpsync_subject_visible(subject, current_user))'
                       ' WITH CHECK (mcpsync_subject_visible(subject, current_user))', t);
    END LOOP;
END $$;
