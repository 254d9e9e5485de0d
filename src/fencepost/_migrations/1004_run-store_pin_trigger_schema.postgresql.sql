-- Pin every trigger function to the schema it was created in (PostgreSQL).
-- A PL/pgSQL function resolves unqualified table names through the search_path of the session
-- that fires it, not the schema it lives in. A raw UPDATE "<schema>".flows_runs from a session with
-- another search_path therefore failed (flows_run_source not found) or, worse, advanced the
-- revision and wrote the change row of whatever store that path named. With search_path set on the
-- function itself, each trigger only ever sees its own schema; pg_temp is listed last so a
-- temporary table cannot shadow a store table (pg_catalog is always searched first).
-- (Built with quote_ident and ||: the driver reserves the percent sign.)
DO $$
DECLARE
    here text := quote_ident(current_schema());
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'flows_runs_revision_stmt_v1()',
        'flows_runs_identity_immutable_fn()',
        'flows_journal_events_append_only_v1()'
    ] LOOP
        EXECUTE 'ALTER FUNCTION ' || here || '.' || fn || ' SET search_path = ' || here || ', pg_temp';
    END LOOP;
    -- The per-row revision function of 1002 no longer backs a trigger (1003 replaced it); pin it too
    -- in case something still calls it.
    IF to_regprocedure(here || '.flows_runs_revision_fn()') IS NOT NULL THEN
        EXECUTE 'ALTER FUNCTION ' || here || '.flows_runs_revision_fn() SET search_path = ' || here || ', pg_temp';
    END IF;
END
$$;
