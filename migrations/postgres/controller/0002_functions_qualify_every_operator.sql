-- Every function of ours again, taking no operator or type from a schema
-- another role can write (issue 41).
--
-- 0001 pinned search_path to the controller's schema, then pg_catalog: an
-- unqualified operator or type name of a body was looked up in that schema
-- first, and a role with CREATE there (every login on `public` before
-- PostgreSQL 15; the business role by the guide) could create an operator
-- `=` (text, text), or a domain `text`, whose function then ran as the
-- owner of our SECURITY DEFINER functions at the next e-contract write or
-- manual call. Here nothing in a body is looked up by search path: our
-- objects are named with the schema (@s@), every function pg_catalog's,
-- every operator OPERATOR(pg_catalog.…) (an exact-type match in a later
-- schema would beat pg_catalog's otherwise), every type pg_catalog's, and
-- IN, NOT IN, NULLIF and IS DISTINCT FROM, which take `=` from the path,
-- are written out with the qualified operators. search_path is pg_catalog,
-- then the schema, then pg_temp: only for the business tables' own
-- triggers that our writes through the views fire, which then resolve
-- their names as in the business role's sessions (pg_catalog first), as
-- they did under 0001. Same signatures, so the owner, the grants and the
-- attached triggers stay; 0001 is left as it was applied.
DO $migration$
DECLARE
    schema_name pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    path pg_catalog.text := pg_catalog.format('pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    definition pg_catalog.text;
BEGIN
    FOREACH definition IN ARRAY ARRAY[
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_wake(request_ids pg_catalog.int8[]) RETURNS pg_catalog.void
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    INSERT INTO @s@.auto_approve_wake (request_id)
    SELECT w.rid FROM pg_catalog.unnest(request_ids) AS w(rid);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_request_changed() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- A change of a watched business request. TG_ARGV[0] names the column
-- holding the request id, so one function serves any table. What the
-- business transaction pays: one row appended to auto_approve_wake (an
-- update only: a new request has no claim to wake) and one NOTIFY; it takes
-- no lock on anything of ours.
DECLARE
    id pg_catalog.int8 := (pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) TG_ARGV[0])::pg_catalog.int8;
BEGIN
    -- Our own writes (results, the approval) wake nobody: the replica that
    -- wrote them knows, and the request's CR shows it.
    IF id IS NULL
       OR id::pg_catalog.text OPERATOR(pg_catalog.=) pg_catalog.current_setting('autoapproval.writing_request', true) THEN
        RETURN NULL;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        PERFORM @s@.autoapproval_wake(ARRAY[id]);
    END IF;
    PERFORM pg_catalog.pg_notify('autoapproval_request_changed', id::pg_catalog.text);
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_econtract_changed() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- An e-contract signed or voided: a fact of every open request on it.
-- TG_ARGV[0] names the column holding the contract's reference. The chain's
-- own ledger sync names its request in autoapproval.syncing_request: that
-- request is not woken by its own write.
DECLARE
    ref pg_catalog.text := pg_catalog.to_jsonb(NEW) OPERATOR(pg_catalog.->>) TG_ARGV[0];
    syncing pg_catalog.text := pg_catalog.current_setting('autoapproval.syncing_request', true);
    woken pg_catalog.int8[];
BEGIN
    SELECT pg_catalog.array_agg(r.id) INTO woken
      FROM @s@.autoapproval_request r
     WHERE r.econtract_ref OPERATOR(pg_catalog.=) ref
       AND (r.status OPERATOR(pg_catalog.=) 'ING' OR r.status OPERATOR(pg_catalog.=) 'PENDING'
            OR r.status OPERATOR(pg_catalog.=) 'RETRY')
       AND (r.id IS NULL OR syncing IS NULL OR syncing OPERATOR(pg_catalog.=) ''
            OR r.id::pg_catalog.text OPERATOR(pg_catalog.<>) syncing);
    IF woken IS NOT NULL THEN
        PERFORM @s@.autoapproval_wake(woken);
        PERFORM pg_catalog.pg_notify('autoapproval_request_changed', w::pg_catalog.text)
           FROM pg_catalog.unnest(woken) AS w;
    END IF;
    RETURN NULL;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch(
    tbl pg_catalog.regclass, key_column pg_catalog.name, columns pg_catalog.name[],
    fn pg_catalog.text, prefix pg_catalog.text)
RETURNS pg_catalog.void
LANGUAGE plpgsql SECURITY INVOKER SET search_path = @path@ AS $$
-- Attaches the trigger function `fn` to `tbl` as two triggers named
-- <prefix>_inserted and <prefix>_updated, the update one only when one of
-- `columns` changed (every update when NULL). Runs as the caller: only the
-- table's owner may create a trigger on it. The trigger's condition is
-- "distinct" spelt with pg_catalog's `=`, bound when the trigger is created.
DECLARE
    missing pg_catalog.name;
    changed pg_catalog.text;
    listed pg_catalog.text;
BEGIN
    SELECT c INTO missing
      FROM pg_catalog.unnest(ARRAY[key_column] OPERATOR(pg_catalog.||) coalesce(columns, '{}')) AS c
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid OPERATOR(pg_catalog.=) tbl
                          AND a.attname OPERATOR(pg_catalog.=) c
                          AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped)
     LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'autoapproval_watch: table % has no column %', tbl, missing;
    END IF;
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW EXECUTE FUNCTION @s@.%I(%L)',
        prefix OPERATOR(pg_catalog.||) '_inserted', tbl, fn, key_column);
    IF columns IS NULL OR pg_catalog.cardinality(columns) OPERATOR(pg_catalog.=) 0 THEN
        EXECUTE pg_catalog.format(
            'CREATE OR REPLACE TRIGGER %I AFTER UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION @s@.%I(%L)',
            prefix OPERATOR(pg_catalog.||) '_updated', tbl, fn, key_column);
    ELSE
        SELECT pg_catalog.string_agg(pg_catalog.format('%I', c), ', '),
               pg_catalog.string_agg(pg_catalog.format(
                   '((OLD.%1$I OPERATOR(pg_catalog.=) NEW.%1$I) IS NOT TRUE'
                   ' AND NOT (OLD.%1$I IS NULL AND NEW.%1$I IS NULL))', c), ' OR ')
          INTO listed, changed
          FROM pg_catalog.unnest(columns) AS c;
        EXECUTE pg_catalog.format(
            'CREATE OR REPLACE TRIGGER %I AFTER UPDATE OF %s ON %s FOR EACH ROW WHEN (%s) EXECUTE FUNCTION @s@.%I(%L)',
            prefix OPERATOR(pg_catalog.||) '_updated', listed, tbl, changed, fn, key_column);
    END IF;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch_requests(
    tbl pg_catalog.regclass, id_column pg_catalog.name, columns pg_catalog.name[] DEFAULT NULL)
RETURNS pg_catalog.void
LANGUAGE sql SECURITY INVOKER SET search_path = @path@ AS $$
-- The business request table: its id column, and the columns behind the
-- facts the filters read (status, type, the flags, the e-contract, the
-- target store). Our result columns need not be watched.
    SELECT @s@.autoapproval_watch(tbl, id_column, columns,
                                  'autoapproval_request_changed', 'autoapproval_request');
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_watch_econtracts(
    tbl pg_catalog.regclass, ref_column pg_catalog.name, columns pg_catalog.name[] DEFAULT NULL)
RETURNS pg_catalog.void
LANGUAGE sql SECURITY INVOKER SET search_path = @path@ AS $$
-- The e-contract ledger: its reference column, and the status column.
    SELECT @s@.autoapproval_watch(tbl, ref_column, columns,
                                  'autoapproval_econtract_changed', 'autoapproval_econtract');
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_claim(p_request_id pg_catalog.int8, p_who pg_catalog.text)
RETURNS TABLE (token pg_catalog.int8, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me     pg_catalog.text := 'manual:' OPERATOR(pg_catalog.||) p_who;
    mine   pg_catalog.int8 := OPERATOR(pg_catalog.-) pg_catalog.nextval('@s@.autoapproval_manual_token'::pg_catalog.regclass);
    status_now pg_catalog.text;
    kind   pg_catalog.text;
    held   RECORD;
BEGIN
    IF p_who IS NULL OR p_who OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'autoapproval_manual_claim: who must name the person';
    END IF;
    SELECT r.status, r.request_type INTO status_now, kind
      FROM @s@.autoapproval_request r WHERE r.id OPERATOR(pg_catalog.=) p_request_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    IF NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is already %s', p_request_id, status_now);
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
         WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
           AND s.status OPERATOR(pg_catalog.=) 'RETRY_WAITING';
        IF NOT FOUND THEN
            SELECT s.holder, s.step, s.modified_at INTO held
              FROM @s@.auto_approve_state s WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id;
            IF NOT FOUND THEN
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s changed meanwhile; try again', p_request_id);
            ELSIF held.holder OPERATOR(pg_catalog.~~) 'manual:%' THEN
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is claimed by %s (last seen %s)',
                    p_request_id, pg_catalog.substr(held.holder, 8), held.modified_at);
            ELSE
                RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('auto-approval is running step %s since %s, on replica %s',
                    coalesce(held.step, 'start'), held.modified_at, held.holder);
            END IF;
            RETURN;
        END IF;
    END IF;
    -- A decision committed while the insert waited on the controller's
    -- claim is seen by this new statement: give the claim back at once.
    SELECT r.status INTO status_now FROM @s@.autoapproval_request r WHERE r.id OPERATOR(pg_catalog.=) p_request_id;
    IF status_now IS NULL
       OR NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        DELETE FROM @s@.auto_approve_state s
         WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
           AND s.holder OPERATOR(pg_catalog.=) me AND s.fencing_token OPERATOR(pg_catalog.=) mine;
        RETURN QUERY SELECT NULL::pg_catalog.int8, pg_catalog.format('request %s is already %s', p_request_id, coalesce(status_now, 'gone'));
        RETURN;
    END IF;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'claimed for manual approval');
    RETURN QUERY SELECT mine, NULL::pg_catalog.text;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_heartbeat(
    p_request_id pg_catalog.int8, p_who pg_catalog.text, p_token pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE sql SECURITY DEFINER SET search_path = @path@ AS $$
    WITH touched AS (
        UPDATE @s@.auto_approve_state s SET modified_at = pg_catalog.now()
         WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
           AND s.status OPERATOR(pg_catalog.=) 'IN_PROGRESS'
           AND s.holder OPERATOR(pg_catalog.=) ('manual:' OPERATOR(pg_catalog.||) p_who)
           AND s.fencing_token OPERATOR(pg_catalog.=) p_token
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM touched);
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_release(
    p_request_id pg_catalog.int8, p_who pg_catalog.text, p_token pg_catalog.int8)
RETURNS pg_catalog.bool
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me pg_catalog.text := 'manual:' OPERATOR(pg_catalog.||) p_who;
BEGIN
    UPDATE @s@.auto_approve_state s
       SET status = 'RETRY_WAITING', next_retry_time = pg_catalog.now(), modified_at = pg_catalog.now(),
           last_reason = 'released by ' OPERATOR(pg_catalog.||) me
     WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
       AND s.status OPERATOR(pg_catalog.=) 'IN_PROGRESS'
       AND s.holder OPERATOR(pg_catalog.=) me AND s.fencing_token OPERATOR(pg_catalog.=) p_token;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me, 'released to auto-approval');
    PERFORM pg_catalog.pg_notify('autoapproval_request_changed', p_request_id::pg_catalog.text);
    RETURN true;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_manual_decide(
    p_request_id pg_catalog.int8, p_who pg_catalog.text, p_token pg_catalog.int8,
    p_decision pg_catalog.text, p_note pg_catalog.text)
RETURNS TABLE (decided pg_catalog.bool, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
DECLARE
    me pg_catalog.text := 'manual:' OPERATOR(pg_catalog.||) p_who;
    status_now pg_catalog.text;
BEGIN
    IF p_decision IS NULL
       OR NOT (p_decision OPERATOR(pg_catalog.=) ANY (ARRAY['APPROVED', 'REJECTED', 'CANCELED']::pg_catalog.text[])) THEN
        RAISE EXCEPTION 'autoapproval_manual_decide: decision must be APPROVED, REJECTED or CANCELED, not %', p_decision;
    END IF;
    SELECT r.status INTO status_now FROM @s@.autoapproval_request r
     WHERE r.id OPERATOR(pg_catalog.=) p_request_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s does not exist', p_request_id);
        RETURN;
    END IF;
    PERFORM 1 FROM @s@.auto_approve_state s
      WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id
        AND s.status OPERATOR(pg_catalog.=) 'IN_PROGRESS'
        AND s.holder OPERATOR(pg_catalog.=) me AND s.fencing_token OPERATOR(pg_catalog.=) p_token
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is not claimed by %s under token %s', p_request_id, me, p_token);
        RETURN;
    END IF;
    DELETE FROM @s@.auto_approve_state s WHERE s.request_id OPERATOR(pg_catalog.=) p_request_id;
    IF NOT (status_now OPERATOR(pg_catalog.=) ANY (ARRAY['PENDING', 'RETRY', 'ING']::pg_catalog.text[])) THEN
        RETURN QUERY SELECT false, pg_catalog.format('request %s is already %s', p_request_id, status_now);
        RETURN;
    END IF;
    UPDATE @s@.autoapproval_request r
       SET status = p_decision, decided_at = pg_catalog.now(), decided_by = me, updated_at = pg_catalog.now()
     WHERE r.id OPERATOR(pg_catalog.=) p_request_id;
    INSERT INTO @s@.autoapproval_request_memo (request_id, author, message)
    VALUES (p_request_id, me,
            p_decision OPERATOR(pg_catalog.||)
            CASE WHEN p_note IS NULL OR p_note OPERATOR(pg_catalog.=) '' THEN ''
                 ELSE ': ' OPERATOR(pg_catalog.||) p_note END);
    RETURN QUERY SELECT true, NULL::pg_catalog.text;
END;
$$
$fn$
    ] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.replace(definition, '@path@', path), '@s@', schema_name);
    END LOOP;
END;
$migration$;
