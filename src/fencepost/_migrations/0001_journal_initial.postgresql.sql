-- Journal streams with fencepost's audit additions: a global, gapless
-- position in commit order and a hash chain per stream and over the whole log.
CREATE OR REPLACE FUNCTION fencepost_json_valid_v1(doc text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    PERFORM doc::json;
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END;
$$;

CREATE TABLE flows_journal_events (
    run_id TEXT NOT NULL CHECK (length(run_id) > 0),
    seq BIGINT NOT NULL CHECK (seq >= 0 AND seq < 9007199254740991),
    event_id TEXT NOT NULL UNIQUE,
    source_id TEXT NOT NULL CHECK (length(source_id) > 0),
    source_seq BIGINT NOT NULL CHECK (source_seq >= 0 AND source_seq < 9007199254740991),
    emitted_at_ms BIGINT NOT NULL CHECK (emitted_at_ms >= 0 AND emitted_at_ms <= 9007199254740991),
    event_type TEXT NOT NULL CHECK (length(event_type) > 0),
    payload_json TEXT NOT NULL CHECK (fencepost_json_valid_v1(payload_json)),
    meta_json TEXT NOT NULL CHECK (fencepost_json_valid_v1(meta_json)),
    content_hash TEXT NOT NULL CHECK (length(content_hash) = 64),
    position BIGINT NOT NULL UNIQUE CHECK (position >= 1 AND position <= 9007199254740991),
    stream_prev_hash TEXT NOT NULL CHECK (length(stream_prev_hash) = 64),
    log_prev_hash TEXT NOT NULL CHECK (length(log_prev_hash) = 64),
    entry_hash TEXT NOT NULL CHECK (length(entry_hash) = 64),
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, source_id, source_seq)
);
CREATE INDEX flows_journal_events_event_type_idx ON flows_journal_events (event_type);
CREATE INDEX flows_journal_events_run_event_type_idx ON flows_journal_events (run_id, event_type, seq);

CREATE OR REPLACE FUNCTION flows_journal_events_append_only_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'journal entries are append-only' USING ERRCODE = '23514';
END;
$$;

CREATE TRIGGER flows_journal_events_no_update_v1 BEFORE UPDATE ON flows_journal_events
    FOR EACH ROW EXECUTE FUNCTION flows_journal_events_append_only_v1();
CREATE TRIGGER flows_journal_events_no_delete_v1 BEFORE DELETE ON flows_journal_events
    FOR EACH ROW EXECUTE FUNCTION flows_journal_events_append_only_v1();

-- SqlConsensus leases (line A): the arbiter of run ownership.
CREATE TABLE flows_consensus_leases (
    run_id TEXT NOT NULL PRIMARY KEY CHECK (length(run_id) > 0),
    owner_host_id TEXT CHECK (owner_host_id IS NULL OR length(owner_host_id) > 0),
    owner_pid BIGINT CHECK (owner_pid IS NULL OR (owner_pid >= 0 AND owner_pid <= 9007199254740991)),
    owner_nonce TEXT CHECK (owner_nonce IS NULL OR length(owner_nonce) > 0),
    granted_at_ms BIGINT CHECK (granted_at_ms IS NULL OR (granted_at_ms >= 0 AND granted_at_ms <= 9007199254740991)),
    heartbeat_at_ms BIGINT CHECK (heartbeat_at_ms IS NULL OR (heartbeat_at_ms >= 0 AND heartbeat_at_ms <= 9007199254740991)),
    claim_host_id TEXT CHECK (claim_host_id IS NULL OR length(claim_host_id) > 0),
    claim_pid BIGINT CHECK (claim_pid IS NULL OR (claim_pid >= 0 AND claim_pid <= 9007199254740991)),
    claim_nonce TEXT CHECK (claim_nonce IS NULL OR length(claim_nonce) > 0),
    claimed_at_ms BIGINT CHECK (claimed_at_ms IS NULL OR (claimed_at_ms >= 0 AND claimed_at_ms <= 9007199254740991))
);
