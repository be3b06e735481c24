-- A pause an operator set (spec.paused on the AutoApproval), kept in the
-- database so it outlives the CR: a deleted CR comes back paused, and no
-- replica claims a paused request whatever a CR says meanwhile (the claims
-- and candidate queries test this table). cr_uid names the CR the pause was
-- set through: unpausing that CR resumes the request.
CREATE TABLE auto_approve_pause (
    request_id BIGINT      PRIMARY KEY,
    paused_by  TEXT        NOT NULL,
    cr_uid     TEXT,
    paused_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
