-- MariaDB / MySQL: loads 1,000,000 requests and 100,000 state rows into a
-- fresh database that `autoapproval migrate --reference-schema` prepared (a mysql:// URL), then
-- prints the plan of every statement of src/store/mysql that takes a lock,
-- and of the candidate and census queries (ANALYZE: run, with the rows each
-- step really read). The store binds `?`; here the same statements carry
-- literals and user variables, which the optimizer treats as constants too.
-- See docs/BENCHMARKS.md (issue 19) for the command.
DELETE FROM auto_approve_wake;
DELETE FROM shard_fence;
DELETE FROM auto_approve_state;
DELETE FROM approval_request;

CREATE TEMPORARY TABLE digits (d INT NOT NULL PRIMARY KEY);
INSERT INTO digits VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9);

-- 12 types; statuses mostly terminal (70 % approved, 10 % rejected, 10 %
-- pending, the rest in progress / resubmitted / canceled); sort_time spread
-- over 60 days, so the 30-day window cuts the range in half. As in
-- benches/candidate_plans.sql for PostgreSQL.
INSERT INTO approval_request (id, request_type, status, sort_time, created_at, business_name,
                              documents_released, econtract_ref, target_store_number)
SELECT g,
       ELT(1 + g % 12, 'OWNER_CONTRACT', 'AD_CONTRACT', 'STORE_INFO_CHANGE', 'MENU_CHANGE',
           'OWNER_CHANGE', 'BANK_ACCOUNT_CHANGE', 'BUSINESS_HOURS_CHANGE', 'DELIVERY_AREA_CHANGE',
           'TEMPORARY_CLOSURE', 'REOPENING', 'TERMINATION', 'PROMOTION_SIGNUP'),
       CASE WHEN g % 10 < 7 THEN 'APPROVED' WHEN g % 10 = 7 THEN 'REJECTED'
            WHEN g % 10 = 8 THEN 'PENDING' ELSE ELT(1 + g % 3, 'ING', 'RETRY', 'CANCELED') END,
       UTC_TIMESTAMP(6) - INTERVAL (g % 5184000) SECOND,
       UTC_TIMESTAMP(6) - INTERVAL (g % 5184000) SECOND,
       CONCAT('Shop ', g), g % 2 = 0, CONCAT('EC-', g),
       CASE WHEN g % 12 = 1 THEN g ELSE NULL END
  FROM (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * h.d AS g
          FROM digits a, digits b, digits c, digits e, digits f, digits h) n;

-- 100,000 state rows on open requests: 85 % waiting (not due), 10 % due,
-- 5 % in progress, drawn with a seeded RAND().
INSERT INTO auto_approve_state (request_id, request_type, status, next_retry_time, retry_count,
                                holder, fencing_token, modified_at)
SELECT id, request_type,
       CASE WHEN r < 0.05 THEN 'IN_PROGRESS' ELSE 'RETRY_WAITING' END,
       CASE WHEN r >= 0.05 AND r < 0.15 THEN UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE
            ELSE UTC_TIMESTAMP(6) + INTERVAL 5 MINUTE END,
       n % 310, 'bench', 1, UTC_TIMESTAMP(6)
  FROM (SELECT id, request_type, ROW_NUMBER() OVER (ORDER BY id) AS n, RAND(42) AS r
          FROM approval_request WHERE status IN ('ING', 'PENDING', 'RETRY')) open_requests
 WHERE n <= 100000;

-- The triggers wrote one wake row per request: the poller's table holds a
-- few thousand rows in a live system, not a million.
DELETE FROM auto_approve_wake;
INSERT INTO auto_approve_wake (request_id)
SELECT request_id FROM auto_approve_state ORDER BY request_id LIMIT 2000;
INSERT INTO shard_fence (shard_count, shard, token, holder, fenced_at)
SELECT 16, d, 1, 'bench', UTC_TIMESTAMP(6) FROM digits;

ANALYZE TABLE approval_request, auto_approve_state, auto_approve_wake, shard_fence;

SELECT COUNT(*) AS requests FROM approval_request;
SELECT COUNT(*) AS state_rows FROM auto_approve_state;

SET @now = UTC_TIMESTAMP(6);
SET @window = @now - INTERVAL 30 DAY;
SELECT id, request_id INTO @sid, @rid FROM auto_approve_state
 WHERE status = 'IN_PROGRESS' ORDER BY id LIMIT 1;
SELECT MIN(id), MAX(id) INTO @wmin, @wmax FROM auto_approve_wake;

-- The candidate statements are prepared from the store's SQL, verbatim
-- (tests/it/candidates.rs checks the strings), and run twice: once to warm
-- the buffer pool, then under ANALYZE (the rows each step really read) and
-- ANALYZE FORMAT=JSON (r_total_time_ms: the execution time).
SET @limit = 20, @retry_limit = 300, @k = 16;

SELECT '== candidates: owner contracts, shards 0-3 of 16 (store/mysql/candidates.rs)' AS statement;
SET @owner = "SELECT request_id, state_id FROM (
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'OWNER_CONTRACT'
      AND r.status = 'ING'
      AND r.sort_time >= ?
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND r.id % ? IN (?, ?, ?, ?)
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
      AND r.id % ? IN (?, ?, ?, ?)
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
      AND r.id % ? IN (?, ?, ?, ?)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
) AS candidates
 ORDER BY status, sort_time
 LIMIT ?";
SET @q = CONCAT('ANALYZE ', @owner);
PREPARE owner_plan FROM @q;
SET @q = CONCAT('ANALYZE FORMAT=JSON ', @owner);
PREPARE owner_time FROM @q;
EXECUTE owner_plan USING @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit, @limit;
EXECUTE owner_time USING @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit,
                         @window, @now, @retry_limit, @k, 0, 1, 2, 3, @limit, @limit;

SELECT '== candidates: ad contracts, no shard filter' AS statement;
SET @ad = "SELECT request_id, state_id FROM (
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'AD_CONTRACT'
      AND r.status = 'ING'
      AND r.sort_time >= ?
      AND r.target_store_number IS NOT NULL
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'AD_CONTRACT'
      AND r.status = 'PENDING'
      AND r.sort_time >= ?
      AND r.target_store_number IS NOT NULL
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = 'AD_CONTRACT'
      AND r.status = 'RETRY'
      AND r.sort_time >= ?
      AND r.target_store_number IS NOT NULL
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)
) AS candidates
 ORDER BY status, sort_time
 LIMIT ?";
SET @q = CONCAT('ANALYZE ', @ad);
PREPARE ad_plan FROM @q;
SET @q = CONCAT('ANALYZE FORMAT=JSON ', @ad);
PREPARE ad_time FROM @q;
SET @limit = 10;
EXECUTE ad_plan USING @window, @now, @retry_limit, @limit, @window, @now, @retry_limit, @limit,
                      @window, @now, @retry_limit, @limit, @limit;
EXECUTE ad_time USING @window, @now, @retry_limit, @limit, @window, @now, @retry_limit, @limit,
                      @window, @now, @retry_limit, @limit, @limit;

SELECT '== candidates among notified requests (by primary key)' AS statement;
SET @among = "SELECT r.id AS request_id, r.request_type, s.id AS state_id, r.status, r.sort_time
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.id IN (?, ?, ?, ?)
   AND r.status IN ('ING', 'PENDING', 'RETRY')
   AND (r.request_type = 'OWNER_CONTRACT'
        OR (r.request_type = 'AD_CONTRACT' AND r.target_store_number IS NOT NULL))
   AND r.sort_time >= ?
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time, r.id";
SET @q = CONCAT('ANALYZE ', @among);
PREPARE among_plan FROM @q;
EXECUTE among_plan USING 9, 19, 109, 1009, @window, @now, @retry_limit;

SELECT '== census (store/mysql/census.rs): one pass over the state table' AS statement;
ANALYZE SELECT COUNT(CASE WHEN status = 'IN_PROGRESS' THEN 1 END),
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count < 300 AND transient_streak > 0 THEN 1 END),
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count < 300 AND transient_streak = 0 THEN 1 END),
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count >= 300 THEN 1 END)
  FROM auto_approve_state;

SELECT '== wake poll: one range of the primary key, no lock (store/mysql/notify.rs)' AS statement;
ANALYZE SELECT id, request_id, contract_ref, skip_request FROM auto_approve_wake
 WHERE id > @wmax - 100 ORDER BY id LIMIT 1000;

SELECT '== apply_wakes read: a range of the primary key, no lock' AS statement;
ANALYZE SELECT w.id, w.request_id, s.status, w.new_request
  FROM auto_approve_wake w FORCE INDEX (PRIMARY)
  LEFT JOIN auto_approve_state s ON s.request_id = w.request_id
 WHERE w.id > 0 AND w.request_id IS NOT NULL AND w.request_id % 16 IN (0, 1, 2, 3)
 ORDER BY w.id LIMIT 1000;

-- Every statement below takes row locks: each must reach its rows by
-- PRIMARY or a UNIQUE key (type const / eq_ref, or range over the key's
-- listed values), never by scanning a range of another index.
SELECT '== LOCK claim: share-lock the shard fence row' AS statement;
EXPLAIN SELECT token FROM shard_fence WHERE shard_count = 16 AND shard = 3 LOCK IN SHARE MODE;

SELECT '== LOCK claim of a new request: INSERT IGNORE (unique request_id)' AS statement;
EXPLAIN INSERT IGNORE INTO auto_approve_state
        (request_id, request_type, status, holder, fencing_token, created_at, modified_at)
 SELECT 2000000, 'OWNER_CONTRACT', 'IN_PROGRESS', 'r1', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM DUAL
  WHERE NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = 2000000)
    AND EXISTS (SELECT 1 FROM autoapproval_request r
                 WHERE r.id = 2000000 AND r.status NOT IN ('APPROVED', 'REJECTED', 'CANCELED'));

SELECT '== LOCK claim of a due retry: UPDATE by primary key' AS statement;
EXPLAIN UPDATE auto_approve_state
    SET status = 'IN_PROGRESS', holder = 'r1', fencing_token = 1,
        modified_at = UTC_TIMESTAMP(6), woken_at = NULL
  WHERE id = @sid AND request_id = @rid AND status = 'RETRY_WAITING'
    AND next_retry_time <= @now AND retry_count < 300
    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = @rid);

SELECT '== claim / schedule_retry: the request''s wake rows, no lock; then deleted by primary key' AS statement;
EXPLAIN SELECT id FROM auto_approve_wake WHERE request_id = @rid;
EXPLAIN DELETE FROM auto_approve_wake WHERE id IN (@wmin, @wmin + 1);

SELECT '== LOCK schedule_retry / complete: the state row under the fence' AS statement;
EXPLAIN SELECT last_reason, woken_at FROM auto_approve_state
  WHERE id = @sid AND status = 'IN_PROGRESS' AND holder = 'bench' AND fencing_token = 1
  FOR UPDATE;
EXPLAIN UPDATE auto_approve_state
    SET status = 'RETRY_WAITING', retry_count = retry_count + 1, transient_streak = 0,
        next_retry_time = @now, woken_at = NULL, last_reason = 'x', step = 'y',
        modified_at = UTC_TIMESTAMP(6)
  WHERE id = @sid;

SELECT '== LOCK heartbeat / release / drop_claim: by primary key under the fence' AS statement;
EXPLAIN UPDATE auto_approve_state SET modified_at = UTC_TIMESTAMP(6), step = 'x'
  WHERE id = @sid AND status = 'IN_PROGRESS' AND holder = 'bench' AND fencing_token = 1;
EXPLAIN DELETE FROM auto_approve_state
  WHERE id = @sid AND status = 'IN_PROGRESS' AND holder = 'bench' AND fencing_token = 1;

SELECT '== LOCK complete / save result: the request row NOWAIT, then the update' AS statement;
EXPLAIN SELECT status FROM autoapproval_request WHERE id = @rid FOR UPDATE NOWAIT;
EXPLAIN UPDATE autoapproval_request
    SET status = 'APPROVED', decided_at = UTC_TIMESTAMP(6), decided_by = 'autoapproval',
        updated_at = UTC_TIMESTAMP(6)
  WHERE id = @rid;
EXPLAIN SELECT id FROM auto_approve_state
  WHERE id = @sid AND status = 'IN_PROGRESS' AND holder = 'bench' AND fencing_token = 1
  LOCK IN SHARE MODE;
EXPLAIN DELETE FROM auto_approve_state WHERE id = @sid;

SELECT '== LOCK retry_now / forget_closed: by the unique request_id' AS statement;
EXPLAIN UPDATE auto_approve_state
    SET next_retry_time = @now, retry_count = LEAST(retry_count, 299), modified_at = UTC_TIMESTAMP(6)
  WHERE request_id = @rid AND status = 'RETRY_WAITING';
EXPLAIN DELETE FROM auto_approve_state
  WHERE request_id = @rid AND status = 'RETRY_WAITING'
    AND NOT EXISTS (SELECT 1 FROM autoapproval_request r
                     WHERE r.id = auto_approve_state.request_id AND r.status IN ('ING', 'PENDING', 'RETRY'));

SELECT '== LOCK wake / apply_wakes: the listed requests by the unique request_id' AS statement;
EXPLAIN SELECT request_id FROM auto_approve_state
  WHERE request_id IN (@rid, @rid + 10, @rid + 20) AND status = 'RETRY_WAITING'
    AND (next_retry_time > @now OR retry_count >= 300)
  FOR UPDATE;
EXPLAIN UPDATE auto_approve_state
    SET transient_streak = IF(retry_count >= 300, 0, transient_streak),
        retry_count = IF(retry_count >= 300, 0, retry_count),
        next_retry_time = COALESCE(LEAST(next_retry_time, @now), @now)
  WHERE request_id IN (@rid, @rid + 10, @rid + 20);

SELECT '== cleanse / fence_shard / release_all: the range read without a lock...' AS statement;
EXPLAIN SELECT id FROM auto_approve_state
  WHERE status = 'IN_PROGRESS' AND modified_at < UTC_TIMESTAMP(6) - INTERVAL 300000000 MICROSECOND;
EXPLAIN SELECT id FROM auto_approve_state
  WHERE status = 'IN_PROGRESS' AND request_id % 16 = 3 AND fencing_token > 0 AND fencing_token < 2;
EXPLAIN SELECT s.id FROM auto_approve_state s
  WHERE NOT EXISTS (SELECT 1 FROM autoapproval_request r
                     WHERE r.id = s.request_id AND r.status IN ('ING', 'PENDING', 'RETRY'));
SELECT '== LOCK ...then the rows found, locked and written by primary key' AS statement;
EXPLAIN SELECT id, request_id, holder FROM auto_approve_state
  WHERE id IN (@sid, @sid + 1, @sid + 2) AND status = 'IN_PROGRESS' AND fencing_token > 0
    AND fencing_token < 2 FOR UPDATE;
EXPLAIN UPDATE auto_approve_state
    SET status = 'RETRY_WAITING', next_retry_time = @now, modified_at = UTC_TIMESTAMP(6),
        retry_count = retry_count + 1, last_reason = 'x'
  WHERE id IN (@sid, @sid + 1, @sid + 2);
EXPLAIN DELETE FROM auto_approve_state
  WHERE id IN (@sid, @sid + 1) AND NOT EXISTS (SELECT 1 FROM autoapproval_request r
        WHERE r.id = auto_approve_state.request_id AND r.status IN ('ING', 'PENDING', 'RETRY'));

SELECT '== LOCK fence_shard: the fence row by primary key' AS statement;
EXPLAIN SELECT token FROM shard_fence WHERE shard_count = 16 AND shard = 3 FOR UPDATE;
EXPLAIN UPDATE shard_fence SET token = 2, holder = 'r2', fenced_at = @now
  WHERE shard_count = 16 AND shard = 3;

SELECT '== LOCK e-contract expansion: the row by primary key; its requests read without a lock (READ COMMITTED)' AS statement;
EXPLAIN DELETE FROM auto_approve_wake WHERE id IN (@wmin);
EXPLAIN INSERT INTO auto_approve_wake (request_id)
 SELECT r.id FROM autoapproval_request r WHERE r.econtract_ref = 'EC-1009' AND (NULL IS NULL OR r.id <> NULL);
