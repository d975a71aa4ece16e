-- The result of a done claim. ?1 plugin, ?2 key
SELECT result FROM claims WHERE plugin = ?1 AND key = ?2 AND state = 'done'
