-- The holder dead-letters its message: the claim is dead and its fence
-- grows (retired), only if the holder's fence is current.
-- ?1 plugin, ?2 key, ?3 fence, ?4 reason, ?5 now
UPDATE claims SET state = 'dead', fence = fence + 1, owner = NULL, lease_until = 0, last_error = ?4, updated_at = ?5
WHERE plugin = ?1 AND key = ?2 AND fence = ?3 AND state = 'running'
RETURNING attempts, created_at, plugin_version
