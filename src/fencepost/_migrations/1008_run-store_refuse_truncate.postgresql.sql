-- A TRUNCATE of the runs or of their change rows is refused (PostgreSQL).
-- TRUNCATE fires none of the INSERT/UPDATE/DELETE triggers: a raw TRUNCATE flows_runs removed every
-- run without a tombstone or a revision, the change table kept live rows for runs that no longer
-- existed, and every reader of snapshots (read, the feed's snapshots, followers, projection
-- builders) failed on them for good. A TRUNCATE of flows_run_changes would empty the feed while the
-- runs stay, unseen by every consumer. DELETE removes runs with their tombstones. Statement level,
-- pinned to this schema (1004); no percent sign (the driver reserves it). SQLite has no TRUNCATE:
-- its DELETE without WHERE fires the row triggers.
CREATE OR REPLACE FUNCTION flows_runs_refuse_truncate_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = 'TRUNCATE of ' || TG_TABLE_NAME || ' is refused: it would skip the change feed''s tombstones and revisions',
        ERRCODE = '55000',
        HINT = 'delete runs with DELETE FROM flows_runs (or store.runs.delete), which writes their tombstones';
END;
$$;
DO $$
DECLARE
    here text := quote_ident(current_schema());
BEGIN
    EXECUTE 'ALTER FUNCTION ' || here || '.flows_runs_refuse_truncate_v1() SET search_path = ' || here || ', pg_temp';
END
$$;
CREATE TRIGGER flows_runs_refuse_truncate_v1 BEFORE TRUNCATE ON flows_runs
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_refuse_truncate_v1();
CREATE TRIGGER flows_run_changes_refuse_truncate_v1 BEFORE TRUNCATE ON flows_run_changes
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_refuse_truncate_v1();
