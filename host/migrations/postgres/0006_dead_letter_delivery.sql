-- A dead letter recorded without a claim (bad input) carries what
-- identifies the delivered message (a hash of its plugin, key, message id
-- and payload), unique: a redelivery after an answer or ack that failed
-- once the dead letter was recorded finds it and records nothing more.
-- Claimed dead letters carry none (their claim answers a redelivery).
ALTER TABLE dead_letters ADD COLUMN delivery TEXT;
CREATE UNIQUE INDEX dead_letters_delivery ON dead_letters (delivery);
