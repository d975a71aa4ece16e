-- Group commit of upserts under claims in this database: one statement,
-- one transaction. An item is written only if its claim row still has its
-- fence and is running; the claim rows are share-locked until commit, so a
-- takeover waits for the batch or the batch sees the takeover. Within the
-- batch, the last write to a row wins, as if the items had run in arrival
-- order. Rows are written in key order so concurrent batches lock them in
-- the same order.
-- $1 plugins, $2 claim keys, $3 fences, $4 collections, $5 keys, $6 values, $7 now
-- Returns the (1-based) positions of the items written.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bytea[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, collection, key, value, idx)
),
held AS (
    SELECT i.* FROM items i
    JOIN claims c ON c.plugin = i.plugin AND c.key = i.claim_key AND c.fence = i.fence AND c.state = 'running'
    FOR SHARE OF c
),
latest AS (
    SELECT DISTINCT ON (collection, key) collection, key, value FROM held ORDER BY collection, key, idx DESC
),
written AS (
    INSERT INTO kv (collection, key, value, updated_at)
    SELECT collection, key, value, $7 FROM latest ORDER BY collection, key
    ON CONFLICT (collection, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
)
SELECT idx FROM held
