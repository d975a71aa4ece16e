-- The values of several keys, with their (1-based) positions; a missing key
-- is left out.
-- $1 collections, $2 keys
SELECT t.idx, kv.value
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(collection, key, idx)
JOIN kv ON kv.collection = t.collection AND kv.key = t.key
