-- $1 plugin, $2 key, $3 fence (NULL: any), $4 reason, $5 now
UPDATE claims SET state = 'dead', owner = NULL, lease_until = 0, last_error = $4, updated_at = $5
WHERE plugin = $1 AND key = $2 AND ($3::BIGINT IS NULL OR (fence = $3 AND state = 'running'))
RETURNING attempts, created_at, plugin_version
