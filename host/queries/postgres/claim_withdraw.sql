-- Withdraw new claims that a claim batch inserted (its first statement)
-- when deciding the rest of the batch failed: they were never handed out.
-- Only a claim exactly as that statement left it is deleted (fence 1, first
-- attempt, running, the same owner and creation time); one taken over
-- since stays. The rows are locked first, in the one order
-- (claims_locked.sql).
-- $1 plugins, $2 keys, $3 owners, $4 created_at
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[]) AS r(plugin, key, owner)
),
lock_keys (plugin, key) AS (
    SELECT plugin, key FROM r
),
locked AS (
    -- claims_locked.sql
)
DELETE FROM claims c
USING r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
WHERE c.plugin = r.plugin AND c.key = r.key AND c.owner = r.owner
    AND c.fence = 1 AND c.attempts = 1 AND c.state = 'running' AND c.created_at = $4
