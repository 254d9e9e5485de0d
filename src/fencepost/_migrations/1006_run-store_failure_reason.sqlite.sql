-- Why a run failed: the exception type, its message and a bounded traceback, as one JSON object
-- written by the same UPDATE that settles the run failed. Only a failed run may carry one.
ALTER TABLE flows_runs ADD COLUMN failure_json TEXT
    CHECK (failure_json IS NULL OR (status = 'failed' AND json_valid(failure_json)));
