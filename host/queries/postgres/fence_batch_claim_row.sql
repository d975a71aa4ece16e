-- Group commit of mixed writes under claims in this database, first
-- statement of the batch's transaction: lock the claim rows the batch
-- writes under or confirms, in one pass, one key at a time through the
-- primary key, in byte order of (plugin, key) (the order every statement
-- and transaction that locks several claim rows uses), until commit, so a
-- takeover, an extension or another batch waits for this one or is waited
-- for, never both at once.
-- $1 plugins, $2 claim keys, $3 fences, $4 confirm plugins, $5 confirm keys
-- Returns the (1-based) positions of the items whose claim is running with
-- that fence.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, idx)
),
locked AS (
    SELECT c.plugin, c.key, c.fence
    FROM (
        SELECT plugin, key FROM (SELECT plugin, claim_key FROM items UNION ALL SELECT * FROM unnest($4::text[], $5::text[])) AS u(plugin, key)
        GROUP BY plugin, key ORDER BY plugin COLLATE "C", key COLLATE "C"
    ) AS k
    CROSS JOIN LATERAL (
        SELECT c.plugin, c.key, c.fence FROM claims c
        WHERE c.plugin = k.plugin AND c.key = k.key AND c.state = 'running'
        FOR NO KEY UPDATE
    ) AS c
)
SELECT i.idx FROM items i JOIN locked c ON c.plugin = i.plugin AND c.key = i.claim_key AND c.fence = i.fence
