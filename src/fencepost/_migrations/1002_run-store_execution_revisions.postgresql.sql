-- Execution revisions. Triggers, not Python,
-- advance the revision, so raw SQL writes are tracked too and roll back with their mutation.
-- The UPDATE of the single source row also holds its row lock until commit, so even a raw
-- writer that skips the advisory lock allocates revisions in commit order.
CREATE TABLE flows_run_source (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    source TEXT NOT NULL CHECK (length(source) = 32 AND source !~ '[^0-9a-f]'),
    revision BIGINT NOT NULL CHECK (revision >= 0 AND revision <= 9007199254740991)
);
INSERT INTO flows_run_source (singleton, source, revision)
    VALUES (1, replace(gen_random_uuid()::text, '-', ''), 0);

CREATE TABLE flows_run_changes (
    run_id TEXT NOT NULL PRIMARY KEY CHECK (length(run_id) > 0),
    revision BIGINT NOT NULL UNIQUE CHECK (revision >= 1 AND revision <= 9007199254740991),
    deleted INTEGER NOT NULL CHECK (deleted IN (0, 1))
);

CREATE OR REPLACE FUNCTION flows_runs_identity_immutable_fn() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.run_id IS DISTINCT FROM OLD.run_id THEN
        RAISE EXCEPTION 'run identity is immutable' USING ERRCODE = '23514';
    END IF;
    IF NEW.created_at_ms IS DISTINCT FROM OLD.created_at_ms THEN
        RAISE EXCEPTION 'run creation time is immutable' USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER flows_runs_identity_immutable BEFORE UPDATE OF run_id, created_at_ms ON flows_runs
    FOR EACH ROW EXECUTE FUNCTION flows_runs_identity_immutable_fn();

CREATE OR REPLACE FUNCTION flows_runs_revision_fn() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    next_revision BIGINT;
    changed_id TEXT;
    is_deleted INTEGER;
BEGIN
    UPDATE flows_run_source SET revision = revision + 1 WHERE singleton = 1
        RETURNING revision INTO next_revision;
    IF next_revision IS NULL THEN
        RAISE EXCEPTION 'execution source identity is missing' USING ERRCODE = '23514';
    END IF;
    IF TG_OP = 'DELETE' THEN
        changed_id := OLD.run_id;
        is_deleted := 1;
    ELSE
        changed_id := NEW.run_id;
        is_deleted := 0;
    END IF;
    INSERT INTO flows_run_changes (run_id, revision, deleted)
        VALUES (changed_id, next_revision, is_deleted)
        ON CONFLICT (run_id) DO UPDATE SET revision = EXCLUDED.revision, deleted = EXCLUDED.deleted;
    RETURN NULL;
END;
$$;
CREATE TRIGGER flows_runs_revision_insert AFTER INSERT ON flows_runs
    FOR EACH ROW EXECUTE FUNCTION flows_runs_revision_fn();
CREATE TRIGGER flows_runs_revision_update AFTER UPDATE ON flows_runs
    FOR EACH ROW EXECUTE FUNCTION flows_runs_revision_fn();
CREATE TRIGGER flows_runs_revision_delete AFTER DELETE ON flows_runs
    FOR EACH ROW EXECUTE FUNCTION flows_runs_revision_fn();
