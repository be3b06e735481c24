-- A brake for the whole fleet (issue 43): while this table holds its one
-- row, no replica claims anything (every claim statement tests it), the
-- chains already running finish, and people's manual claims go on. Who
-- paused, when and why are kept here, so the pause survives every
-- restart; resuming deletes the row.
CREATE TABLE IF NOT EXISTS auto_approve_fleet_pause (
    only_row  BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    paused_by TEXT        NOT NULL,
    reason    TEXT,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The two functions people call (`autoapproval pause --all` and
-- `resume --all` call them too), written as 0002 writes every function:
-- nothing in a body is looked up by search path.
DO $migration$
DECLARE
    schema_name pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    path pg_catalog.text := pg_catalog.format('pg_catalog, %I, pg_temp', pg_catalog.current_schema());
    definition pg_catalog.text;
BEGIN
    FOREACH definition IN ARRAY ARRAY[
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_pause_fleet(p_who pg_catalog.text, p_reason pg_catalog.text)
RETURNS TABLE (paused pg_catalog.bool, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- Pauses every replica's claims; refused while a pause stands, naming it.
DECLARE
    held RECORD;
BEGIN
    IF p_who IS NULL OR p_who OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'autoapproval_pause_fleet: who must name the person';
    END IF;
    INSERT INTO @s@.auto_approve_fleet_pause AS f (only_row, paused_by, reason, paused_at)
    VALUES (true, p_who,
            CASE WHEN p_reason OPERATOR(pg_catalog.=) '' THEN NULL ELSE p_reason END,
            pg_catalog.now())
    ON CONFLICT (only_row) DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT true, NULL::pg_catalog.text;
        RETURN;
    END IF;
    SELECT f.paused_by, f.reason, f.paused_at INTO held FROM @s@.auto_approve_fleet_pause f;
    RETURN QUERY SELECT false, pg_catalog.format('the fleet is already paused by %s since %s%s',
        held.paused_by, held.paused_at,
        CASE WHEN held.reason IS NULL THEN '' ELSE ': ' OPERATOR(pg_catalog.||) held.reason END);
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_resume_fleet(p_who pg_catalog.text)
RETURNS TABLE (resumed pg_catalog.bool, refusal pg_catalog.text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @path@ AS $$
-- Ends the fleet's pause: every replica claims again at its next poll.
BEGIN
    IF p_who IS NULL OR p_who OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'autoapproval_resume_fleet: who must name the person';
    END IF;
    DELETE FROM @s@.auto_approve_fleet_pause f WHERE f.only_row;
    IF FOUND THEN
        RETURN QUERY SELECT true, NULL::pg_catalog.text;
    ELSE
        RETURN QUERY SELECT false, 'the fleet is not paused'::pg_catalog.text;
    END IF;
END;
$$
$fn$,
$fn$
CREATE OR REPLACE FUNCTION @s@.autoapproval_fleet_pause()
RETURNS TABLE (paused_by pg_catalog.text, reason pg_catalog.text, paused_at pg_catalog.timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = @path@ AS $$
-- The fleet's pause, if one stands: no row when the fleet runs.
    SELECT f.paused_by, f.reason, f.paused_at FROM @s@.auto_approve_fleet_pause f;
$$
$fn$
    ] LOOP
        EXECUTE pg_catalog.replace(pg_catalog.replace(definition, '@path@', path), '@s@', schema_name);
    END LOOP;
END;
$migration$;

-- Granted by name, as the manual-approval functions are (docs/DATABASE.md).
REVOKE EXECUTE ON FUNCTION
    autoapproval_pause_fleet(pg_catalog.text, pg_catalog.text),
    autoapproval_resume_fleet(pg_catalog.text),
    autoapproval_fleet_pause()
    FROM PUBLIC;
