-- The discovery turn's statements on 100,000 waiting owner contracts
-- (all with a state row, not due for 3 hours), 900,000 approved ones and 10
-- new ones above the cursor: the whole candidate query, which steps over
-- every waiting request of the shards it is given, against the fresh
-- candidate query, which reads the new requests above the cursor and the
-- due retries only. Run on a migrated, empty database (docs/BENCHMARKS.md,
-- "The discovery turn at 100,000 waiting"). Both statements are the store's,
-- verbatim (a test checks).
\set QUIET on
SET client_min_messages = warning;
ALTER TABLE approval_request DISABLE TRIGGER USER;
INSERT INTO approval_request (id, request_type, status, sort_time)
SELECT g, 'OWNER_CONTRACT', 'APPROVED', now() - interval '1 day' * (g % 60) FROM generate_series(1, 900000) g;
INSERT INTO approval_request (id, request_type, status, sort_time)
SELECT g, 'OWNER_CONTRACT', 'PENDING', now() - interval '1 minute' * (g % 10000) FROM generate_series(900001, 1000000) g;
INSERT INTO auto_approve_state (request_id, request_type, status, next_retry_time, retry_count, holder, fencing_token)
SELECT g, 'OWNER_CONTRACT', 'RETRY_WAITING', now() + interval '3 hours', 1, 'r', 1 FROM generate_series(900001, 1000000) g;
INSERT INTO approval_request (id, request_type, status, sort_time)
SELECT g, 'OWNER_CONTRACT', 'PENDING', now() FROM generate_series(1000001, 1000010) g;
ALTER TABLE approval_request ENABLE TRIGGER USER;
VACUUM ANALYZE approval_request;
VACUUM ANALYZE auto_approve_state;
\set QUIET off
PREPARE whole AS
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
PREPARE fresh AS
(SELECT r.id AS request_id, NULL::bigint AS state_id
   FROM autoapproval_request r
  WHERE r.id > $7
    AND r.status IN ('ING', 'PENDING', 'RETRY')
    AND r.request_type = $8
    AND r.sort_time >= $1
    AND ($8 <> 'AD_CONTRACT' OR r.target_store_number IS NOT NULL)
    AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
    AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
  ORDER BY r.id
  LIMIT $4)
UNION ALL
(SELECT r.id AS request_id, s.id AS state_id
   FROM auto_approve_state s
   JOIN autoapproval_request r ON r.id = s.request_id
  WHERE s.status = 'RETRY_WAITING'
    AND s.next_retry_time <= $2
    AND s.retry_count < $3
    AND r.status IN ('ING', 'PENDING', 'RETRY')
    AND r.request_type = $8
    AND r.sort_time >= $1
    AND ($8 <> 'AD_CONTRACT' OR r.target_store_number IS NOT NULL)
    AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
  ORDER BY s.next_retry_time
  LIMIT $4);
\timing on
-- A replica of three holds 6 of 16 shards; a sweep step takes 1 of 6 (16 / 6
-- rounded up is 3 for a replica holding all 16).
EXPLAIN (ANALYZE, BUFFERS) EXECUTE whole(now() - interval '30 days', now(), 300, 20, '{0,1,2,3,4,5}', 16);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE whole(now() - interval '30 days', now(), 300, 20, '{0,1,2,3,4,5}', 16);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE whole(now() - interval '30 days', now(), 300, 20, '{0}', 16);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE whole(now() - interval '30 days', now(), 300, 20, '{0,1,2}', 16);
EXPLAIN (ANALYZE, BUFFERS) EXECUTE fresh(now() - interval '30 days', now(), 300, 20, '{0,1,2,3,4,5}', 16, 1000000, 'OWNER_CONTRACT');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE fresh(now() - interval '30 days', now(), 300, 20, '{0,1,2,3,4,5}', 16, 1000000, 'OWNER_CONTRACT');
