-- A change notified while a request is IN_PROGRESS must not be lost: the
-- chain may have read the fact before it changed. The wake-up records it
-- here and the retry it schedules is then due at once.
ALTER TABLE auto_approve_state ADD COLUMN woken_at TIMESTAMPTZ;
