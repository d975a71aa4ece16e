-- What the workers did, per minute (Unix ms of its start) and outcome
-- (done, duplicates, busy, retries, dead_lettered): the console's rates and
-- the last hour of `idem stats`. Each worker adds its counts every few
-- seconds; minutes older than a day are removed as new ones are added.
CREATE TABLE activity (
    minute  BIGINT NOT NULL,
    outcome TEXT   NOT NULL,
    n       BIGINT NOT NULL,
    PRIMARY KEY (minute, outcome)
);
