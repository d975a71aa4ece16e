-- Retention: drop the fencing tokens of claims the claim store swept, so a
-- key delivered again after the window starts over at fence 1.
-- $1 plugins, $2 keys
DELETE FROM fences f USING unnest($1::text[], $2::text[]) AS gone(plugin, key)
WHERE f.plugin = gone.plugin AND f.key = gone.key
