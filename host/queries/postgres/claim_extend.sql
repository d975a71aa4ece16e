-- Batch: arrays of plugin, key, fence. Answers the claims (with their fence) still held.
-- $1 plugins, $2 keys, $3 fences, $4 lease_until, $5 now
-- An extension never shortens a lease. The rows are locked first, in the
-- one order (claims_locked.sql).
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS r(plugin, key, fence)
),
lock_keys (plugin, key) AS (
    SELECT plugin, key FROM r
),
locked AS (
    -- claims_locked.sql
)
UPDATE claims c SET lease_until = GREATEST(c.lease_until, $4), updated_at = $5
FROM r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
