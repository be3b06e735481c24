-- The manual-approval path as a database API, for the service where people
-- approve requests by hand, in any language: claim, heartbeat, release,
-- decide. A person's claim is a state row like the controller's, so the
-- UNIQUE(request_id) and the status test make the two take turns: the
-- controller never claims a request a person holds (its claims need no row
-- or a RETRY_WAITING one), and a person cannot claim one the controller is
-- running. Every write of a person is conditional on the holder
-- 'manual:<who>' and the claim's token, as the controller's are.
--
-- Tokens of manual claims are negative, one per claim: shard fencing
-- recovers only claims with a positive token below the new one, so a shard
-- changing hands leaves a person's claim alone; the cleanser returns one
-- untouched for --stuck-threshold (a crashed service), with a memo naming
-- its holder. Lock order as everywhere (migration 0010): the request row,
-- then the state row.
CREATE SEQUENCE autoapproval_manual_token;

-- Claims `request_id` for the person `who`. claimed: the token to give to
-- heartbeat, release and decide; refused: why (the request is decided or
-- missing, auto-approval is running it, another person holds it).
CREATE FUNCTION autoapproval_manual_claim(p_request_id BIGINT, p_who TEXT)
RETURNS TABLE (token BIGINT, refusal TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    me     TEXT := 'manual:' || p_who;
    mine   BIGINT := -nextval('autoapproval_manual_token');
    status_now TEXT;
    kind   TEXT;
    held   RECORD;
BEGIN
    IF coalesce(p_who, '') = '' THEN
        RAISE EXCEPTION 'autoapproval_manual_claim: who must name the person';
    END IF;
    SELECT r.status, r.request_type INTO status_now, kind FROM approval_request r WHERE r.id = p_request_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::BIGINT, format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT NULL::BIGINT, format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    INSERT INTO auto_approve_state AS s
           (request_id, request_type, status, holder, fencing_token, step, created_at, modified_at)
    VALUES (p_request_id, kind, 'IN_PROGRESS', me, mine, 'manual', now(), now())
    ON CONFLICT (request_id) DO NOTHING;
    IF NOT FOUND THEN
        -- A waiting (or exhausted) request is taken whatever its retry time:
        -- a person decides now.
        UPDATE auto_approve_state s
           SET status = 'IN_PROGRESS', holder = me, fencing_token = mine, step = 'manual',
               modified_at = now(), woken_at = NULL
         WHERE s.request_id = p_request_id AND s.status = 'RETRY_WAITING';
        IF NOT FOUND THEN
            SELECT s.holder, s.step, s.modified_at INTO held
              FROM auto_approve_state s WHERE s.request_id = p_request_id;
            IF NOT FOUND THEN
                RETURN QUERY SELECT NULL::BIGINT, format('request %s changed meanwhile; try again', p_request_id);
            ELSIF held.holder LIKE 'manual:%' THEN
                RETURN QUERY SELECT NULL::BIGINT, format('request %s is claimed by %s (last seen %s)',
                    p_request_id, substr(held.holder, 8), held.modified_at);
            ELSE
                RETURN QUERY SELECT NULL::BIGINT, format('auto-approval is running step %s since %s, on replica %s',
                    coalesce(held.step, 'start'), held.modified_at, held.holder);
            END IF;
            RETURN;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim is seen by this new statement: give the claim back at once.
    SELECT r.status INTO status_now FROM approval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL OR status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        DELETE FROM auto_approve_state s WHERE s.request_id = p_request_id AND s.holder = me AND s.fencing_token = mine;
        RETURN QUERY SELECT NULL::BIGINT, format('request %s is already %s', p_request_id, coalesce(status_now, 'gone'));
        RETURN;
    END IF;
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    RETURN QUERY SELECT mine, NULL::TEXT;
END;
$$;

-- Tells the cleanser the claim is alive; false when it is no longer this
-- claim (returned by the cleanser, say).
CREATE FUNCTION autoapproval_manual_heartbeat(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE sql AS $$
    WITH touched AS (
        UPDATE auto_approve_state s SET modified_at = now()
         WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
           AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM touched);
$$;

-- Gives the request back to auto-approval, due at once; false when the
-- claim is no longer this one.
CREATE FUNCTION autoapproval_manual_release(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE auto_approve_state s
       SET status = 'RETRY_WAITING', next_retry_time = now(), modified_at = now(),
           last_reason = 'released by manual:' || p_who
     WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
       AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, 'manual:' || p_who, 'released to auto-approval');
    PERFORM pg_notify('autoapproval_request_changed', p_request_id::text);
    RETURN true;
END;
$$;

-- Records the person's decision (APPROVED, REJECTED or CANCELED) and ends
-- the claim, in one transaction, only while the claim is this one and the
-- request still open. refusal says why nothing was written.
CREATE FUNCTION autoapproval_manual_decide(
    p_request_id BIGINT, p_who TEXT, p_token BIGINT, p_decision TEXT, p_note TEXT)
RETURNS TABLE (decided BOOLEAN, refusal TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    me TEXT := 'manual:' || p_who;
    status_now TEXT;
BEGIN
    IF p_decision IS NULL OR p_decision NOT IN ('APPROVED', 'REJECTED', 'CANCELED') THEN
        RAISE EXCEPTION 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED, not %', p_decision;
    END IF;
    SELECT r.status INTO status_now FROM approval_request r WHERE r.id = p_request_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    PERFORM 1 FROM auto_approve_state s
      WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
        AND s.holder = me AND s.fencing_token = p_token
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, format('request %s is not claimed by %s under token %s', p_request_id, me, p_token);
        RETURN;
    END IF;
    DELETE FROM auto_approve_state s WHERE s.request_id = p_request_id;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT false, format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    UPDATE approval_request r
       SET status = p_decision, decided_at = now(), decided_by = me, updated_at = now()
     WHERE r.id = p_request_id;
    INSERT INTO approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, p_decision || coalesce(': ' || nullif(p_note, ''), ''));
    RETURN QUERY SELECT true, NULL::TEXT;
END;
$$;

-- They run as their owner (the controller's role), so the other service's
-- role needs EXECUTE on them and nothing on our tables (README: Working
-- alongside people); nobody else may call them.
ALTER FUNCTION autoapproval_manual_claim(BIGINT, TEXT)
    SECURITY DEFINER SET search_path FROM CURRENT;
ALTER FUNCTION autoapproval_manual_heartbeat(BIGINT, TEXT, BIGINT)
    SECURITY DEFINER SET search_path FROM CURRENT;
ALTER FUNCTION autoapproval_manual_release(BIGINT, TEXT, BIGINT)
    SECURITY DEFINER SET search_path FROM CURRENT;
ALTER FUNCTION autoapproval_manual_decide(BIGINT, TEXT, BIGINT, TEXT, TEXT)
    SECURITY DEFINER SET search_path FROM CURRENT;
REVOKE EXECUTE ON FUNCTION
    autoapproval_manual_claim(BIGINT, TEXT),
    autoapproval_manual_heartbeat(BIGINT, TEXT, BIGINT),
    autoapproval_manual_release(BIGINT, TEXT, BIGINT),
    autoapproval_manual_decide(BIGINT, TEXT, BIGINT, TEXT, TEXT)
    FROM PUBLIC;
