-- Group commit of mixed writes under claims held elsewhere (Redis), first
-- statement of the batch's transaction: remember the highest fence
-- presented per claim (fencing token; the rows stay locked until commit).
-- $1 plugins, $2 claim keys, $3 fences
-- Returns the (1-based) positions of the items whose fence is the highest.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, idx)
),
highest AS (
    INSERT INTO fences (plugin, key, fence)
    SELECT plugin, claim_key, max(fence) FROM items GROUP BY plugin, claim_key ORDER BY plugin, claim_key
    ON CONFLICT (plugin, key) DO UPDATE SET fence = GREATEST(fences.fence, EXCLUDED.fence)
    RETURNING plugin, key, fence
)
SELECT i.idx FROM items i JOIN highest h ON h.plugin = i.plugin AND h.key = i.claim_key AND h.fence = i.fence
