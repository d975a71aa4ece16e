-- $1 id
SELECT id, plugin, key, msg_id, headers, payload, reason, attempts::BIGINT AS attempts, plugin_version, first_seen_at, dead_at
FROM dead_letters WHERE id = $1
