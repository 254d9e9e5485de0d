-- Pin the change-feed notify trigger function to its schema (PostgreSQL), like 1004 does for the
-- run store's: it must not depend on the search_path of the session that fires it.
DO $$
DECLARE
    here text := quote_ident(current_schema());
BEGIN
    EXECUTE 'ALTER FUNCTION ' || here || '.flows_run_changes_notify_v1() SET search_path = ' || here || ', pg_temp';
END
$$;
