    -- The running claims among `lock_keys` (plugin, key), locked one key at
    -- a time through the primary key, in byte order of (plugin, key): the
    -- one order in which every statement and transaction that locks several
    -- claim rows takes them, so any two of them queue behind each other
    -- instead of deadlocking. The body of the `locked` CTE of the statements
    -- that lock several claim rows (host/src/claim/locking.rs).
    SELECT c.plugin, c.key, c.fence
    FROM (
        SELECT plugin, key FROM lock_keys
        GROUP BY plugin, key ORDER BY plugin COLLATE "C", key COLLATE "C"
    ) AS k
    CROSS JOIN LATERAL (
        SELECT c.plugin, c.key, c.fence FROM claims c
        WHERE c.plugin = k.plugin AND c.key = k.key AND c.state = 'running'
        FOR NO KEY UPDATE
    ) AS c
