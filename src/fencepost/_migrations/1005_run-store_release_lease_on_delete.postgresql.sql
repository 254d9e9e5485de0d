-- Deleting a run releases its lease in the same transaction (PostgreSQL).
-- A run removed by raw SQL used to leave its flows_consensus_leases row behind: a run recreated
-- under the same id could never be claimed, and the deleted run's owner still passed the journal's
-- fence. Not a foreign key: the journal's fence is usable without a run row (imports, sweepers),
-- so a lease may exist for an id that has no run. Statement level, pinned to this schema (1004).
CREATE OR REPLACE FUNCTION flows_runs_release_lease_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM flows_consensus_leases AS l USING old_rows AS o WHERE l.run_id = o.run_id;
    RETURN NULL;
END;
$$;
DO $$
DECLARE
    here text := quote_ident(current_schema());
BEGIN
    EXECUTE 'ALTER FUNCTION ' || here || '.flows_runs_release_lease_v1() SET search_path = ' || here || ', pg_temp';
END
$$;
CREATE TRIGGER flows_runs_release_lease_v1 AFTER DELETE ON flows_runs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_release_lease_v1();
