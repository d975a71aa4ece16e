-- Retention: settled claims (done, dead) are swept by age, and dead
-- letters by the time they died; both in small batches, oldest first.
CREATE INDEX claims_settled ON claims (updated_at) WHERE state IN ('done', 'dead');
CREATE INDEX dead_letters_dead_at ON dead_letters (dead_at);

-- The key pointer each plugin derives idempotency keys with, fixed for the
-- namespace: changing it while messages are in flight would give a
-- redelivery another key (two executions of one message). '' = the
-- message id.
CREATE TABLE key_pointers (
    plugin      TEXT   PRIMARY KEY,
    key_pointer TEXT   NOT NULL,
    recorded_at BIGINT NOT NULL
);
