-- A body the downstream refused (400 or 422: it created nothing) ends its
-- idempotency key: the row is kept, marked here, and the next attempt
-- builds a new body under the next key, `<key>#2`, `#3`, … (issue 41).
-- A lost answer (timeout, 5xx, a cut connection) marks nothing: the same
-- body is sent again under the same key. (PostgreSQL's is migration 0003.)
ALTER TABLE auto_approve_sent ADD COLUMN refused_at DATETIME(6) NULL;
