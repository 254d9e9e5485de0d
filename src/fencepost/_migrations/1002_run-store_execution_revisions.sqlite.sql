-- Execution revisions. Triggers, not Python,
-- advance the revision, so raw SQL writes are tracked too and roll back with their mutation.
CREATE TABLE flows_run_source (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    source TEXT NOT NULL CHECK (length(source) = 32 AND source NOT GLOB '*[^0-9a-f]*'),
    revision INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 0 AND revision <= 9007199254740991)
);
INSERT INTO flows_run_source (singleton, source, revision) VALUES (1, lower(hex(randomblob(16))), 0);

CREATE TABLE flows_run_changes (
    run_id TEXT NOT NULL PRIMARY KEY CHECK (length(run_id) > 0),
    revision INTEGER NOT NULL UNIQUE CHECK (typeof(revision) = 'integer' AND revision >= 1 AND revision <= 9007199254740991),
    deleted INTEGER NOT NULL CHECK (deleted IN (0, 1))
);

CREATE TRIGGER flows_runs_identity_immutable BEFORE UPDATE OF run_id ON flows_runs
WHEN NEW.run_id <> OLD.run_id
BEGIN
    SELECT RAISE(ABORT, 'run identity is immutable');
END;

CREATE TRIGGER flows_runs_creation_immutable BEFORE UPDATE OF created_at_ms ON flows_runs
WHEN NEW.created_at_ms IS NOT OLD.created_at_ms
BEGIN
    SELECT RAISE(ABORT, 'run creation time is immutable');
END;

CREATE TRIGGER flows_runs_revision_insert AFTER INSERT ON flows_runs
BEGIN
    SELECT RAISE(ABORT, 'execution source identity is missing')
        WHERE NOT EXISTS (SELECT 1 FROM flows_run_source WHERE singleton = 1);
    UPDATE flows_run_source SET revision = revision + 1 WHERE singleton = 1;
    INSERT INTO flows_run_changes (run_id, revision, deleted)
        VALUES (NEW.run_id, (SELECT revision FROM flows_run_source WHERE singleton = 1), 0)
        ON CONFLICT (run_id) DO UPDATE SET revision = excluded.revision, deleted = 0;
END;

CREATE TRIGGER flows_runs_revision_update AFTER UPDATE ON flows_runs
BEGIN
    SELECT RAISE(ABORT, 'execution source identity is missing')
        WHERE NOT EXISTS (SELECT 1 FROM flows_run_source WHERE singleton = 1);
    UPDATE flows_run_source SET revision = revision + 1 WHERE singleton = 1;
    INSERT INTO flows_run_changes (run_id, revision, deleted)
        VALUES (NEW.run_id, (SELECT revision FROM flows_run_source WHERE singleton = 1), 0)
        ON CONFLICT (run_id) DO UPDATE SET revision = excluded.revision, deleted = 0;
END;

CREATE TRIGGER flows_runs_revision_delete AFTER DELETE ON flows_runs
BEGIN
    SELECT RAISE(ABORT, 'execution source identity is missing')
        WHERE NOT EXISTS (SELECT 1 FROM flows_run_source WHERE singleton = 1);
    UPDATE flows_run_source SET revision = revision + 1 WHERE singleton = 1;
    INSERT INTO flows_run_changes (run_id, revision, deleted)
        VALUES (OLD.run_id, (SELECT revision FROM flows_run_source WHERE singleton = 1), 1)
        ON CONFLICT (run_id) DO UPDATE SET revision = excluded.revision, deleted = 1;
END;
