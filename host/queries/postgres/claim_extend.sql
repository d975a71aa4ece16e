-- Batch: arrays of plugin, key, fence. Answers the claims (with their fence) still held.
-- $1 plugins, $2 keys, $3 fences, $4 lease_until, $5 now
-- An extension never shortens a lease.
UPDATE claims c SET lease_until = GREATEST(c.lease_until, $4), updated_at = $5
FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS r(plugin, key, fence)
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
