-- The result a handler returned (idem:handler@0.2.0), stored when its claim
-- is confirmed: a duplicate delivery answers with it.
ALTER TABLE claims ADD COLUMN result BYTEA;
