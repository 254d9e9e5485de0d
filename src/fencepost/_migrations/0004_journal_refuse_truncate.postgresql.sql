-- The journal refuses TRUNCATE as it refuses UPDATE and DELETE (PostgreSQL): TRUNCATE fires no row
-- trigger, so the append-only guard of 0001 let it empty the journal. Statement level; the function
-- is 0001's (pinned to this schema by 1004).
CREATE TRIGGER flows_journal_events_no_truncate_v1 BEFORE TRUNCATE ON flows_journal_events
    FOR EACH STATEMENT EXECUTE FUNCTION flows_journal_events_append_only_v1();
