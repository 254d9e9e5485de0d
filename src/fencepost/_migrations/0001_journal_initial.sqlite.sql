-- Journal streams with fencepost's audit additions: a global, gapless
-- position in commit order and a hash chain per stream and over the whole log.
CREATE TABLE flows_journal_events (
    run_id TEXT NOT NULL CHECK (length(run_id) > 0),
    seq INTEGER NOT NULL CHECK (typeof(seq) = 'integer' AND seq >= 0 AND seq < 9007199254740991),
    event_id TEXT NOT NULL UNIQUE,
    source_id TEXT NOT NULL CHECK (length(source_id) > 0),
    source_seq INTEGER NOT NULL CHECK (typeof(source_seq) = 'integer' AND source_seq >= 0 AND source_seq < 9007199254740991),
    emitted_at_ms INTEGER NOT NULL CHECK (typeof(emitted_at_ms) = 'integer' AND emitted_at_ms >= 0 AND emitted_at_ms <= 9007199254740991),
    event_type TEXT NOT NULL CHECK (length(event_type) > 0),
    payload_json TEXT NOT NULL CHECK (json_valid(payload_json)),
    meta_json TEXT NOT NULL CHECK (json_valid(meta_json)),
    content_hash TEXT NOT NULL CHECK (length(content_hash) = 64),
    position INTEGER NOT NULL UNIQUE CHECK (typeof(position) = 'integer' AND position >= 1 AND position <= 9007199254740991),
    stream_prev_hash TEXT NOT NULL CHECK (length(stream_prev_hash) = 64),
    log_prev_hash TEXT NOT NULL CHECK (length(log_prev_hash) = 64),
    entry_hash TEXT NOT NULL CHECK (length(entry_hash) = 64),
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, source_id, source_seq)
);
CREATE INDEX flows_journal_events_event_type_idx ON flows_journal_events (event_type);
CREATE INDEX flows_journal_events_run_event_type_idx ON flows_journal_events (run_id, event_type, seq);

CREATE TRIGGER flows_journal_events_no_update_v1 BEFORE UPDATE ON flows_journal_events
BEGIN
    SELECT RAISE(ABORT, 'journal entries are append-only');
END;

CREATE TRIGGER flows_journal_events_no_delete_v1 BEFORE DELETE ON flows_journal_events
BEGIN
    SELECT RAISE(ABORT, 'journal entries are append-only');
END;

-- SqlConsensus leases (line A): the arbiter of run ownership.
CREATE TABLE flows_consensus_leases (
    run_id TEXT NOT NULL PRIMARY KEY CHECK (length(run_id) > 0),
    owner_host_id TEXT CHECK (owner_host_id IS NULL OR length(owner_host_id) > 0),
    owner_pid INTEGER CHECK (owner_pid IS NULL OR (typeof(owner_pid) = 'integer' AND owner_pid >= 0 AND owner_pid <= 9007199254740991)),
    owner_nonce TEXT CHECK (owner_nonce IS NULL OR length(owner_nonce) > 0),
    granted_at_ms INTEGER CHECK (granted_at_ms IS NULL OR (typeof(granted_at_ms) = 'integer' AND granted_at_ms >= 0 AND granted_at_ms <= 9007199254740991)),
    heartbeat_at_ms INTEGER CHECK (heartbeat_at_ms IS NULL OR (typeof(heartbeat_at_ms) = 'integer' AND heartbeat_at_ms >= 0 AND heartbeat_at_ms <= 9007199254740991)),
    claim_host_id TEXT CHECK (claim_host_id IS NULL OR length(claim_host_id) > 0),
    claim_pid INTEGER CHECK (claim_pid IS NULL OR (typeof(claim_pid) = 'integer' AND claim_pid >= 0 AND claim_pid <= 9007199254740991)),
    claim_nonce TEXT CHECK (claim_nonce IS NULL OR length(claim_nonce) > 0),
    claimed_at_ms INTEGER CHECK (claimed_at_ms IS NULL OR (typeof(claimed_at_ms) = 'integer' AND claimed_at_ms >= 0 AND claimed_at_ms <= 9007199254740991))
);
