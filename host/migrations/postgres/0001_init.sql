-- Idem on Postgres: claims, journal, dead letters and plugin data in one
-- schema (the config's namespace), so a data write and its fence check
-- commit in one transaction. Times are Unix milliseconds from the workers'
-- clocks (keep them synchronised; leases should dwarf the skew).

CREATE TABLE claims (
    plugin         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    msg_id         TEXT    NOT NULL,
    payload_hash   TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('running', 'retry', 'done', 'dead')),
    fence          BIGINT  NOT NULL,
    owner          TEXT,
    lease_until    BIGINT  NOT NULL,
    not_before     BIGINT  NOT NULL DEFAULT 0,
    attempts       INTEGER NOT NULL,
    traps          INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT,
    plugin_version TEXT,
    created_at     BIGINT  NOT NULL,
    updated_at     BIGINT  NOT NULL,
    PRIMARY KEY (plugin, key)
);
CREATE INDEX claims_state ON claims (state);

CREATE TABLE journal (
    plugin         TEXT   NOT NULL,
    key            TEXT   NOT NULL,
    step           TEXT   NOT NULL,
    fence          BIGINT NOT NULL,
    request_hash   TEXT   NOT NULL,
    response       BYTEA  NOT NULL,
    plugin_version TEXT,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (plugin, key, step)
);

CREATE TABLE dead_letters (
    id             BIGSERIAL PRIMARY KEY,
    plugin         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    msg_id         TEXT    NOT NULL,
    headers        TEXT    NOT NULL DEFAULT '[]',
    payload        BYTEA   NOT NULL,
    reason         TEXT    NOT NULL,
    attempts       INTEGER NOT NULL,
    plugin_version TEXT,
    first_seen_at  BIGINT  NOT NULL,
    dead_at        BIGINT  NOT NULL
);
CREATE INDEX dead_letters_msg ON dead_letters (plugin, key);

CREATE TABLE kv (
    collection TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      BYTEA  NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (collection, key)
);

-- Fencing tokens for data written under claims held elsewhere (Redis): the
-- highest fence seen per claim; a write presenting a lower one is refused.
CREATE TABLE fences (
    plugin TEXT   NOT NULL,
    key    TEXT   NOT NULL,
    fence  BIGINT NOT NULL,
    PRIMARY KEY (plugin, key)
);
