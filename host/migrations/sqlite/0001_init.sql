-- Idem embedded backend: queue, claims, journal, dead letters and data in
-- one SQLite file, so a data write and its fence check share a transaction.
-- Times are Unix milliseconds.

-- The embedded broker. A fetched row becomes invisible until visible_at;
-- if it is not acked by then it is delivered again (at-least-once).
CREATE TABLE queue (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id      TEXT    NOT NULL,
    handler     TEXT    NOT NULL,
    headers     TEXT    NOT NULL DEFAULT '[]',
    payload     BLOB    NOT NULL,
    visible_at  INTEGER NOT NULL,
    deliveries  INTEGER NOT NULL DEFAULT 0,
    receipt     TEXT,
    enqueued_at INTEGER NOT NULL
);
CREATE INDEX queue_visible ON queue (visible_at, id);

-- One row per (plugin, idempotency key). `fence` grows with each takeover;
-- every guarded change names the fence it expects.
CREATE TABLE claims (
    plugin         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    msg_id         TEXT    NOT NULL,
    payload_hash   TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('running', 'retry', 'done', 'dead')),
    fence          INTEGER NOT NULL,
    owner          TEXT,
    lease_until    INTEGER NOT NULL,
    not_before     INTEGER NOT NULL DEFAULT 0,
    attempts       INTEGER NOT NULL,
    traps          INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT,
    plugin_version TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (plugin, key)
);
CREATE INDEX claims_state ON claims (state);

-- Responses of keyed external calls, per (plugin, message key, step).
CREATE TABLE journal (
    plugin         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    step           TEXT    NOT NULL,
    fence          INTEGER NOT NULL,
    request_hash   TEXT    NOT NULL,
    response       BLOB    NOT NULL,
    plugin_version TEXT,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (plugin, key, step)
);

CREATE TABLE dead_letters (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    plugin         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    msg_id         TEXT    NOT NULL,
    headers        TEXT    NOT NULL DEFAULT '[]',
    payload        BLOB    NOT NULL,
    reason         TEXT    NOT NULL,
    attempts       INTEGER NOT NULL,
    plugin_version TEXT,
    first_seen_at  INTEGER NOT NULL,
    dead_at        INTEGER NOT NULL
);
CREATE INDEX dead_letters_msg ON dead_letters (plugin, key);

-- The plugin data store: named collections of opaque values.
CREATE TABLE kv (
    collection TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    value      BLOB    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (collection, key)
);
