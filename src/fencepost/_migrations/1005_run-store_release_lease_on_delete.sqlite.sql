-- Deleting a run releases its lease in the same transaction (SQLite).
-- A run removed by raw SQL used to leave its flows_consensus_leases row behind: a run recreated
-- under the same id could never be claimed, and the deleted run's owner still passed the journal's
-- fence. Not a foreign key: the journal's fence is usable without a run row (imports, sweepers),
-- so a lease may exist for an id that has no run.
CREATE TRIGGER flows_runs_release_lease_v1 AFTER DELETE ON flows_runs
BEGIN
    DELETE FROM flows_consensus_leases WHERE run_id = OLD.run_id;
END;
