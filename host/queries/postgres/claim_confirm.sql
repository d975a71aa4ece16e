-- Batch: arrays of plugin, key, fence, result. Answers the claims (with their fence) confirmed:
-- marked done now, or already done with that fence (a confirm repeated after a commit whose
-- answer was lost: only the holder of a fence confirms with it).
-- $1 plugins, $2 keys, $3 fences, $4 now, $5 results (NULL: the handler returned none)
-- The rows are locked first, in the one order (claims_locked.sql).
WITH r AS (
    SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[], $5::BYTEA[]) AS r(plugin, key, fence, result)
),
lock_keys (plugin, key) AS (
    SELECT plugin, key FROM r
),
locked AS (
    -- claims_locked.sql
),
confirmed AS (
    UPDATE claims c SET state = 'done', owner = NULL, lease_until = 0, last_error = NULL, updated_at = $4, result = r.result
    FROM r JOIN locked l ON l.plugin = r.plugin AND l.key = r.key
    WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'running'
    RETURNING c.plugin, c.key, c.fence
),
-- Asked only of the claims this statement did not confirm: a batch of first
-- confirms, the usual case, makes no look-up.
unconfirmed AS MATERIALIZED (
    SELECT r.* FROM r
    WHERE NOT EXISTS (SELECT 1 FROM confirmed x WHERE x.plugin = r.plugin AND x.key = r.key AND x.fence = r.fence)
)
SELECT plugin, key, fence FROM confirmed
UNION ALL
-- Done before this statement (its snapshot does not see the rows just confirmed as done);
-- one primary-key look-up per claim left (`LIMIT` keeps the planner from turning it into a
-- scan of the settled claims).
SELECT done.plugin, done.key, done.fence FROM unconfirmed r
CROSS JOIN LATERAL (
    SELECT c.plugin, c.key, c.fence FROM claims c
    WHERE c.plugin = r.plugin AND c.key = r.key AND c.fence = r.fence AND c.state = 'done'
    LIMIT 1
) AS done
