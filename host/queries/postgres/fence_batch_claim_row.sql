-- Group commit of mixed writes under claims in this database, first
-- statement of the batch's transaction: share-lock the claim rows (in key
-- order) until commit, so a takeover waits for the batch or the batch sees
-- the takeover.
-- $1 plugins, $2 claim keys, $3 fences
-- Returns the (1-based) positions of the items whose claim is running with
-- that fence.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, idx)
),
locked AS (
    SELECT c.plugin, c.key, c.fence FROM claims c
    WHERE (c.plugin, c.key) IN (SELECT plugin, claim_key FROM items) AND c.state = 'running'
    ORDER BY c.plugin, c.key
    FOR SHARE
)
SELECT i.idx FROM items i JOIN locked c ON c.plugin = i.plugin AND c.key = i.claim_key AND c.fence = i.fence
