-- ?1 plugin, ?2 key, ?3 msg_id, ?4 headers, ?5 payload, ?6 reason, ?7 attempts, ?8 plugin_version, ?9 first_seen_at, ?10 now,
-- ?11 delivery (what identifies an unclaimed message; NULL for a claimed one): recorded once
INSERT INTO dead_letters (plugin, key, msg_id, headers, payload, reason, attempts, plugin_version, first_seen_at, dead_at, delivery)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (delivery) DO NOTHING
