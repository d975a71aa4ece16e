-- ?1 plugin, ?2 key, ?3 fence, ?4 now, ?5 result (NULL: the handler returned none)
UPDATE claims SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = ?4, result = ?5
WHERE plugin = ?1 AND key = ?2 AND fence = ?3 AND state = 'running'
