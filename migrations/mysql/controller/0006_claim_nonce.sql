-- A fence per claim (PostgreSQL 0017): every claim and re-claim draws a
-- fresh random nonce, and every write made under a claim also needs it, so
-- a claim given back and taken again by the same replica under the same
-- shard generation never shares a fence with a chain still running from
-- the first claim. Manual claims keep 0.
ALTER TABLE auto_approve_state ADD COLUMN claim_nonce BIGINT NOT NULL DEFAULT 0;
