-- $1 plugin, $2 key: the journaled external calls of one message
SELECT step, request_hash, response, plugin_version, created_at
FROM journal WHERE plugin = $1 AND key = $2 ORDER BY created_at, step
