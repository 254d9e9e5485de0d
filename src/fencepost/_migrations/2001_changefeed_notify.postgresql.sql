-- Live-tail wake-ups on PostgreSQL: every statement that touches flows_runs, and every
-- source rotation, sends one notification on channel fencepost_changes_v1 whose payload is the
-- schema name. PostgreSQL folds identical notifications of one transaction into one and
-- delivers them at commit, so a burst costs a single wake-up. A notification is only a hint:
-- followers always re-query revisions, and re-query after any reconnect (notifications sent
-- while a listener is disconnected are lost).
CREATE OR REPLACE FUNCTION flows_run_changes_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencepost_changes_v1', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;
CREATE TRIGGER flows_runs_changes_notify_v1 AFTER INSERT OR UPDATE OR DELETE ON flows_runs
    FOR EACH STATEMENT EXECUTE FUNCTION flows_run_changes_notify_v1();
CREATE TRIGGER flows_run_source_rotation_notify_v1 AFTER UPDATE OF source ON flows_run_source
    FOR EACH STATEMENT EXECUTE FUNCTION flows_run_changes_notify_v1();
