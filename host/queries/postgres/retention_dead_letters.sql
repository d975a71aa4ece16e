-- Sweep dead letters older than their retention, oldest first.
-- $1 dead before (ms), $2 at most this many
DELETE FROM dead_letters WHERE id IN (
    SELECT id FROM dead_letters WHERE dead_at < $1 ORDER BY dead_at LIMIT $2
)
