-- ?1 limit: the newest dead letters first, without headers or payload
SELECT id, plugin, key, msg_id, reason, attempts, plugin_version, first_seen_at, dead_at
FROM dead_letters ORDER BY id DESC LIMIT ?1
