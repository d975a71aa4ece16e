-- Group commit of upserts under claims held elsewhere (Redis): one
-- statement, one transaction. Each item presents its claim's fence; the
-- highest fence per claim is remembered (fencing token) and an item is
-- written only if its fence is that highest one. Within the batch, the
-- last write to a row wins, as if the items had run in arrival order.
-- Rows are written in key order so concurrent batches lock them in the
-- same order.
-- $1 plugins, $2 claim keys, $3 fences, $4 collections, $5 keys, $6 values, $7 now
-- Returns (position, false): the (1-based) positions of the items written
-- (the columns of kv_upsert_batch_claim_row.sql, which also confirms).
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bytea[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, collection, key, value, idx)
),
highest AS (
    INSERT INTO fences (plugin, key, fence)
    SELECT plugin, claim_key, max(fence) FROM items GROUP BY plugin, claim_key ORDER BY plugin, claim_key
    ON CONFLICT (plugin, key) DO UPDATE SET fence = GREATEST(fences.fence, EXCLUDED.fence)
    RETURNING plugin, key, fence
),
held AS (
    SELECT i.* FROM items i JOIN highest h ON h.plugin = i.plugin AND h.key = i.claim_key AND h.fence = i.fence
),
latest AS (
    SELECT DISTINCT ON (collection, key) collection, key, value FROM held ORDER BY collection, key, idx DESC
),
written AS (
    INSERT INTO kv (collection, key, value, updated_at)
    SELECT collection, key, value, $7 FROM latest ORDER BY collection, key
    ON CONFLICT (collection, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
)
SELECT idx, false AS confirm FROM held
