-- Batch: arrays of plugin, key, fence. Answers the claims (with their fence) still held.
-- $1 plugins, $2 keys, $3 fences, $4 lease_until, $5 now
-- An extension never shortens a lease. The rows are locked first, one key
-- at a time through the primary key, in byte order of (plugin, key) (as
-- every statement and transaction that locks several claim rows does), so
-- an extension and a claim transaction or a group commit never wait for
-- each other at once.
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS r(plugin, key, fence)
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
UPDATE claims c SET lease_until = GREATEST(c.lease_until, $4), updated_at = $5
FROM r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
RETURNING c.plugin, c.key, c.fence
