-- Included by candidate_plans.sql once per layout (psql variable :layout):
-- the owner-contract candidate query three ways, each after one warm-up run.
\set owner_args '(now() - interval ''30 days'', now(), 300, 20, NULL, 1)'

\echo '==' :layout ': owner contracts (store)'
EXECUTE owner_candidates :owner_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE owner_candidates :owner_args;

\echo '==' :layout ': owner contracts (store, without the open-candidates index)'
BEGIN;
DROP INDEX approval_request_open_candidates;
EXECUTE owner_candidates :owner_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE owner_candidates :owner_args;
ROLLBACK;

\echo '==' :layout ': owner contracts (union form, rejected)'
BEGIN;
CREATE INDEX auto_approve_state_due ON auto_approve_state (request_type, next_retry_time)
 WHERE status = 'RETRY_WAITING';
ANALYZE auto_approve_state;
EXECUTE owner_union :owner_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE owner_union :owner_args;
ROLLBACK;
