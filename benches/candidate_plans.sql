-- Loads 1,000,000 requests and 100,000 state rows into a fresh database that
-- `autoapproval migrate` prepared, then prints the plans of both candidate
-- queries. See docs/BENCHMARKS.md for the command.
\set ON_ERROR_STOP on
TRUNCATE approval_request, auto_approve_state, approval_request_memo, econtract;
ALTER TABLE approval_request DISABLE TRIGGER USER;

-- 12 types; statuses mostly terminal, as in a live system; sort_time spread
-- over 60 days so the 30-day window cuts the range in half.
INSERT INTO approval_request (id, request_type, status, sort_time, created_at, business_name,
                              documents_released, econtract_ref, target_store_number)
SELECT g,
       (ARRAY['OWNER_CONTRACT','AD_CONTRACT','STORE_INFO_CHANGE','MENU_CHANGE','OWNER_CHANGE',
              'BANK_ACCOUNT_CHANGE','BUSINESS_HOURS_CHANGE','DELIVERY_AREA_CHANGE',
              'TEMPORARY_CLOSURE','REOPENING','TERMINATION','PROMOTION_SIGNUP'])[1 + g % 12],
       CASE WHEN g % 10 < 7 THEN 'APPROVED' WHEN g % 10 = 7 THEN 'REJECTED'
            WHEN g % 10 = 8 THEN 'PENDING' ELSE (ARRAY['ING','RETRY','CANCELED'])[1 + g % 3] END,
       now() - (g % 5184000) * interval '1 second',
       now() - (g % 5184000) * interval '1 second',
       'Shop ' || g, g % 2 = 0, 'EC-' || g,
       CASE WHEN g % 12 = 1 THEN g ELSE NULL END
  FROM generate_series(1, 1000000) g;

-- 100,000 state rows on open requests: 85 % waiting (not due), 10 % due, 5 %
-- in progress. Drawn with a seeded random(): ids of one type repeat with a
-- period, so a modulus of the row number would give them all the same fate.
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

ALTER TABLE approval_request ENABLE TRIGGER USER;
VACUUM ANALYZE approval_request;
VACUUM ANALYZE auto_approve_state;

SELECT count(*) AS requests FROM approval_request;
SELECT count(*) AS state_rows FROM auto_approve_state;

-- The store's queries, verbatim from src/store.rs (a test checks they match).
PREPARE owner_candidates(timestamptz, timestamptz, int, bigint, bigint[], bigint) AS
SELECT r.id AS request_id, s.id AS state_id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ('ING', 'PENDING', 'RETRY')
   AND r.request_type = 'OWNER_CONTRACT'
   AND r.sort_time >= $1
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time
 LIMIT $4;

PREPARE ad_candidates(timestamptz, timestamptz, int, bigint, bigint[], bigint) AS
SELECT r.id AS request_id, s.id AS state_id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ('ING', 'PENDING', 'RETRY')
   AND r.request_type = 'AD_CONTRACT'
   AND r.sort_time >= $1
   AND r.target_store_number IS NOT NULL
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time
 LIMIT $4;

-- An alternative measured beside it and rejected: new requests and due
-- retries as two branches, the second driven by an index on due state rows
-- that exists only inside its (rolled-back) measurement.
PREPARE owner_union(timestamptz, timestamptz, int, bigint, bigint[], bigint) AS
SELECT request_id, state_id FROM (
  (SELECT r.id AS request_id, NULL::bigint AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
    WHERE r.status IN ('ING', 'PENDING', 'RETRY')
      AND r.request_type = 'OWNER_CONTRACT'
      AND r.sort_time >= $1
      AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
    ORDER BY r.status, r.sort_time
    LIMIT $4)
  UNION ALL
  (SELECT r.id, s.id, r.status, r.sort_time
     FROM auto_approve_state s
     JOIN autoapproval_request r ON r.id = s.request_id
    WHERE s.status = 'RETRY_WAITING'
      AND s.request_type = 'OWNER_CONTRACT'
      AND s.next_retry_time <= $2
      AND s.retry_count < $3
      AND r.status IN ('ING', 'PENDING', 'RETRY')
      AND r.request_type = 'OWNER_CONTRACT'
      AND r.sort_time >= $1
      AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
    ORDER BY r.status, r.sort_time
    LIMIT $4)
) candidates
ORDER BY status, sort_time
LIMIT $4;

\set layout 'typical'
\ir candidate_plans_measure.sql
\echo '== typical: ad contracts (store)'
EXECUTE ad_candidates(now() - interval '30 days', now(), 300, 10, NULL, 1);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE ad_candidates(now() - interval '30 days', now(), 300, 10, NULL, 1);
-- With a shard filter (8 of 16 shards), as a replica holding half the leases runs it.
\echo '== typical: owner contracts, 8 of 16 shards (store)'
EXECUTE owner_candidates(now() - interval '30 days', now(), 300, 20, ARRAY[0,1,2,3,4,5,6,7]::bigint[], 16);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE owner_candidates(now() - interval '30 days', now(), 300, 20, ARRAY[0,1,2,3,4,5,6,7]::bigint[], 16);

-- Adversarial layout: the state rows sit on the OLDEST open requests, all
-- waiting and not due, so a scan in request order must step over every one of
-- them before it finds a candidate (the seed: LIMIT bounds the worst case, not
-- the usual one).
TRUNCATE auto_approve_state;
INSERT INTO auto_approve_state (request_id, request_type, status, next_retry_time, retry_count,
                                holder, fencing_token, modified_at)
SELECT id, request_type, 'RETRY_WAITING', now() + interval '5 minutes', 3, 'bench', 1, now()
  FROM (SELECT id, request_type FROM approval_request
         WHERE status IN ('ING','PENDING','RETRY') ORDER BY status, sort_time LIMIT 100000) oldest;
VACUUM ANALYZE auto_approve_state;
\set layout 'adversarial, not due'
\ir candidate_plans_measure.sql

-- The same rows, all due (say, after an outage of an external system).
UPDATE auto_approve_state SET next_retry_time = now() - interval '1 minute';
VACUUM ANALYZE auto_approve_state;
\set layout 'adversarial, all due'
\ir candidate_plans_measure.sql
