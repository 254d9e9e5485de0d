-- Key the journal by its global position (see the SQLite twin for why); (run_id, seq) stays
-- unique. event_id loses its own unique index: it is an injective function of
-- (run_id, source_id, source_seq), which is unique, and `fencepost journal verify` re-derives it.
ALTER TABLE flows_journal_events DROP CONSTRAINT IF EXISTS flows_journal_events_pkey;
ALTER TABLE flows_journal_events DROP CONSTRAINT IF EXISTS flows_journal_events_position_key;
ALTER TABLE flows_journal_events DROP CONSTRAINT IF EXISTS flows_journal_events_event_id_key;
ALTER TABLE flows_journal_events ADD CONSTRAINT flows_journal_events_pkey PRIMARY KEY (position);
ALTER TABLE flows_journal_events ADD CONSTRAINT flows_journal_events_run_id_seq_key UNIQUE (run_id, seq);
