-- Group commit, after the fence statement: the insert-uniques of the batch
-- whose fence held. Of several items for one free key the first inserts;
-- the others, and items whose key was taken, read the value afterwards
-- (kv_get_many.sql, a later statement of the same transaction, so it sees
-- rows committed meanwhile and this batch's own).
-- $1 collections, $2 keys, $3 values, $4 now
-- Returns the (1-based) positions of the items that inserted.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS t(collection, key, value, idx)
),
first AS (
    SELECT DISTINCT ON (collection, key) collection, key, value, idx FROM items ORDER BY collection, key, idx
),
inserted AS (
    INSERT INTO kv (collection, key, value, updated_at)
    SELECT collection, key, value, $4 FROM first ORDER BY collection, key
    ON CONFLICT (collection, key) DO NOTHING
    RETURNING collection, key
)
SELECT f.idx FROM first f JOIN inserted i ON i.collection = f.collection AND i.key = f.key
