-- A worker's sweep looks, among others, for claims older than a cutoff, on runs of any status. No
-- index held them, so every sweep of every worker read the whole runs table. Claims are few and
-- short-lived: this partial index holds only the rows that have one, in the sweep's order.
CREATE INDEX flows_runs_claims_idx ON flows_runs (created_at_ms, run_id) WHERE claim_host_id IS NOT NULL;
