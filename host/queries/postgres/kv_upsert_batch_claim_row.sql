-- Group commit of upserts under claims in this database: one statement,
-- one transaction. An item is written only if its claim row still has its
-- fence and is running; the claim rows are share-locked (in key order) until
-- commit, so a takeover waits for the batch or the batch sees the takeover.
-- Within the batch, the last write to a row wins, as if the items had run in
-- arrival order. Rows are written in key order so concurrent batches lock
-- them in the same order.
-- $1 plugins, $2 claim keys, $3 fences, $4 collections, $5 keys, $6 values, $7 now
-- Returns the (1-based) positions of the items written.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bytea[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, collection, key, value, idx)
),
locked AS (
    SELECT c.plugin, c.key, c.fence FROM claims c
    WHERE (c.plugin, c.key) IN (SELECT plugin, claim_key FROM items) AND c.state = 'running'
    ORDER BY c.plugin, c.key
    FOR SHARE
),
held AS (
    SELECT i.* FROM items i JOIN locked c ON c.plugin = i.plugin AND c.key = i.claim_key AND c.fence = i.fence
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
