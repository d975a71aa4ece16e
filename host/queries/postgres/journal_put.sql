-- $1 plugin, $2 key, $3 step, $4 fence, $5 request_hash, $6 response, $7 plugin_version, $8 now
INSERT INTO journal (plugin, key, step, fence, request_hash, response, plugin_version, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (plugin, key, step) DO NOTHING
