-- The backlog query (autoapproval_backlog_age_seconds) on the candidate benchmark's data: run
-- it after benches/candidate_plans.sql, in the same database. See docs/BENCHMARKS.md.
\set ON_ERROR_STOP on

-- The store's query, verbatim from src/store/census.rs (a test checks it matches).
PREPARE backlog(timestamptz, timestamptz, int) AS
SELECT LEAST(
  (SELECT min(first.sort_time)
     FROM (VALUES ('OWNER_CONTRACT', 'ING'), ('OWNER_CONTRACT', 'PENDING'),
                  ('OWNER_CONTRACT', 'RETRY'), ('AD_CONTRACT', 'ING'),
                  ('AD_CONTRACT', 'PENDING'), ('AD_CONTRACT', 'RETRY')) AS k(request_type, status)
     CROSS JOIN LATERAL (
       SELECT r.sort_time
         FROM autoapproval_request r
        WHERE r.status IN ('ING', 'PENDING', 'RETRY')
          AND r.request_type = k.request_type
          AND r.status = k.status
          AND r.sort_time >= $1
          AND (r.request_type = 'OWNER_CONTRACT' OR r.target_store_number IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
          AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
        ORDER BY r.sort_time
        LIMIT 1) AS first),
  (SELECT s.next_retry_time
     FROM auto_approve_state s
     JOIN autoapproval_request r ON r.id = s.request_id
    WHERE s.status = 'RETRY_WAITING'
      AND s.next_retry_time <= $2
      AND s.retry_count < $3
      AND r.status IN ('ING', 'PENDING', 'RETRY')
      AND r.request_type IN ('OWNER_CONTRACT', 'AD_CONTRACT')
      AND r.sort_time >= $1
      AND (r.request_type = 'OWNER_CONTRACT' OR r.target_store_number IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY s.next_retry_time
    LIMIT 1));

\set backlog_args '(now() - interval ''30 days'', now(), 300)'

-- As candidate_plans.sql leaves it: 100,000 state rows on the oldest open requests, all due.
\echo '== adversarial, all due: backlog'
EXECUTE backlog :backlog_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE backlog :backlog_args;

UPDATE auto_approve_state SET next_retry_time = now() + interval '5 minutes';
VACUUM ANALYZE auto_approve_state;
\echo '== adversarial, not due: backlog'
EXECUTE backlog :backlog_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE backlog :backlog_args;

-- The typical layout again, drawn as candidate_plans.sql draws it.
TRUNCATE auto_approve_state;
SELECT setseed(0.42);
INSERT INTO auto_approve_state (request_id, request_type, status, next_retry_time, retry_count,
                                holder, fencing_token, modified_at)
SELECT id, request_type,
       CASE WHEN r < 0.05 THEN 'IN_PROGRESS' ELSE 'RETRY_WAITING' END,
       CASE WHEN r >= 0.05 AND r < 0.15 THEN now() - interval '1 minute'
            ELSE now() + interval '5 minutes' END,
       n % 310, 'bench', 1, now()
  FROM (SELECT id, request_type, row_number() OVER (ORDER BY id) AS n, random() AS r
          FROM approval_request WHERE status IN ('ING','PENDING','RETRY')) open
 WHERE n <= 100000;
VACUUM ANALYZE auto_approve_state;
\echo '== typical: backlog'
EXECUTE backlog :backlog_args;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE backlog :backlog_args;

-- The census (autoapproval_requests) on the same 100,000 state rows.
\echo '== typical: census'
EXPLAIN (ANALYZE, BUFFERS)
SELECT count(*) FILTER (WHERE status = 'IN_PROGRESS') AS in_progress,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count < 300
                          AND transient_streak > 0) AS waiting_transient,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count < 300
                          AND transient_streak = 0) AS waiting_condition,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count >= 300) AS exhausted
  FROM auto_approve_state;
