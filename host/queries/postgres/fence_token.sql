-- Fencing token at the resource: remember the highest fence presented for
-- a claim; answers the highest, which must equal the caller's own.
-- $1 plugin, $2 key, $3 fence
INSERT INTO fences (plugin, key, fence) VALUES ($1, $2, $3)
ON CONFLICT (plugin, key) DO UPDATE SET fence = GREATEST(fences.fence, EXCLUDED.fence)
RETURNING fence
