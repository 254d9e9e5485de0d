-- Runs and attempts: every invariant is a CHECK, so raw SQL cannot
-- leave a half-owned row behind either.
CREATE TABLE flows_runs (
    run_id TEXT NOT NULL PRIMARY KEY CHECK (length(run_id) > 0),
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'suspended', 'completed', 'failed', 'cancelled')),
    state_json TEXT NOT NULL CHECK (json_valid(state_json)),
    created_at_ms INTEGER NOT NULL CHECK (typeof(created_at_ms) = 'integer' AND created_at_ms >= 0 AND created_at_ms <= 9007199254740991),
    started_at_ms INTEGER CHECK (started_at_ms IS NULL OR (typeof(started_at_ms) = 'integer' AND started_at_ms >= 0 AND started_at_ms <= 9007199254740991)),
    finished_at_ms INTEGER CHECK (finished_at_ms IS NULL OR (typeof(finished_at_ms) = 'integer' AND finished_at_ms >= 0 AND finished_at_ms <= 9007199254740991)),
    heartbeat_at_ms INTEGER CHECK (heartbeat_at_ms IS NULL OR (typeof(heartbeat_at_ms) = 'integer' AND heartbeat_at_ms >= 0 AND heartbeat_at_ms <= 9007199254740991)),
    owner_host_id TEXT CHECK (owner_host_id IS NULL OR length(owner_host_id) > 0),
    owner_pid INTEGER,
    owner_nonce TEXT CHECK (owner_nonce IS NULL OR length(owner_nonce) > 0),
    claim_host_id TEXT CHECK (claim_host_id IS NULL OR length(claim_host_id) > 0),
    claim_pid INTEGER,
    claim_nonce TEXT CHECK (claim_nonce IS NULL OR length(claim_nonce) > 0),
    claimed_at_ms INTEGER CHECK (claimed_at_ms IS NULL OR (typeof(claimed_at_ms) = 'integer' AND claimed_at_ms >= 0 AND claimed_at_ms <= 9007199254740991)),
    cancel_requested_at_ms INTEGER CHECK (cancel_requested_at_ms IS NULL OR (typeof(cancel_requested_at_ms) = 'integer' AND cancel_requested_at_ms >= 0 AND cancel_requested_at_ms <= 9007199254740991)),
    cancel_acknowledgement_json TEXT CHECK (cancel_acknowledgement_json IS NULL OR json_valid(cancel_acknowledgement_json)),
    parent_run_id TEXT CHECK (parent_run_id IS NULL OR length(parent_run_id) > 0) REFERENCES flows_runs (run_id),
    lineage_id TEXT CHECK (lineage_id IS NULL OR length(lineage_id) > 0),
    round_ordinal INTEGER CHECK (round_ordinal IS NULL OR (typeof(round_ordinal) = 'integer' AND round_ordinal >= 0 AND round_ordinal <= 9007199254740991)),
    waiting_reason TEXT CHECK (waiting_reason IS NULL OR length(waiting_reason) > 0),
    waiting_token TEXT CHECK (waiting_token IS NULL OR length(waiting_token) > 0),
    waiting_wake_at_ms INTEGER CHECK (waiting_wake_at_ms IS NULL OR (typeof(waiting_wake_at_ms) = 'integer' AND waiting_wake_at_ms >= 0 AND waiting_wake_at_ms <= 9007199254740991)),
    waiting_request TEXT CHECK (waiting_request IS NULL OR json_valid(waiting_request)),
    CONSTRAINT flows_runs_owner_invariant CHECK (
        (status = 'running' AND owner_host_id IS NOT NULL AND owner_pid IS NOT NULL
            AND owner_nonce IS NOT NULL AND heartbeat_at_ms IS NOT NULL AND typeof(owner_pid) = 'integer' AND owner_pid >= 0 AND owner_pid <= 9007199254740991)
        OR (status <> 'running' AND owner_host_id IS NULL AND owner_pid IS NULL
            AND owner_nonce IS NULL AND heartbeat_at_ms IS NULL)
    ),
    CONSTRAINT flows_runs_claim_invariant CHECK (
        (claim_host_id IS NULL AND claim_pid IS NULL AND claim_nonce IS NULL AND claimed_at_ms IS NULL)
        OR (claim_host_id IS NOT NULL AND claim_pid IS NOT NULL AND claim_nonce IS NOT NULL
            AND claimed_at_ms IS NOT NULL AND typeof(claim_pid) = 'integer' AND claim_pid >= 0 AND claim_pid <= 9007199254740991)
    ),
    CONSTRAINT flows_runs_waiting_invariant CHECK (
        waiting_reason IS NOT NULL OR (waiting_wake_at_ms IS NULL AND waiting_token IS NULL AND waiting_request IS NULL)
    ),
    CONSTRAINT flows_runs_lineage_pair CHECK ((lineage_id IS NULL) = (round_ordinal IS NULL))
);
CREATE INDEX flows_runs_parent_run_id_idx ON flows_runs (parent_run_id);
CREATE UNIQUE INDEX flows_runs_lineage_idx ON flows_runs (lineage_id, round_ordinal);
CREATE INDEX flows_runs_cancel_requested_idx ON flows_runs (cancel_requested_at_ms)
    WHERE cancel_requested_at_ms IS NOT NULL;
CREATE INDEX flows_runs_waiting_reason_wake_at_idx ON flows_runs (waiting_reason, waiting_wake_at_ms)
    WHERE waiting_reason IS NOT NULL;
CREATE INDEX flows_runs_listing_idx ON flows_runs (created_at_ms, run_id);
CREATE INDEX flows_runs_status_listing_idx ON flows_runs (status, created_at_ms, run_id);

CREATE TABLE flows_attempts (
    run_id TEXT NOT NULL CHECK (length(run_id) > 0) REFERENCES flows_runs (run_id),
    step_key_digest TEXT NOT NULL CHECK (length(step_key_digest) > 0),
    attempt INTEGER NOT NULL CHECK (typeof(attempt) = 'integer' AND attempt >= 0 AND attempt <= 9007199254740991),
    state TEXT NOT NULL CHECK (length(state) > 0),
    started_at_ms INTEGER NOT NULL CHECK (typeof(started_at_ms) = 'integer' AND started_at_ms >= 0 AND started_at_ms <= 9007199254740991),
    finished_at_ms INTEGER CHECK (finished_at_ms IS NULL OR (typeof(finished_at_ms) = 'integer' AND finished_at_ms >= 0 AND finished_at_ms <= 9007199254740991)),
    heartbeat_at_ms INTEGER CHECK (heartbeat_at_ms IS NULL OR (typeof(heartbeat_at_ms) = 'integer' AND heartbeat_at_ms >= 0 AND heartbeat_at_ms <= 9007199254740991)),
    checkpoint_json TEXT CHECK (checkpoint_json IS NULL OR json_valid(checkpoint_json)),
    error_json TEXT CHECK (error_json IS NULL OR json_valid(error_json)),
    outcome_json TEXT CHECK (outcome_json IS NULL OR json_valid(outcome_json)),
    meta_json TEXT NOT NULL CHECK (json_valid(meta_json)),
    PRIMARY KEY (run_id, step_key_digest, attempt)
);
