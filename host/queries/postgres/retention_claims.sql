-- Sweep settled claims older than the duplicate window, with their journal
-- entries; never a running claim or one waiting for a retry, nor a dead
-- claim while a dead letter of its key is kept (a replay revives it, its
-- journal answering the calls it made). Rows another sweeper holds are
-- skipped.
-- $1 settled before (ms), $2 at most this many
WITH old AS (
    SELECT plugin, key FROM claims c
    WHERE state IN ('done', 'dead') AND updated_at < $1
      AND NOT (state = 'dead' AND EXISTS (SELECT 1 FROM dead_letters d WHERE d.plugin = c.plugin AND d.key = c.key))
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
steps AS (
    DELETE FROM journal j USING old WHERE j.plugin = old.plugin AND j.key = old.key
)
DELETE FROM claims c USING old WHERE c.plugin = old.plugin AND c.key = old.key
RETURNING c.plugin, c.key
