-- MariaDB / MySQL: the discovery turn's statements on 100,000 waiting owner
-- contracts (all with a state row, not due for 3 hours), 900,000 approved
-- ones and 10 new ones above the cursor, as benches/turn_plans.sql for
-- PostgreSQL: the whole candidate query, which steps over every waiting
-- request of the shards it is given, against the fresh candidate query. Run
-- on a database `autoapproval migrate` prepared (docs/BENCHMARKS.md, "The
-- discovery turn at 100,000 waiting"). Both statements are the store's,
-- verbatim (a test checks).
DELETE FROM auto_approve_wake;
DELETE FROM auto_approve_state;
DELETE FROM approval_request;
CREATE TEMPORARY TABLE digits (d INT NOT NULL PRIMARY KEY);
INSERT INTO digits VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9);
INSERT INTO approval_request (id, request_type, status, sort_time)
SELECT n, 'OWNER_CONTRACT',
       CASE WHEN n <= 900000 THEN 'APPROVED' ELSE 'PENDING' END,
       UTC_TIMESTAMP(6) - INTERVAL (n % 10000) MINUTE
  FROM (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * h.d AS n
          FROM digits a, digits b, digits c, digits e, digits f, digits h) AS g;
INSERT INTO approval_request (id, request_type, status, sort_time)
SELECT 1000001 + d, 'OWNER_CONTRACT', 'PENDING', UTC_TIMESTAMP(6) FROM digits;
DELETE FROM auto_approve_wake;
INSERT INTO auto_approve_state (request_id, request_type, status, next_retry_time, retry_count, holder, fencing_token)
SELECT id, 'OWNER_CONTRACT', 'RETRY_WAITING', UTC_TIMESTAMP(6) + INTERVAL 3 HOUR, 1, 'r', 1
  FROM approval_request WHERE id BETWEEN 900001 AND 1000000;
ANALYZE TABLE approval_request, auto_approve_state;

SET @now = UTC_TIMESTAMP(6);
SET @window = @now - INTERVAL 30 DAY;
SET @limit = 20, @retry_limit = 300, @k = 16, @since = 1000000;
SET @whole = "SELECT request_id, state_id FROM (
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'OWNER_CONTRACT'
      AND r.status = 'ING'
      AND r.sort_time >= ?
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND r.id % ? IN (?, ?, ?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'OWNER_CONTRACT'
      AND r.status = 'PENDING'
      AND r.sort_time >= ?
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND r.id % ? IN (?, ?, ?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'OWNER_CONTRACT'
      AND r.status = 'RETRY'
      AND r.sort_time >= ?
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND r.id % ? IN (?, ?, ?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
) AS candidates
 ORDER BY status, sort_time
 LIMIT ?";
SET @fresh = "(SELECT r.id AS request_id, CAST(NULL AS SIGNED) AS state_id
     FROM autoapproval_request r
    WHERE r.id > ?
      AND r.request_type = 'OWNER_CONTRACT'
      AND r.status IN ('ING', 'PENDING', 'RETRY')
      AND r.sort_time >= ?
      AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
      AND r.id % ? IN (?, ?, ?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.id
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id
     FROM auto_approve_state s
     JOIN autoapproval_request r ON r.id = s.request_id
    WHERE s.status = 'RETRY_WAITING'
      AND s.next_retry_time <= ?
      AND s.retry_count < ?
      AND r.request_type = 'OWNER_CONTRACT'
      AND r.status IN ('ING', 'PENDING', 'RETRY')
      AND r.sort_time >= ?
      AND r.id % ? IN (?, ?, ?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY s.next_retry_time
    LIMIT ?)";
SET @q = CONCAT('ANALYZE FORMAT=JSON ', @whole);
PREPARE whole_time FROM @q;
SET @q = CONCAT('ANALYZE FORMAT=JSON ', @fresh);
PREPARE fresh_time FROM @q;
SET @q = CONCAT('ANALYZE ', @fresh);
PREPARE fresh_plan FROM @q;
-- 6 of 16 shards (a replica of three), twice; then one shard (a sweep step).
EXECUTE whole_time USING @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit, @limit;
EXECUTE whole_time USING @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, 4, 5, @limit, @limit;
EXECUTE whole_time USING @window, @now, @retry_limit, @k, 0, 0, 0, 0, 0, 0, @limit,
                         @window, @now, @retry_limit, @k, 0, 0, 0, 0, 0, 0, @limit,
                         @window, @now, @retry_limit, @k, 0, 0, 0, 0, 0, 0, @limit, @limit;
EXECUTE fresh_plan USING @since, @window, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @now, @retry_limit, @window, @k, 0, 1, 2, 3, 4, 5, @limit;
EXECUTE fresh_time USING @since, @window, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @now, @retry_limit, @window, @k, 0, 1, 2, 3, 4, 5, @limit;
EXECUTE fresh_time USING @since, @window, @k, 0, 1, 2, 3, 4, 5, @limit,
                         @now, @retry_limit, @window, @k, 0, 1, 2, 3, 4, 5, @limit;
