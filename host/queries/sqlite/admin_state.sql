-- ?1 plugin, ?2 key
SELECT state FROM claims WHERE plugin = ?1 AND key = ?2
