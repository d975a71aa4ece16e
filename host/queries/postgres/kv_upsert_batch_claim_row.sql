-- Group commit of upserts under claims in this database, with the confirms
-- of executions whose writes committed in earlier batches: one statement,
-- one transaction, one commit. Every claim row the batch writes under or
-- confirms is locked first, in one pass in the one order
-- (claims_locked.sql), so a takeover, an extension or another batch waits
-- for this one or is waited for, never both at once. An item is written
-- only if its claim row still has its fence and is running. Within the
-- batch, the last write to a row wins, as if the items had run in arrival
-- order; rows are written in key order so concurrent batches lock them in
-- the same order. A confirm (as in
-- claim_confirm.sql) marks its claim done only if it is running with that
-- fence, and is answered confirmed also when its claim was already done
-- with that fence (repeated after a commit whose answer was lost). A stale write and the current holder's confirm of one claim may
-- share a batch: the write is refused, the confirm holds.
-- $1 plugins, $2 claim keys, $3 fences, $4 collections, $5 keys, $6 values, $7 now,
-- $8 confirm plugins, $9 confirm keys, $10 confirm fences, $11 confirm results, $12 confirm now
-- Returns (position, confirm): the (1-based) positions of the upserts
-- written (confirm false) and of the claims confirmed (confirm true).
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bytea[])
        WITH ORDINALITY AS t(plugin, claim_key, fence, collection, key, value, idx)
),
confirms AS (
    SELECT * FROM unnest($8::text[], $9::text[], $10::bigint[], $11::bytea[])
        WITH ORDINALITY AS r(plugin, key, fence, result, idx)
),
lock_keys (plugin, key) AS (
    SELECT plugin, claim_key FROM items UNION ALL SELECT plugin, key FROM confirms
),
locked AS (
    -- claims_locked.sql
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
),
confirmed AS (
    UPDATE claims c SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = $12, result = r.result
    FROM confirms r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key AND l.fence = r.fence
    WHERE c.plugin = r.plugin AND c.key = r.key
    RETURNING r.idx
),
-- The confirms this statement did not confirm: a batch of first confirms,
-- the usual case, makes no look-up below.
unconfirmed AS MATERIALIZED (
    SELECT r.* FROM confirms r WHERE NOT EXISTS (SELECT 1 FROM confirmed x WHERE x.idx = r.idx)
)
SELECT idx, false AS confirm FROM held
UNION ALL
SELECT idx, true FROM confirmed
UNION ALL
-- Done before this statement (its snapshot does not see the rows just
-- confirmed as done); one primary-key look-up per confirm left (`LIMIT`
-- keeps the planner from turning it into a scan of the settled claims).
SELECT r.idx, true FROM unconfirmed r
CROSS JOIN LATERAL (
    SELECT 1 FROM claims c
    WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'done'
    LIMIT 1
) AS done
