-- Sweep settled claims older than the duplicate window (their journal
-- entries are deleted next, in the same transaction); never a running claim
-- or one waiting for a retry, nor a dead claim while a dead letter of its
-- key is kept (a replay revives it, its journal answering the calls it
-- made).
-- ?1 settled before (ms), ?2 at most this many
DELETE FROM claims WHERE rowid IN (
    SELECT rowid FROM claims c
    WHERE state IN ('done', 'dead') AND updated_at < ?1
      AND NOT (state = 'dead' AND EXISTS (SELECT 1 FROM dead_letters d WHERE d.plugin = c.plugin AND d.key = c.key))
    ORDER BY updated_at
    LIMIT ?2
)
RETURNING plugin, key
