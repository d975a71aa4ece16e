-- The results of done claims (NULL for a claim not done). $1 plugins, $2
-- keys (arrays of equal length). The state is tested in the select list:
-- as a condition, it would let the planner read every settled claim
-- through the retention index (claims_settled) instead of the keys'.
SELECT c.plugin, c.key, CASE WHEN c.state = 'done' THEN c.result END
FROM claims c JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS r(plugin, key) ON c.plugin = r.plugin AND c.key = r.key
