-- Group commit, after the fence statement: the deletes of the batch whose
-- fence held. Of several items for one key, the first is the one that
-- found it.
-- $1 collections, $2 keys
-- Returns the (1-based) positions of the items that deleted a row.
WITH items AS (
    SELECT * FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(collection, key, idx)
),
first AS (
    SELECT DISTINCT ON (collection, key) collection, key, idx FROM items ORDER BY collection, key, idx
),
deleted AS (
    DELETE FROM kv USING first f WHERE kv.collection = f.collection AND kv.key = f.key
    RETURNING kv.collection, kv.key
)
SELECT f.idx FROM first f JOIN deleted d ON d.collection = f.collection AND d.key = f.key
