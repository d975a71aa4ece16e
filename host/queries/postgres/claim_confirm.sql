-- Batch: arrays of plugin, key, fence, result. Answers the claims (with their fence) confirmed.
-- $1 plugins, $2 keys, $3 fences, $4 now, $5 results (NULL: the handler returned none)
UPDATE claims c SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = $4, result = r.result
FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[], $5::BYTEA[]) AS r(plugin, key, fence, result)
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
