-- Retention: drop the fencing tokens of claims the claim store swept, so a
-- key delivered again after the window starts over at fence 1. The rows are
-- locked first, one key at a time through the primary key, in the order of
-- (plugin, key) in which a group commit takes them (fence_batch_token.sql,
-- kv_upsert_batch_token.sql), so the two queue behind each other instead of
-- deadlocking.
-- $1 plugins, $2 keys
WITH gone AS (
    SELECT f.plugin, f.key
    FROM (
        SELECT plugin, key FROM unnest($1::text[], $2::text[]) AS g(plugin, key)
        GROUP BY plugin, key ORDER BY plugin, key
    ) AS k
    CROSS JOIN LATERAL (
        SELECT f.plugin, f.key FROM fences f
        WHERE f.plugin = k.plugin AND f.key = k.key
        FOR UPDATE
    ) AS f
)
DELETE FROM fences f USING gone WHERE f.plugin = gone.plugin AND f.key = gone.key
