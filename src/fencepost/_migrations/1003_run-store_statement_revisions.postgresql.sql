-- Statement-level revision triggers on PostgreSQL (same contract as 1002).
-- 1002's per-row triggers update the single flows_run_source row once per changed run. Inside one
-- transaction PostgreSQL keeps every superseded version of that row, and each further update walks
-- the chain of them, so a statement touching N runs (heartbeat_many renewing 10 000 leases) costs
-- O(N^2): measured 2.6 s for 10 000 rows, growing call after call. Here one UPDATE of the source
-- row per statement allocates N consecutive revisions (assigned in run_id order) from the
-- statement's transition table. Every changed row still gets its own revision; an overflow past
-- 2^53-1 still fails the CHECK and refuses the whole mutation; a missing source row still aborts.
DROP TRIGGER IF EXISTS flows_runs_revision_insert ON flows_runs;
DROP TRIGGER IF EXISTS flows_runs_revision_update ON flows_runs;
DROP TRIGGER IF EXISTS flows_runs_revision_delete ON flows_runs;

CREATE OR REPLACE FUNCTION flows_runs_revision_stmt_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed BIGINT;
    top BIGINT;
BEGIN
    IF TG_OP = 'DELETE' THEN
        SELECT count(*) INTO changed FROM old_rows;
    ELSE
        SELECT count(*) INTO changed FROM new_rows;
    END IF;
    IF changed = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE flows_run_source SET revision = revision + changed WHERE singleton = 1
        RETURNING revision INTO top;
    IF top IS NULL THEN
        RAISE EXCEPTION 'execution source identity is missing' USING ERRCODE = '23514';
    END IF;
    IF TG_OP = 'DELETE' THEN
        INSERT INTO flows_run_changes (run_id, revision, deleted)
            SELECT run_id, top - changed + row_number() OVER (ORDER BY run_id), 1 FROM old_rows
            ON CONFLICT (run_id) DO UPDATE SET revision = EXCLUDED.revision, deleted = EXCLUDED.deleted;
    ELSE
        INSERT INTO flows_run_changes (run_id, revision, deleted)
            SELECT run_id, top - changed + row_number() OVER (ORDER BY run_id), 0 FROM new_rows
            ON CONFLICT (run_id) DO UPDATE SET revision = EXCLUDED.revision, deleted = EXCLUDED.deleted;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER flows_runs_revision_insert AFTER INSERT ON flows_runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_revision_stmt_v1();
CREATE TRIGGER flows_runs_revision_update AFTER UPDATE ON flows_runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_revision_stmt_v1();
CREATE TRIGGER flows_runs_revision_delete AFTER DELETE ON flows_runs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION flows_runs_revision_stmt_v1();
