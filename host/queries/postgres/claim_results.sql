-- The results of done claims. $1 plugins, $2 keys (arrays of equal length).
SELECT c.plugin, c.key, c.result
FROM claims c JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS r(plugin, key) ON c.plugin = r.plugin AND c.key = r.key
WHERE c.state = 'done'
