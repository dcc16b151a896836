-- mcpsync ledger, version 21: one rule for what a subject may see of its own versions.
--
-- A version (a receipt, a listed resource, an outbox event) of subscription ``wf`` -- subject ``s``,
-- server ``srv``, URI ``u`` -- accepted (or written) at ``at`` is visible to its subject when the
-- subscription is not REVOKED and no revocation of it, nor of the subject on that server (that URI
-- or every URI), was recorded at or after ``at``. A whole-subject revoke leaves finished
-- subscriptions (CLOSED, TOMBSTONED, UNSUBSCRIBE_UNKNOWN) in their state: this rule, not the state,
-- is what hides them. Its readers: ``content.released_content`` (content get, serve's read),
-- serve's list, subscribe, listen and events (``activities/visibility.py``), and the
-- ``revocation_scope`` policy below.
--
-- Invoker's rights: a consumer role calling it sees only its own subjects' rows (row-level
-- security on the tables it reads). Every name is schema-qualified and the search path pinned, so
-- a temporary table or a same-named object cannot stand in for a table it reads.
CREATE OR REPLACE FUNCTION public.mcpsync_version_visible(wf text, s text, srv text, u text, at timestamptz)
    RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, public, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM public.subscriptions sub
                       WHERE sub.workflow_id = wf AND sub.state = 'REVOKED')
       AND NOT EXISTS (SELECT 1 FROM public.revocations r
                       WHERE r.workflow_id = wf AND r.recorded_at >= at)
       AND NOT EXISTS (SELECT 1 FROM public.subject_revocations sr
                       WHERE sr.subject = s AND sr.server = srv AND (sr.uri IS NULL OR sr.uri = u)
                         AND sr.recorded_at >= at)
$$;

-- A member of mcpsync_consumer sees no receipt the rule hides (restrictive: on top of the
-- subject scope of migration 016, whatever that policy becomes). Only where the role exists.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mcpsync_consumer') THEN
        DROP POLICY IF EXISTS revocation_scope ON public.resource_versions;
        CREATE POLICY revocation_scope ON public.resource_versions AS RESTRICTIVE FOR SELECT
            TO mcpsync_consumer
            USING (public.mcpsync_version_visible(workflow_id, subject, server, uri, accepted_at));
    END IF;
END $$;
