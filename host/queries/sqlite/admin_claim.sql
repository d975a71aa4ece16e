-- ?1 plugin, ?2 key: one claim in full (the console's message page)
SELECT plugin, key, msg_id, state, fence, owner, lease_until, not_before,
       CAST(attempts AS BIGINT) AS attempts, CAST(traps AS BIGINT) AS traps,
       last_error, plugin_version, created_at, updated_at
FROM claims WHERE plugin = ?1 AND key = ?2
