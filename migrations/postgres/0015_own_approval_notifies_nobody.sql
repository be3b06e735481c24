-- The controller's own approval notifies nobody.
--
-- Our completion sets status APPROVED with decided_by 'autoapproval'. Its
-- NOTIFY made the shard's holder run a discovery turn (the wake batch and a
-- candidate query per type) and reconcile the finished request (a read and
-- the leftover-state delete): five statements per approval for news the
-- writer already had (bench --compare, db_statements_top). A person's
-- decision (decided_by 'manual:…' or the business system's own) still
-- notifies: its CR shows Superseded and its state row goes at once. The
-- poll remains the fallback of every notification, as before.
CREATE OR REPLACE FUNCTION autoapproval_notify_request() RETURNS trigger
LANGUAGE plpgsql AS $$
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
            PERFORM autoapproval_wake(ARRAY[NEW.id]);
        END IF;
        PERFORM pg_notify('autoapproval_request_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
