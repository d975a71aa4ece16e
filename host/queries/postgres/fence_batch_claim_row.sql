-- Group commit of mixed writes under claims in this database, first
-- statement of the batch's transaction: lock the claim rows the batch
-- writes under or confirms, in one pass in the one order
-- (claims_locked.sql), until commit, so a takeover, an extension or
-- another batch waits for this one or is waited for, never both at once.
-- $1 plugins, $2 claim keys, $3 fences, $4 confirm plugins, $5 confirm keys
-- Returns the (1-based) positions of the items whose claim is running with
-- that fence.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, idx)
),
lock_keys (plugin, key) AS (
    SELECT plugin, claim_key FROM items UNION ALL SELECT * FROM unnest($4::text[], $5::text[])
),
locked AS (
    -- claims_locked.sql
)
SELECT i.idx FROM items i JOIN locked c ON c.plugin = i.plugin AND c.key = i.claim_key AND c.fence = i.fence
