-- What was sent under each idempotency key, recorded before it is sent.
--
-- A key names one creation (`<request>:owner`, `<request>:campaign:store-7`)
-- and a strict downstream refuses the key with another body, as payment
-- APIs do. The body was built from the request as read by each attempt,
-- so a business rename between an attempt whose answer could not be saved
-- and its retry sent the new name under the old key. Now the first attempt
-- records the body here, under the claim's fence, before the call, and
-- every later attempt sends the recorded body verbatim until the result
-- is saved. A change that makes another creation (the campaign's store)
-- makes another key, and so another row. `result` is the answer saved
-- from the creation: the ad step takes a saved campaign only when it was
-- made under the key of the current store.
--
-- The rows of a request go with its completion; a request decided by a
-- person keeps them, so that a resubmission replays the same bodies.
CREATE TABLE auto_approve_sent (
    request_id      BIGINT      NOT NULL,
    idempotency_key TEXT        NOT NULL,
    body            TEXT        NOT NULL,
    result          TEXT,
    sent_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, idempotency_key)
);
