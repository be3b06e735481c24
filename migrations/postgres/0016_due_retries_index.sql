-- no-transaction
-- The fresh candidate query reads due retries from this index, in due order,
-- without stepping over the requests that wait (store/postgres/candidates.rs).
-- Concurrently: the manual-approval functions write this table for people.
-- A failed concurrent build leaves an INVALID index that IF NOT EXISTS would
-- keep: drop it before running the migration again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS auto_approve_state_due
    ON auto_approve_state (next_retry_time)
    WHERE status = 'RETRY_WAITING';
