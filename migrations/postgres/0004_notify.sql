-- Wake the controller as soon as a request appears or anything a filter reads
-- changes, instead of waiting for the next poll. Channel:
-- `autoapproval_request_changed`, payload: the request id as text.
CREATE FUNCTION autoapproval_notify_request() RETURNS trigger
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
        PERFORM pg_notify('autoapproval_request_changed', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER approval_request_notify
    AFTER INSERT OR UPDATE ON approval_request
    FOR EACH ROW EXECUTE FUNCTION autoapproval_notify_request();

-- An e-contract signed in the e-sign system is a filter fact too.
CREATE FUNCTION autoapproval_notify_econtract() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        PERFORM pg_notify('autoapproval_request_changed', r.id::text)
           FROM approval_request r
          WHERE r.econtract_ref = NEW.contract_ref;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER econtract_notify
    AFTER INSERT OR UPDATE ON econtract
    FOR EACH ROW EXECUTE FUNCTION autoapproval_notify_econtract();
