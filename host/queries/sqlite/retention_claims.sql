-- Sweep settled claims older than the duplicate window (their journal
-- entries are deleted next, in the same transaction); never a running claim
-- or one waiting for a retry.
-- ?1 settled before (ms), ?2 at most this many
DELETE FROM claims WHERE rowid IN (
    SELECT rowid FROM claims
    WHERE state IN ('done', 'dead') AND updated_at < ?1
    ORDER BY updated_at
    LIMIT ?2
)
RETURNING plugin, key
