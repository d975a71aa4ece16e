-- ?1 limit: the newest dead letters first
SELECT id, plugin, key, msg_id, headers, payload, reason, attempts, plugin_version, first_seen_at, dead_at
FROM dead_letters ORDER BY id DESC LIMIT ?1
