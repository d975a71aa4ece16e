-- $1 state (running or retry), $2 plugin ('' = every plugin), $3 limit:
-- running claims longest-running first, retries soonest-due first. The
-- first condition is the expression of the claims_unsettled index.
SELECT plugin, key, msg_id, state, fence, owner, lease_until, not_before,
       CAST(attempts AS BIGINT) AS attempts, CAST(traps AS BIGINT) AS traps,
       last_error, plugin_version, created_at, updated_at
FROM claims WHERE (state IN ('running', 'retry')) AND state = $1 AND ($2 = '' OR plugin = $2)
ORDER BY CASE WHEN state = 'retry' THEN not_before ELSE updated_at END, plugin, key
LIMIT $3
