-- Group commit, after the fence statement: the upserts of the batch whose
-- fence held. The last write to a row wins, as if the items had run in
-- order; rows are written in key order so concurrent batches lock them in
-- the same order.
-- $1 collections, $2 keys, $3 values, $4 now
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS t(collection, key, value, idx)
),
latest AS (
    SELECT DISTINCT ON (collection, key) collection, key, value FROM items ORDER BY collection, key, idx DESC
)
INSERT INTO kv (collection, key, value, updated_at)
SELECT collection, key, value, $4 FROM latest ORDER BY collection, key
ON CONFLICT (collection, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
