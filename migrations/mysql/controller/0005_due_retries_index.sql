-- The fresh candidate query reads due retries from this index, in due order,
-- without stepping over the requests that wait (store/mysql/candidates.rs);
-- PostgreSQL's 0016 is partial (WHERE status = 'RETRY_WAITING'), which MySQL
-- has not, so status leads and the query reads the one status's range.
-- In place and without a lock: the manual-approval procedures write this
-- table for people.
ALTER TABLE auto_approve_state
    ADD INDEX auto_approve_state_due (status, next_retry_time),
    ALGORITHM = INPLACE, LOCK = NONE;
