-- Batch: arrays of plugin, key, fence, result. Answers the claims (with their fence) confirmed.
-- $1 plugins, $2 keys, $3 fences, $4 now, $5 results (NULL: the handler returned none)
-- The rows are locked first, in the one order (claims_locked.sql).
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[], $5::BYTEA[]) AS r(plugin, key, fence, result)
),
lock_keys (plugin, key) AS (
    SELECT plugin, key FROM r
),
locked AS (
    -- claims_locked.sql
)
UPDATE claims c SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = $4, result = r.result
FROM r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
