-- Taken first in every guarded transaction: it both checks the fence and
-- takes SQLite's write lock, so the check and the write commit together.
-- ?1 plugin, ?2 key, ?3 fence
UPDATE claims SET fence = fence
WHERE plugin = ?1 AND key = ?2 AND fence = ?3 AND state = 'running'
