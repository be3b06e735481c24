-- Every function of ours resolves names in its own schema only (issue 33).
--
-- Before: the manual functions (0013) took `SET search_path FROM CURRENT`,
-- the migration's "$user", public, which searches pg_temp first for
-- tables: a role granted them could create a temporary auto_approve_state
-- and have the function claim into it. autoapproval_wake (0010) was
-- executable by PUBLIC, so any login could call it in a loop. The trigger
-- functions ran with the business session's rights and search_path.
--
-- Now, for each function:
-- * search_path is pinned to the schema these migrations run in, then
--   pg_catalog, with pg_temp named last (so no temporary object is found
--   before ours), computed here because the schema is the installer's;
-- * the names it reads are qualified with that schema;
-- * it runs as its owner, the role that applies the migrations (SECURITY
--   DEFINER): the trigger functions too, so the business role needs no
--   right on our tables or functions (a trigger fires without EXECUTE on
--   its function);
-- * PUBLIC has no EXECUTE: the four manual functions are granted by name
--   to the other service's role (README: Working alongside people), the
--   rest to nobody.
--
-- The bodies are those of 0010, 0013, 0015 and 0020, with @s@ standing for
-- the schema and @path@ for the search_path, replaced before they are run.
DO $migration$
DECLARE
    schema_name TEXT := pg_catalog.quote_ident(pg_catalog.current_schema());
    path TEXT := pg_catalog.format('%I, pg_catalog, pg_temp', pg_catalog.current_schema());
    definition TEXT;
BEGIN
    FOREACH definition IN ARRAY ARRAY[
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_wake(request_ids BIGINT[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    INSERT INTO @s@.auto_approve_wake (request_id)
    SELECT w.rid FROM pg_catalog.unnest(request_ids) AS w(rid);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_notify_request() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
BEGIN
    -- Our own approval: the replica that wrote it knows, and its CR shows it.
    IF TG_OP = 'UPDATE' AND NEW.status = 'APPROVED' AND NEW.decided_by = 'autoapproval'
       AND OLD.status IS DISTINCT FROM NEW.status THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT'
       OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.request_type IS DISTINCT FROM OLD.request_type
       OR NEW.documents_released IS DISTINCT FROM OLD.documents_released
       OR NEW.operational_hold IS DISTINCT FROM OLD.operational_hold
       OR NEW.menu_registered IS DISTINCT FROM OLD.menu_registered
       OR NEW.logo_registered IS DISTINCT FROM OLD.logo_registered
       OR NEW.previous_step_approved IS DISTINCT FROM OLD.previous_step_approved
       OR NEW.econtract_ref IS DISTINCT FROM OLD.econtract_ref
       OR NEW.target_store_number IS DISTINCT FROM OLD.target_store_number
    THEN
        -- A new request has no state row yet, a decided one no work left:
        -- nothing to wake. Either way the replicas hear of it.
        IF TG_OP = 'UPDATE' AND NEW.status IN ('ING', 'PENDING', 'RETRY') THEN
            PERFORM @s@.autoapproval_wake(ARRAY[NEW.id]);
        END IF;
        PERFORM pg_catalog.pg_notify('autoapproval_request_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_notify_econtract() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    syncing TEXT := pg_catalog.current_setting('autoapproval.syncing_request', true);
    woken BIGINT[];
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        SELECT pg_catalog.array_agg(r.id) INTO woken
          FROM @s@.approval_request r
         WHERE r.econtract_ref = NEW.contract_ref
           AND r.status IN ('ING', 'PENDING', 'RETRY')
           AND r.id::text IS DISTINCT FROM NULLIF(syncing, '');
        IF woken IS NOT NULL THEN
            PERFORM @s@.autoapproval_wake(woken);
            PERFORM pg_catalog.pg_notify('autoapproval_request_changed', id::text)
               FROM pg_catalog.unnest(woken) AS id;
        END IF;
    END IF;
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_claim(p_request_id BIGINT, p_who TEXT)
RETURNS TABLE (token BIGINT, refusal TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me     TEXT := 'manual:' || p_who;
    mine   BIGINT := -pg_catalog.nextval('@s@.autoapproval_manual_token'::regclass);
    status_now TEXT;
    kind   TEXT;
    held   RECORD;
BEGIN
    IF coalesce(p_who, '') = '' THEN
        RAISE EXCEPTION 'autoapproval_manual_claim: who must name the person';
    END IF;
    SELECT r.status, r.request_type INTO status_now, kind FROM @s@.approval_request r WHERE r.id = p_request_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    INSERT INTO @s@.auto_approve_state AS s
           (request_id, request_type, status, holder, fencing_token, step, created_at, modified_at)
    VALUES (p_request_id, kind, 'IN_PROGRESS', me, mine, 'manual', pg_catalog.now(), pg_catalog.now())
    ON CONFLICT (request_id) DO NOTHING;
    IF NOT FOUND THEN
        -- A waiting (or exhausted) request is taken whatever its retry time:
        -- a person decides now.
        UPDATE @s@.auto_approve_state s
           SET status = 'IN_PROGRESS', holder = me, fencing_token = mine, step = 'manual',
               modified_at = pg_catalog.now(), woken_at = NULL
         WHERE s.request_id = p_request_id AND s.status = 'RETRY_WAITING';
        IF NOT FOUND THEN
            SELECT s.holder, s.step, s.modified_at INTO held
              FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id;
            IF NOT FOUND THEN
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s changed meanwhile; try again', p_request_id);
            ELSIF held.holder LIKE 'manual:%' THEN
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is claimed by %s (last seen %s)',
                    p_request_id, pg_catalog.substr(held.holder, 8), held.modified_at);
            ELSE
                RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('auto-approval is running step %s since %s, on replica %s',
                    coalesce(held.step, 'start'), held.modified_at, held.holder);
            END IF;
            RETURN;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim is seen by this new statement: give the claim back at once.
    SELECT r.status INTO status_now FROM @s@.approval_request r WHERE r.id = p_request_id;
    IF status_now IS NULL OR status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        DELETE FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id AND s.holder = me AND s.fencing_token = mine;
        RETURN QUERY SELECT NULL::BIGINT, pg_catalog.format('request %s is already %s', p_request_id, coalesce(status_now, 'gone'));
        RETURN;
    END IF;
    INSERT INTO @s@.approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    RETURN QUERY SELECT mine, NULL::TEXT;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_heartbeat(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    WITH touched AS (
        UPDATE @s@.auto_approve_state s SET modified_at = pg_catalog.now()
         WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
           AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM touched);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_release(p_request_id BIGINT, p_who TEXT, p_token BIGINT)
RETURNS BOOLEAN
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
BEGIN
    UPDATE @s@.auto_approve_state s
       SET status = 'RETRY_WAITING', next_retry_time = pg_catalog.now(), modified_at = pg_catalog.now(),
           last_reason = 'released by manual:' || p_who
     WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
       AND s.holder = 'manual:' || p_who AND s.fencing_token = p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @s@.approval_request_memo (request_id, author, message)
    VALUES (p_request_id, 'manual:' || p_who, 'released to auto-approval');
    PERFORM pg_catalog.pg_notify('autoapproval_request_changed', p_request_id::text);
    RETURN true;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_decide(
    p_request_id BIGINT, p_who TEXT, p_token BIGINT, p_decision TEXT, p_note TEXT)
RETURNS TABLE (decided BOOLEAN, refusal TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me TEXT := 'manual:' || p_who;
    status_now TEXT;
BEGIN
    IF p_decision IS NULL OR p_decision NOT IN ('APPROVED', 'REJECTED', 'CANCELED') THEN
        RAISE EXCEPTION 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED, not %', p_decision;
    END IF;
    SELECT r.status INTO status_now FROM @s@.approval_request r WHERE r.id = p_request_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    PERFORM 1 FROM @s@.auto_approve_state s
      WHERE s.request_id = p_request_id AND s.status = 'IN_PROGRESS'
        AND s.holder = me AND s.fencing_token = p_token
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is not claimed by %s under token %s', p_request_id, me, p_token);
        RETURN;
    END IF;
    DELETE FROM @s@.auto_approve_state s WHERE s.request_id = p_request_id;
    IF status_now NOT IN ('PENDING', 'RETRY', 'ING') THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    UPDATE @s@.approval_request r
       SET status = p_decision, decided_at = pg_catalog.now(), decided_by = me, updated_at = pg_catalog.now()
     WHERE r.id = p_request_id;
    INSERT INTO @s@.approval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, p_decision || coalesce(': ' || nullif(p_note, ''), ''));
    RETURN QUERY SELECT true, NULL::TEXT;
END;
$$
$fn$
    ] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.replace(definition, '@path@', path), '@s@', schema_name);
    END LOOP;
END;
$migration$;

-- The manual functions' EXECUTE was revoked from PUBLIC by 0013 (a
-- replaced function keeps its grants); these three need none for anyone.
REVOKE EXECUTE ON FUNCTION
    autoapproval_wake(BIGINT[]),
    autoapproval_notify_request(),
    autoapproval_notify_econtract()
    FROM PUBLIC;
