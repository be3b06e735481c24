-- no-transaction
-- The candidate queries read open requests only from this index, covering
-- id and the target store so the scan never visits the heap. Built concurrently
-- because approval_request is the business system's live table. A failed
-- concurrent build leaves an INVALID index that IF NOT EXISTS would keep:
-- drop it before running the migration again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS approval_request_open_candidates
    ON approval_request (request_type, status, sort_time)
    INCLUDE (id, target_store_number)
    WHERE status IN ('ING', 'PENDING', 'RETRY');
