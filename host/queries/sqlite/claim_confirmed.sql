-- Whether a claim is already done with this fence: a confirm repeated after
-- a commit whose answer was lost (only the holder of a fence confirms with it).
-- ?1 plugin, ?2 key, ?3 fence
SELECT 1 FROM claims WHERE plugin = ?1 AND key = ?2 AND fence = ?3 AND state = 'done'
