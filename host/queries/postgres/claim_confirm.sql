-- Batch: arrays of plugin, key, fence, result. Answers the claims (with their fence) confirmed.
-- $1 plugins, $2 keys, $3 fences, $4 now, $5 results (NULL: the handler returned none)
-- The rows are locked first, one key at a time through the primary key,
-- in byte order of (plugin, key) (as every statement and transaction
-- that locks several claim rows does), so this statement and a
-- claim transaction or a group commit never wait for each other at once.
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[], $5::BYTEA[]) AS r(plugin, key, fence, result)
),
locked AS (
    SELECT c.plugin, c.key, c.fence
    FROM (
        SELECT plugin, key FROM (SELECT plugin, key FROM r) AS u(plugin, key)
        GROUP BY plugin, key ORDER BY plugin COLLATE "C", key COLLATE "C"
    ) AS k
    CROSS JOIN LATERAL (
        SELECT c.plugin, c.key, c.fence FROM claims c
        WHERE c.plugin = k.plugin AND c.key = k.key AND c.state = 'running'
        FOR NO KEY UPDATE
    ) AS c
)
UPDATE claims c SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = $4, result = r.result
FROM r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
