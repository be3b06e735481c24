-- The wake of 0009 updated our state rows inside the business system's
-- transaction, with the business role's rights: a business UPDATE racing
-- our completion deadlocked, a long business transaction held our state
-- rows (and so our heartbeats, completions, the cleanser and the fence),
-- and a business role without UPDATE on auto_approve_state got "permission
-- denied" on its own table. Now the business side only appends a row:
--
-- * autoapproval_wake inserts one row per woken request that auto-approval
--   has touched into auto_approve_wake, a table with no key, constraint or
--   trigger: the insert takes no lock on any row of ours and never waits;
-- * it runs with the rights of the role that applied these migrations
--   (SECURITY DEFINER), so the business role needs no grant on our tables;
-- * a request that became terminal wakes nothing: there is no work left.
--
-- The controller consumes the rows: each discovery turn makes the woken
-- waiting requests of its shards due (Store::apply_wakes), and a running
-- claim's next retry is due at once when its request was woken meanwhile
-- (Store::schedule_retry), exactly as 0006 and 0009 meant.
--
-- Lock order, everywhere: the request row before its state row. The
-- business system takes only its request row; our completion updates the
-- request before it deletes the state row.
--
-- Grants the business role needs: its own rights on approval_request,
-- approval_request_memo and econtract, nothing else (the trigger functions
-- are executable by PUBLIC, as PostgreSQL creates them).
CREATE TABLE auto_approve_wake (
    request_id BIGINT      NOT NULL,
    woken_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX auto_approve_wake_request ON auto_approve_wake (request_id);

CREATE OR REPLACE FUNCTION autoapproval_wake(request_ids BIGINT[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    -- A plain read of the state table: it never waits for a lock.
    INSERT INTO auto_approve_wake (request_id)
    SELECT w.rid FROM unnest(request_ids) AS w(rid)
     WHERE EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = w.rid);
$$;

CREATE OR REPLACE FUNCTION autoapproval_notify_request() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
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
            PERFORM autoapproval_wake(ARRAY[NEW.id]);
        END IF;
        PERFORM pg_notify('autoapproval_request_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
