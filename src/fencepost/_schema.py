"""Every table, spelled as the seeds spell it. The migrations create them; this module is what
statements are built from, and a test proves the two agree (tests/migrations)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text

metadata = MetaData()

# BIGINT renders as INTEGER on SQLite; every range is a CHECK in the migrations.
Int = BigInteger().with_variant(Integer(), "sqlite")

flows_migrations = Table(
    "flows_migrations",
    metadata,
    Column("migration_id", Integer, primary_key=True),
    Column("name", Text, nullable=False),
)

flows_runs = Table(
    "flows_runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("status", Text, nullable=False),
    Column("state_json", Text, nullable=False),
    Column("created_at_ms", Int, nullable=False),
    Column("started_at_ms", Int),
    Column("finished_at_ms", Int),
    Column("heartbeat_at_ms", Int),
    Column("owner_host_id", Text),
    Column("owner_pid", Int),
    Column("owner_nonce", Text),
    Column("claim_host_id", Text),
    Column("claim_pid", Int),
    Column("claim_nonce", Text),
    Column("claimed_at_ms", Int),
    Column("cancel_requested_at_ms", Int),
    Column("cancel_acknowledgement_json", Text),
    Column("parent_run_id", Text),
    Column("lineage_id", Text),
    Column("round_ordinal", Int),
    Column("waiting_reason", Text),
    Column("waiting_token", Text),
    Column("waiting_wake_at_ms", Int),
    Column("waiting_request", Text),
    Column("failure_json", Text),
)

flows_attempts = Table(
    "flows_attempts",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("step_key_digest", Text, primary_key=True),
    Column("attempt", Int, primary_key=True),
    Column("state", Text, nullable=False),
    Column("started_at_ms", Int, nullable=False),
    Column("finished_at_ms", Int),
    Column("heartbeat_at_ms", Int),
    Column("checkpoint_json", Text),
    Column("error_json", Text),
    Column("outcome_json", Text),
    Column("meta_json", Text, nullable=False),
)

flows_journal_events = Table(
    "flows_journal_events",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("seq", Int, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("source_id", Text, nullable=False),
    Column("source_seq", Int, nullable=False),
    Column("emitted_at_ms", Int, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("meta_json", Text, nullable=False),
    Column("content_hash", Text, nullable=False),
    # The key since migration 0003: appends land at the right edge; (run_id, seq) is unique.
    Column("position", Int, primary_key=True),
    Column("stream_prev_hash", Text, nullable=False),
    Column("log_prev_hash", Text, nullable=False),
    Column("entry_hash", Text, nullable=False),
)

flows_consensus_leases = Table(
    "flows_consensus_leases",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("owner_host_id", Text),
    Column("owner_pid", Int),
    Column("owner_nonce", Text),
    Column("granted_at_ms", Int),
    Column("heartbeat_at_ms", Int),
    Column("claim_host_id", Text),
    Column("claim_pid", Int),
    Column("claim_nonce", Text),
    Column("claimed_at_ms", Int),
)

flows_run_source = Table(
    "flows_run_source",
    metadata,
    Column("singleton", Integer, primary_key=True),
    Column("source", Text, nullable=False),
    Column("revision", Int, nullable=False),
)

flows_run_changes = Table(
    "flows_run_changes",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("revision", Int, nullable=False),
    Column("deleted", Integer, nullable=False),
)

# Since migration 4001: at most one row, present when the store is a member of a shard set.
# ``founded_at_ms`` since 4002 (a store at 4001 opened read-only lacks it: read it through the ledger).
flows_shard_membership = Table(
    "flows_shard_membership",
    metadata,
    Column("singleton", Integer, primary_key=True),
    Column("set_id", Text, nullable=False),
    Column("shard_name", Text, nullable=False),
    Column("members_json", Text, nullable=False),
    Column("generation", Int, nullable=False),
    Column("joined_at_ms", Int, nullable=False),
    Column("founded_at_ms", Int, nullable=True),
)
